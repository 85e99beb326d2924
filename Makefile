# modelfleet - see README.md. Every target runs from the repository root.
PYTHON ?= python3
PYINFRA ?= pyinfra

.PHONY: install lab-setup demo bench-converge bench-fanout lab-verify lab-down test lint hw-preflight

install:
	$(PYTHON) -m pip install -q -e '.[test]'

# Debian packages (docker.io, mmdebstrap, docker-registry) and a running dockerd, for the lab.
lab-setup:
	bash lab/setup-machine.sh

# Lab up (3 hosts), serve.py over SSH, one chat completion per endpoint through the openai SDK.
demo: install lab-setup
	$(PYTHON) lab/demo.py

# No-op converge time of serve.py on 1 and 16 lab hosts (same run), ratio, remote commands per host (JSON).
bench-converge: install lab-setup
	$(PYTHON) lab/bench_converge.py 16

# Checkpoint distribution on 1, 3 and 6 lab hosts: hub egress ratio and fan-out vs raw copy rate (JSON).
bench-fanout: install lab-setup
	$(PYTHON) lab/bench_fanout.py

# Verify gate + a short bench + cost per successful task (self-hosted vs API prices) on the lab (JSON).
lab-verify: install lab-setup
	$(PYTHON) lab/lab_verify.py

lab-down:
	modelfleet lab down

test:
	$(PYTHON) -m pytest -q tests

lint:
	$(PYTHON) -m ruff check modelfleet tests deploys inventories

# On a GPU host (Ubuntu, pyinfra installed): preflight through pyinfra's @local connector.
hw-preflight:
	$(PYINFRA) -y inventories/h200-local.py deploys/preflight.py
	@cat reports/preflight/*local*.json
