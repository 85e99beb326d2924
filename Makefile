# modelfleet - see README.md. Every target runs from the repository root.
PYTHON ?= python3
PYINFRA ?= pyinfra

.PHONY: install test lint hw-preflight

install:
	$(PYTHON) -m pip install -q -e '.[test]'

test:
	$(PYTHON) -m pytest -q tests

lint:
	$(PYTHON) -m ruff check modelfleet tests deploys inventories

# On a GPU host (Ubuntu, pyinfra installed): preflight through pyinfra's @local connector.
hw-preflight:
	$(PYINFRA) -y inventories/h200-local.py deploys/preflight.py
	@cat reports/preflight/*local*.json
