# make demo: set up .venv and run the main job (FEM demo + roofline report)
# make test: set up .venv with the test extras (MPI included) and run the tests: the
#            compiled backends on a representative subset of sizes (compiles are the cost)
# make test-full: the same with SMALLTC_TEST_FULL=1, every size of the operation tables
# make docs: add the docs extra to .venv and build the documentation site into site/
#            (mkdocs build --strict: a warning fails the build)
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

.PHONY: demo test test-full docs venv clean

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[$*]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(VENV)/.installed-$(DEMO_EXTRAS)
	$(VENV)/bin/smalltc demo

test: $(VENV)/.installed-$(TEST_EXTRAS)
	$(PY) -m pytest -q -n auto --durations=25 --doctest-modules smalltc fem tuning tests

test-full: $(VENV)/.installed-$(TEST_EXTRAS)
	SMALLTC_TEST_FULL=1 $(PY) -m pytest -q -n auto --doctest-modules smalltc fem tuning tests

# the docs extra goes into the same .venv beside the others (its own stamp: the test
# extras' stamp stays, so `make test` after `make docs` reinstalls nothing)
$(VENV)/.docs-installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) build site *.egg-info
