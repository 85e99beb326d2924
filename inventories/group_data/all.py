# Defaults for every host of inventories/prod.py (the catalog fills anything not set here).
ssh_user = "root"
model_root = "/srv/models"
hf_token_env = "HF_TOKEN"  # name of the control-node variable; the token itself never lands in a file here
# The GPU host stack (os_base, gpu_driver, container_runtime) runs first in serve.py and deploys/gpu_stack.py:
# NVIDIA R580 with open kernel modules, held by NVIDIA's pinning package; a host whose loaded driver is newer is
# refused. `reboot = False` (or `pyinfra ... --data reboot=false`) records a pending reboot instead of rebooting.
driver_branch = "580"
reboot = True
# A site mirror replaces each outside URL (these are the defaults), e.g.:
# nvidia_repo_url = "https://mirror.example.internal/developer.download.nvidia.com/compute/cuda/repos"
# docker_repo_url = "https://mirror.example.internal/download.docker.com/linux"
