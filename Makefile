# make demo: set up .venv and run the main job (FEM demo + roofline report)
# make test: set up .venv with the test extras (MPI included) and run the tests
# Extras: what this machine can use. The `gpu` extra (CuPy, ~200 MB) only where an NVIDIA
# GPU answers `nvidia-smi -L`; `make demo` installs the plots only, `make test` the test
# and MPI extras too. EXTRAS=... overrides both (e.g. EXTRAS=test,plot,mpi,gpu).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
comma  := ,
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
GPU_EXTRA = $(if $(HAS_GPU),$(comma)gpu)
DEMO_EXTRAS = $(if $(EXTRAS),$(EXTRAS),plot$(GPU_EXTRA))
TEST_EXTRAS = $(if $(EXTRAS),$(EXTRAS),test,plot,mpi$(GPU_EXTRA))

.PHONY: demo test venv clean

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[$*]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(VENV)/.installed-$(DEMO_EXTRAS)
	$(VENV)/bin/smalltc demo

test: $(VENV)/.installed-$(TEST_EXTRAS)
	$(PY) -m pytest -q -n auto --doctest-modules smalltc fem tuning tests

clean:
	rm -rf $(VENV) build *.egg-info
