# make demo: set up .venv and run the main job (FEM demo + roofline report)
# make test: set up .venv with the test extras (MPI included) and run the tests
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
EXTRAS ?= test,plot,gpu,mpi

.PHONY: demo test venv clean

$(VENV)/.installed-%: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[$*]"
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(VENV)/.installed-$(EXTRAS)
	$(VENV)/bin/smalltc demo

test: $(VENV)/.installed-$(EXTRAS)
	$(PY) -m pytest -q -n auto --doctest-modules smalltc fem tuning tests

clean:
	rm -rf $(VENV) build *.egg-info
