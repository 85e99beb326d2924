# modelfleet - see README.md. Every target runs from the repository root, with the project's own virtual
# environment (.venv): nothing is installed into the system Python, whose stray packages (e.g. the machine
# image's trio) never reach a run.
SYSTEM_PYTHON ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PYINFRA := $(PYTHON) -m pyinfra

.PHONY: install lock lab-setup demo bench-converge bench-fanout bench-ready lab-gate lab-verify lab-rollout lab-driver-upgrade lab-rebuild lab-down engine-parsers engine-flags test-fast test lint hw-preflight hw-admit hw-nccl

# The versions that passed (requirements.lock, from `make lock`) installed into .venv; re-run when either
# file changes.
install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements.lock
	$(SYSTEM_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install -q -c requirements.lock -e '.[test]'
	@# An editable install leaves modelfleet uncompiled (and PYTHONDONTWRITEBYTECODE=1 keeps it so): every pyinfra
	@# run would compile it again. compileall writes the .pyc files whatever that variable says.
	$(PYTHON) -m compileall -q modelfleet
	touch $@

# Refresh requirements.lock from pyproject.toml's ranges (uv's resolver, run from .venv), and the hashed locks for
# hosts (every file of every pinned version, for each Python from 3.10 and machine the hosts run): the hub
# client's, and each catalog router release's (catalog/router_locks/<package>-<version>.txt, wheels only; made
# afresh: uv keeps the hashes of a lock it is given, and those would miss files of the newer Pythons).
lock: install
	$(PYTHON) -m pip install -q uv
	$(VENV)/bin/uv pip compile -q --python-version 3.11 --extra test -o requirements.lock pyproject.toml
	cd modelfleet/files && $(abspath $(VENV))/bin/uv pip compile -q --universal --python-version 3.10 --generate-hashes \
	    --custom-compile-command "make lock" -o hub_client.txt hub_client.in
	for req in $$($(PYTHON) -c 'from modelfleet.plan.catalog.routers import specs; \
	        print(*sorted({f"{s.package}=={s.version}" for s in specs().values()}))'); do \
	    out=modelfleet/plan/catalog/router_locks/$$(echo "$$req" | sed 's/==/-/').txt; rm -f "$$out"; \
	    echo "$$req" | $(VENV)/bin/uv pip compile -q --universal --python-version 3.10 --generate-hashes \
	        --only-binary :all: --no-annotate --custom-compile-command "make lock" -o "$$out" - || exit 1; \
	done

# Debian packages (docker.io, mmdebstrap, docker-registry) and a running dockerd, for the lab.
lab-setup:
	bash lab/setup-machine.sh

# Lab up (3 hosts), serve.py over SSH, one chat completion per endpoint through the openai SDK. The first run on a
# machine builds the lab's images (14 minutes measured on a busy two-core machine, the real vLLM's CPU build the
# longest step); later runs take about a minute.
demo: install lab-setup
	$(PYTHON) -m lab.demo

# No-op converge of serve.py: wall time on 1 and 48 lab hosts, remote commands per host, and control-node CPU per
# host at 16 and 48 hosts beside stock pyinfra running as many no-op operations, and both replayed at 1 to 1,000
# simulated hosts with no SSH: fixed cost and per-host cost over stock pyinfra's (JSON).
bench-converge: install lab-setup
	$(PYTHON) -m lab.bench_converge 16 48

# A 1 GiB checkpoint to 3, 6 and 12 lab hosts, each capped: group fill time ÷ one copy's time, swarm and tree in
# the same run, hub egress and the machine's busy CPU share per run (JSON). BENCH_FANOUT_ARGS="--rate 15" sets the
# cap (MB/s); "--receiver" adds the receiver beside curl.
bench-fanout: install lab-setup
	$(PYTHON) -m lab.bench_fanout $(BENCH_FANOUT_ARGS)

# Time from `pyinfra` start to the first answer for a cold deploy, a restart and a member joining, each split by
# stage from its timeline report, on the lab's llama-server; ratios restart/cold and join/cold (JSON). On the real
# vLLM, one round: make bench-ready BENCH_READY_ARGS="1 --engine vllm".
bench-ready: install lab-setup
	$(PYTHON) -m lab.bench_ready $(BENCH_READY_ARGS)

# The NCCL/Gloo gate on a 2-host lab pool (Gloo inside the serving image); prints the pool report (JSON).
lab-gate: install lab-setup
	$(PYTHON) -c "import lab; lab.up(2)" >/dev/null
	$(PYTHON) lab/scenario.py gate_hosts=2 -- $(PYINFRA) -y inventories/lab.py deploys/netcheck.py >&2
	@cat reports/netcheck/gate.json

# Verify gate + a short bench + cost per successful task (self-hosted vs API prices) on the lab (JSON).
lab-verify: install lab-setup
	$(PYTHON) -m lab.lab_verify

# Rolling-upgrade rehearsal: v0.34.0 -> v0.35.0 one host at a time, then a broken image rolled back (JSON).
lab-rollout: install lab-setup
	$(PYTHON) -m lab.lab_rollout

# Rolling driver upgrade rehearsal: 3 bare H200 lab hosts built at 580.95.05, rolled to 580.159.04 one host at
# a time (drain, install, reboot, gate, restart) while the others serve (JSON report).
lab-driver-upgrade: install lab-setup
	$(PYTHON) -m lab.lab_driver_upgrade

# Bare-metal rebuild rehearsal on a fresh lab (a bare host, an NVSwitch host, a skewed Fabric Manager host):
# deploys/gpu_stack.py twice, preflight before and after; one JSON report per host.
lab-rebuild: install lab-setup
	$(PYTHON) -m lab.rebuild

lab-down: install
	$(PYTHON) -m modelfleet.cli lab down

# The real vLLM and SGLang, far enough to import their argument parsers (lab/engine_parsers: several GB, in a
# cache outside the checkout, built once per lab/engine_parsers/requirements.txt), and TokenSpeed's `serve`
# parsers in an environment of their own (tokenspeed_requirements.txt).
engine-parsers: install
	SYSTEM_PYTHON=$(SYSTEM_PYTHON) $(PYTHON) -m lab.engine_parsers build

# The engine double's flag lists (modelfleet/plan/catalog/engine_flags.json): vLLM's and SGLang's from those parsers,
# llama.cpp's from the lab's real llama-server (`--help`, in its image: needs dockerd).
engine-flags: engine-parsers lab-setup
	$$($(PYTHON) -m lab.engine_parsers python) lab/engine_parsers/check.py flags modelfleet/plan/catalog/engine_flags.json
	$$($(PYTHON) -m lab.engine_parsers tokenspeed-python) lab/engine_parsers/tokenspeed_check.py flags \
		modelfleet/plan/catalog/engine_flags.json
	$(PYTHON) -m lab.engine_parsers llama-flags modelfleet/plan/catalog/engine_flags.json

# The tests that need no lab and wait out no timeout, in two processes side by side (MODELFLEET_TEST_HALF: every
# other test; pytest-xdist's workers hang once pyinfra_cli patches threading), bytecode kept (a
# PYTHONDONTWRITEBYTECODE=1 environment compiles and rewrites every module again on every run): about 32 s on two
# cores. `make test` runs them all.
FAST = PYTHONDONTWRITEBYTECODE= $(PYTHON) -m pytest -q -m "not slow" tests --ignore=tests/lab --ignore=tests/router
test-fast: install
	@out=$$(mktemp /tmp/modelfleet-test-fast.XXXXXX); \
	MODELFLEET_TEST_HALF=1/2 $(FAST) -p no:cacheprovider > "$$out" 2>&1 & other=$$!; \
	trap 'kill -INT $$other 2>/dev/null; rm -f "$$out"' INT TERM; \
	MODELFLEET_TEST_HALF=0/2 $(FAST); mine=$$?; \
	wait $$other; theirs=$$?; echo "--- the other half:"; cat "$$out"; rm -f "$$out"; \
	[ $$mine -eq 0 ] && [ $$theirs -eq 0 ]

# Every test; the engine-parser checks may not skip here (MODELFLEET_REQUIRE_ENGINE_PARSERS). Two pytest processes
# side by side, each on its own lab (nets 1 and 2; tests/conftest.py says which tests each runs): the lab's
# end-to-end tests mostly wait on their hosts. Shard b's output follows shard a's. 26 to 30 minutes on two cores
# (one process: 50 to 56).
test: install engine-parsers
	@# The lab's images first, once: two shards starting on a machine without them would each build them.
	@if docker info >/dev/null 2>&1; then $(PYTHON) -c 'import lab; lab.build_images()'; fi
	@b_dir=$$(mktemp -d /tmp/modelfleet-test-b.XXXXXX); \
	MODELFLEET_REQUIRE_ENGINE_PARSERS=1 MODELFLEET_TEST_SHARD=b MODELFLEET_TEST_LAB_NET=2 \
	    $(PYTHON) -m pytest -q -p no:cacheprovider --basetemp="$$b_dir/tmp" tests > "$$b_dir/log" 2>&1 & b=$$!; \
	trap 'kill -INT $$b 2>/dev/null' INT TERM; \
	MODELFLEET_REQUIRE_ENGINE_PARSERS=1 MODELFLEET_TEST_SHARD=a MODELFLEET_TEST_LAB_NET=1 \
	    $(PYTHON) -m pytest -q tests; a_rc=$$?; \
	wait $$b; b_rc=$$?; \
	echo "--- shard b (every test outside tests/lab, and the real vLLM's and longest lab modules):"; \
	cat "$$b_dir/log"; rm -rf "$$b_dir"; \
	echo "make test: shard a exit $$a_rc, shard b exit $$b_rc"; \
	[ $$a_rc -eq 0 ] && [ $$b_rc -eq 0 ]

# shellcheck on the programs a host receives (modelfleet/shell), and on the lab's scripts at warning level (their
# mmdebstrap hooks quote "$1" for the hook's own shell on purpose).
lint: install
	$(PYTHON) -m ruff check modelfleet tests deploys inventories
	$(VENV)/bin/shellcheck modelfleet/shell/*.sh
	$(VENV)/bin/shellcheck --severity=warning lab/*.sh

# On a GPU host (Ubuntu, pyinfra installed): preflight through pyinfra's @local connector.
hw-preflight:
	$(PYINFRA) -y inventories/h200-local.py deploys/preflight.py
	@cat reports/preflight/*local*.json

# On a GPU host (pyinfra installed): the admission stage through pyinfra's @local connector; the report (JSON).
hw-admit:
	$(PYINFRA) -y inventories/h200-local.py deploys/admission.py
	@cat reports/admission/*local*.json

# On a GPU host with PyTorch: the NCCL check over every local GPU, nccl-tests' sweep (-b 1M -e 16G -f 2), JSON.
hw-nccl:
	$(PYTHON) files/nccl_check.py --nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --backend nccl \
	  --ops all_reduce,all_gather,all_to_all --min-bytes 1M --max-bytes 16G --factor 2
