# agentpool developer commands. `make help` lists them.
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest

.PHONY: help install lint typecheck test test-parallel test-unit test-integration generate verify-generated bench demo

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

install: ## editable install with the development extras
	$(PYTHON) -m pip install -e '.[dev]'
	$(PYTHON) -m pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1

lint: ## ruff (checks and formatting), then the import-linter contracts (layers; pure cores free of I/O; the simulator off live services)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	lint-imports

typecheck: ## mypy strict on every part of the namespace package (control plane, engine, operator) and the benchmarks
	$(PYTHON) -m mypy -p agentpool -p agentpool.engine -p agentpool.operator
	$(PYTHON) -m mypy bench

test: ## the whole test suite (unit and integration; needs Redis on 127.0.0.1:6379)
	$(PYTEST) -q tests

test-parallel: ## the same on two pytest-xdist workers, a test file each (about half the time; CI runs `test`)
	$(PYTEST) -q -n 2 --dist loadfile tests

test-unit: ## hermetic unit tests only
	$(PYTEST) -q tests/unit

test-integration: ## integration tests (real Redis, gRPC, HTTP, NIXL on loopback)
	$(PYTEST) -q tests/integration

generate: ## regenerate gRPC stubs, the CRD and docs/spec.md from their sources
	$(PYTHON) scripts/generate.py

verify-generated: ## fail if the committed generated files differ from a fresh generation
	$(PYTHON) scripts/generate.py --check

bench: ## run the benchmarks that print figures
	$(PYTHON) -m bench

demo: ## the main job on its embedded default: simulate agentpool against the baselines
	agentpool simulate
