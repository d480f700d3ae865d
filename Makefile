# Development: `make test` (README.md, CONTRIBUTING.md). Everything else is plain pip and pytest.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-slow test-tools test-scripts lint bench bench-quick clean FORCE

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The checkout is installed editable in setuptools' strict mode: a .pth line naming
# a tree of links to the sources (build/__editable__.*), so that an interpreter start
# imports nothing for it, as with the `pip install .` users get. (The default mode
# imports a finder, with pathlib and urllib, into every start of every command; the
# compat mode cannot map two source roots.) A tree of links does not see a module
# added or removed: the list of them below reinstalls when it changes.
EDITABLE := --config-settings editable_mode=strict
MODULES := $(VENV)/.modules

$(MODULES): FORCE | $(BIN)/python
	@find daemon client -name '*.py' -o -name py.typed -o -path '*/service_templates/*' | LC_ALL=C sort > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi

$(VENV)/.installed-run: pyproject.toml $(MODULES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(MODULES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[test]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/capsuled

# The suite a change is checked with (a few minutes); test-slow is the rest,
# the tests marked `slow` (several seconds each, or machine-wide sysctls), one
# at a time. CI runs both. The suite's tests mostly wait on processes and
# deadlines, so two workers (pytest-xdist) halve its time even on two cores.
TEST_WORKERS ?= 2
test: lint test-tools test-scripts
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS)

test-slow: $(VENV)/.installed-test test-tools
	$(BIN)/python -m pytest -m slow

# What the tests run beside the daemon: Debian's node_exporter scrapes the
# metrics textfile (tests/integration/service/test_metrics_daemon.py). Installed when
# missing where apt-get runs as root; elsewhere that test is skipped and says why.
# The TypeScript MCP SDK is the independent client of `capsulectl mcp`
# (tests/integration/mcp/test_mcp_node.py), installed from tests/node's lockfile
# where npm is present; elsewhere that test is skipped and says why.
# The real Claude Code, pinned in tests/claude_code's lockfile (its native
# binary is an optional package of ~400 MB), drives tests/agents offline;
# installed where npm is present, elsewhere those tests are skipped and say why.
NODE_EXPORTER := prometheus-node-exporter
MCP_NODE_SDK := tests/node/node_modules/.installed
CLAUDE_CODE := tests/claude_code/node_modules/.installed
test-tools: $(MCP_NODE_SDK) $(CLAUDE_CODE)
	@command -v $(NODE_EXPORTER) >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(NODE_EXPORTER) with apt-get"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq $(NODE_EXPORTER) >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq $(NODE_EXPORTER); } || \
		echo "could not install $(NODE_EXPORTER); its test will be skipped"; \
	else \
		echo "$(NODE_EXPORTER) is missing (no apt-get as root); its test will be skipped"; \
	fi

# The scripts run by hand (tests/tools/, docs/reliability.md and docs/sessions.md)
# must still start, and the reliability script still find every test it runs.
test-scripts: $(VENV)/.installed-test
	$(BIN)/python tests/tools/live_latency.py --help >/dev/null
	$(BIN)/python tests/tools/reliability.py --list >/dev/null

lint: $(VENV)/.installed-test
	$(BIN)/ruff check daemon client tests benchmarks
	$(BIN)/ruff format --check daemon client tests benchmarks
	$(BIN)/mypy --strict daemon client benchmarks
	$(BIN)/lint-imports

# The benchmarks (outside the test suite): full sizes rewrite docs/benchmarks.md.
bench: $(VENV)/.installed-run
	$(BIN)/python -m benchmarks

bench-quick: $(VENV)/.installed-run
	$(BIN)/python -m benchmarks --quick

$(MCP_NODE_SDK): tests/node/package.json tests/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		echo "installing the MCP SDK for node (npm ci in tests/node)"; \
		{ npm ci --prefix tests/node --silent && touch $@; } || \
		echo "could not install tests/node's packages; the node MCP test will be skipped"; \
	else \
		echo "npm is missing; the node MCP test will be skipped"; \
	fi

$(CLAUDE_CODE): tests/claude_code/package.json tests/claude_code/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		echo "installing Claude Code (npm ci in tests/claude_code)"; \
		{ npm ci --prefix tests/claude_code --silent && touch $@; } || \
		echo "could not install tests/claude_code's packages; the Claude Code tests will be skipped"; \
	else \
		echo "npm is missing; the Claude Code tests will be skipped"; \
	fi

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache

# What `capsulectl service` drives (tests/integration/service/): systemd's
# systemctl, systemd-analyze and the user manager, installed from Debian when
# missing where apt-get runs as root; elsewhere those tests are skipped and say why.
.PHONY: systemd-tools
test-tools: systemd-tools
systemd-tools:
	@command -v systemd-analyze >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing systemd with apt-get"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq systemd >/dev/null 2>&1 || \
		{ apt-get update -qq && apt-get install -y -qq systemd; } || \
		echo "could not install systemd; the service tests that need it will be skipped"; \
	else \
		echo "systemd-analyze is missing (no apt-get as root); the service tests that need it will be skipped"; \
	fi
