# modelfleet - see README.md. Every target runs from the repository root.
PYTHON ?= python3
PYINFRA ?= pyinfra

.PHONY: install lab-setup demo bench-converge bench-fanout lab-gate lab-verify lab-rollout lab-rebuild lab-down test lint hw-preflight hw-nccl

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

# The NCCL/Gloo gate on a 2-host lab pool (Gloo inside the serving image); prints the pool report (JSON).
lab-gate: install lab-setup
	$(PYTHON) -c "from modelfleet import lab; lab.up(2)" >/dev/null
	MODELFLEET_LAB_GATE_HOSTS=2 $(PYINFRA) -y inventories/lab.py deploys/netcheck.py >&2
	@cat reports/netcheck/gate.json

# Verify gate + a short bench + cost per successful task (self-hosted vs API prices) on the lab (JSON).
lab-verify: install lab-setup
	$(PYTHON) lab/lab_verify.py

# Rolling-upgrade rehearsal: v0.34.0 -> v0.35.0 one host at a time, then a broken image rolled back (JSON).
lab-rollout: install lab-setup
	$(PYTHON) lab/lab_rollout.py

# Bare-metal rebuild rehearsal on a fresh lab (a bare host, an NVSwitch host, a skewed Fabric Manager host):
# deploys/gpu_stack.py twice, preflight before and after; one JSON report per host.
lab-rebuild: install lab-setup
	$(PYTHON) -m modelfleet.lab.rebuild

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

# On a GPU host with PyTorch: the NCCL check over every local GPU, nccl-tests' sweep (-b 1M -e 16G -f 2), JSON.
hw-nccl:
	$(PYTHON) files/nccl_check.py --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --backend nccl \
	  --ops all_reduce,all_gather,all_to_all --min-bytes 1M --max-bytes 16G --factor 2
