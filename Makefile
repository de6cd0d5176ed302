# corral: `make run` starts the gateway, `make test` runs the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test venv bench clean

# The stamp is written last: a venv without it is half-built (an interrupted
# install) and is rebuilt from scratch rather than trusted.
$(STAMP): pyproject.toml
	rm -rf $(VENV)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/corral serve

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/status_fanin.py --quick

clean:
	rm -rf $(VENV) .corral .pytest_cache
