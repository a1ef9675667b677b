# Every target creates the environment when it is missing, so each one works as the first
# command on a fresh machine. Java must already be installed (Spark's JVM).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

TIERS := unit contract property golden spark procs

.PHONY: install bytecode test test-quick test-nojvm $(addprefix test-,$(TIERS)) check fmt lint links types docs demo bench clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,dev]'
	touch $(STAMP)

# The project's modules compiled to bytecode (__pycache__/, ignored by git) before tests run.
# Python writes none when the environment sets PYTHONDONTWRITEBYTECODE (it reads what is
# there), and then every process the tests start compiled ~100 of our modules from source
# again as it imported them: each procs worker, Spark Python worker, kernel and job, hundreds
# a run, ~0.3 s of CPU each (tests/test_client_procs.py with tests/test_lease_groups.py: their
# child processes' CPU 30.9/33.5 s without, 20.2/25.6 s with, in two pairs). A second run
# compiles only what changed.
PACKAGE_SOURCES := connector storage dispatch jobs examples filepulsar pyspark_filepulsar.py tests bench

bytecode: $(STAMP)
	$(PY) -m compileall -q $(PACKAGE_SOURCES) > /dev/null

# The no-JVM loop's tests: every tier that needs neither Spark nor several processes, without
# slow tests (a test of these tiers that starts a child process is marked procs, and
# tests/conftest.py fails one that is not). They share nothing but the machine, so they run on
# both cores (pytest-xdist).
NOJVM := (unit or contract or property or golden) and not spark and not procs and not slow

# Every test once, in two pytest runs at the same time: the tests that take the spark fixture
# one after the other (one SparkSession), with the tests marked alone (forks that pytest-xdist's
# threads in a worker could hang), and beside them every other test on both cores
# (pytest-xdist, a file per worker at a time: a module's fixture, such as a standalone cluster,
# is made once). The Spark tests mostly wait (JVM start-ups, triggers, child jobs); the others
# fill that time. The Spark run's output follows the other's; the target fails when either run
# did. pytest exits 5 when it collects no test: that is a failure here, never a silent pass.
# The 25 slowest tests of each run are listed at their ends (CI logs show where the time goes).
test: $(STAMP) bytecode
	@mkdir -p .test-runs
	rc=0; \
	( $(PY) -m pytest -q --durations=25 -m 'spark_session or alone' tests > .test-runs/spark.log 2>&1; \
	  echo $$? > .test-runs/spark.rc ) & \
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 -m 'not (spark_session or alone)' tests \
	  || rc=$$?; \
	wait; echo "--- the tests that take the spark fixture, and those marked alone:"; cat .test-runs/spark.log; \
	s=$$(cat .test-runs/spark.rc); [ "$$s" = 0 ] || rc=$$s; exit $$rc

test-quick: $(STAMP) bytecode
	$(PY) -m pytest -q -m 'not slow' tests

test-nojvm: $(STAMP) bytecode
	$(PY) -m pytest -q -n 2 -m '$(NOJVM)' tests

# One tier (markers in setup.cfg, set per file): make test-unit, test-contract, test-property,
# test-golden, test-spark, test-procs. Every test is in exactly one file tier, so the tiers
# together are `make test`; tests taking the spark fixture are also in the spark tier, tests
# marked procs (they start child processes) also in the procs tier.
$(addprefix test-,$(TIERS)): test-%: $(STAMP) bytecode
	$(PY) -m pytest -q -m $* tests

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

lint: $(STAMP)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

# The installed layout as links (.pkg/filepulsar/storage -> storage/ ...), built once and again
# only when a module of filepulsar/ comes or goes: tools that cannot follow the editable install's
# import hook (mypy, IDEs, import-graph tools) read it. Sub-packages follow their root's link.
links: .pkg/.stamp

.pkg/.stamp: $(wildcard filepulsar/*.py)
	rm -rf .pkg && mkdir -p .pkg/filepulsar
	for d in connector storage dispatch jobs examples; do ln -s ../../$$d .pkg/filepulsar/$$d; done
	for f in filepulsar/*.py; do ln -s ../../$$f .pkg/filepulsar/; done
	ln -s ../pyspark_filepulsar.py .pkg/pyspark_filepulsar.py
	touch $@

types: $(STAMP) links
	cd .pkg && ../$(VENV)/bin/mypy --config-file ../setup.cfg -p filepulsar -m pyspark_filepulsar

# The manual (docs/, nav in mkdocs.yml) built into site/; --strict turns every warning into a
# failure: a link to a page or anchor that does not exist, a page missing from the nav.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

check: lint types docs test

demo: $(STAMP)
	$(PY) -m filepulsar.jobs.demo

bench: $(STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) build site .pkg *.egg-info .pytest_cache .mypy_cache .ruff_cache
