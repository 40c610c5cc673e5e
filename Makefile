# Two commands on a fresh machine with python3 and make:
#   make demo   set up .venv and run the main job on the embedded default
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: install test test-all demo bench clean

install: $(STAMP)

# torch first, pinned to the local CPU build: any other spec pulls GBs of CUDA packages.
$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
	$(PIP) install -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -c "import agentjax, jax, flax, torch, transformers, xdist, faiss"
	touch $(STAMP)

# The default suite (~10 minutes on 2 cores); test-all adds the slow end-to-end checks
# (two-process multi-host training, the notebooks executed end to end, Co-ReAct's stages chained).
# TEST_WORKERS pytest processes (pytest-xdist), each given whole files (their module fixtures are
# built once): compiling tiny programs, most of the suite's time, runs on one core per process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)
	$(PYTEST) -m "not slow" tests

test-all: $(STAMP)
	$(PYTEST) tests

demo: $(STAMP)
	$(PY) launch/demo.py

bench: $(STAMP)
	$(PY) launch/bench.py forward

clean:
	rm -rf $(VENV) build *.egg-info
