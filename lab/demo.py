"""`make demo`: lab up (3 hosts), serve.py over real SSH, then one chat completion per endpoint (openai SDK).
The vLLM and SGLang endpoints are the lab's engine double; the llama.cpp one is the real llama-server (Debian's
build) on a tiny GGUF with random weights, so its answer is noise: `served_by` says which server answered."""

import json
import sys

from openai import OpenAI

import lab
from modelfleet.commands import run_pyinfra
from modelfleet.inventory import resolve_inventory


def main() -> int:
    lab.up(3)
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
                            "finish_reason": reply.choices[0].finish_reason,
                            # llama-server names its build here; the double leaves it empty
                            "served_by": f"llama-server {reply.system_fingerprint}" if reply.system_fingerprint
                            else "modelfleet lab engine double"})
    print(json.dumps(answers, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
