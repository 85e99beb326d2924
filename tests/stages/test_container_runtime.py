"""The container runtime's pure decisions: Docker's daemon.json needs the nvidia runtime and CDI (engines get
their GPUs as CDI devices), the CDI spec follows the driver, and Docker restarts only when it runs and its
configuration changed."""

from modelfleet.plan.inventory import resolve
from modelfleet.run.stages.container_runtime import CDI_SPEC, DAEMON_JSON, decide, nvidia_runtime_configured

CONFIGURED = '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}, "features": {"cdi": true}}'
UBUNTU = {"os": {"id": "ubuntu", "codename": "noble", "arch": "x86_64"}}


def plan():
    hosts = [("h1", {"ssh_hostname": "192.0.2.1", "hardware": "h200", "gpu_count": 1,
                     "services": [{"pool": "a", "model": "qwen3-8b", "engine": "vllm"}]})]
    result = resolve(hosts)
    assert result.errors == []
    return result.hosts["h1"]


def state(daemon_json=None, spec=True, docker="active"):
    return {"texts": {DAEMON_JSON: daemon_json}, "paths": {CDI_SPEC: {"kind": "file"} if spec else None},
            "units": {"docker.service": {"ActiveState": docker}}}


def test_daemon_json_needs_both_the_runtime_and_cdi():
    assert nvidia_runtime_configured(CONFIGURED)
    assert not nvidia_runtime_configured('{"runtimes": {"nvidia": {}}}')  # Docker 25-27 without features.cdi
    assert not nvidia_runtime_configured(None) and not nvidia_runtime_configured("{not json")


def test_a_configured_host_changes_nothing():
    d = decide(plan(), UBUNTU, state(CONFIGURED))
    assert (d.configure_nvidia, d.cdi, d.restart_docker) == (False, False, False)
    assert "nvidia-container-toolkit" in d.packages


def test_a_running_docker_restarts_only_for_a_configuration_change():
    assert decide(plan(), UBUNTU, state(None)).restart_docker
    assert not decide(plan(), UBUNTU, state(None, docker="inactive")).restart_docker


def test_the_cdi_spec_follows_the_driver_but_waits_for_a_pending_reboot():
    assert decide(plan(), UBUNTU, state(CONFIGURED), driver_changes=True).cdi
    assert decide(plan(), UBUNTU, state(CONFIGURED, spec=False)).cdi
    assert not decide(plan(), UBUNTU, state(CONFIGURED), driver_changes=True, reboot_pending=True).cdi
