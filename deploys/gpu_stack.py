"""The GPU host stack alone (preflight, then the gpu_stack stage: os_base, gpu_driver, container_runtime):
`pyinfra INVENTORY deploys/gpu_stack.py`. Rebuilds a bare-metal node up to a GPU-visible container runtime;
serve.py runs the same stages first."""

from modelfleet.run.deploys import gpu_stack

gpu_stack()
