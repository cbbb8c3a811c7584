# oncelog: one command to set up, run, test and measure.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp
DATA_DIR ?= ./data
LISTEN ?= 127.0.0.1:9092
PYTEST_ARGS ?=

.PHONY: setup run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(VENV)/bin/oncelog serve --data-dir $(DATA_DIR) --listen $(LISTEN)

test: setup
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check src tests bench

bench: setup
	$(PY) bench/produce_fetch.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
