# The two commands of README.md. Everything else is plain pip and pytest.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test lint bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/capsuled

test: lint
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-test
	$(BIN)/ruff check daemon client tests benchmarks
	$(BIN)/ruff format --check daemon client tests benchmarks
	$(BIN)/mypy --strict daemon client benchmarks

# The benchmarks (outside the test suite): full sizes rewrite docs/benchmarks.md.
bench: $(VENV)/.installed-run
	$(BIN)/python -m benchmarks

bench-quick: $(VENV)/.installed-run
	$(BIN)/python -m benchmarks --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
