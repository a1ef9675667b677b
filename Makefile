# Every target creates the environment when it is missing, so each one works as the first
# command on a fresh machine. Java must already be installed (Spark's JVM).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: install test test-quick check fmt lint types demo bench clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

# pytest exits 5 when it collects no test: that is a failure here, never a silent pass.
test: $(STAMP)
	$(PY) -m pytest -q tests

test-quick: $(STAMP)
	$(PY) -m pytest -q -m 'not slow' tests

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

types: $(STAMP)
	$(VENV)/bin/mypy connector storage dispatch jobs pyspark_filepulsar.py

check: lint types test

demo: $(STAMP)
	$(PY) -m filepulsar.jobs.demo

bench: $(STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
