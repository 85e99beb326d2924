"""Each service gets its own GPUs: disjoint indices on a host, through CDI device requests (NVIDIA) or its own
render nodes (AMD), never `--gpus all`."""

from modelfleet import render
from modelfleet.inventory import resolve


def two_services(hardware="h200", gpu_count=2, **second):
    return [("h1", {"ssh_hostname": "192.0.2.1", "hardware": hardware, "gpu_count": gpu_count, "services": [
        {"pool": "a", "model": "qwen3-8b", "engine": "vllm", "port": 8000, "gpus": 1},
        {"pool": "b", "model": "qwen3-8b", "engine": "vllm", "port": 8001, "gpus": 1, **second}]})]


def test_two_one_gpu_services_on_an_h200_host_get_disjoint_gpus():
    result = resolve(two_services())
    assert result.errors == []
    a, b = result.hosts["h1"].services
    assert (a.gpu_indices, b.gpu_indices) == ((0,), (1,))
    assert render.gpu_flags(a) == ["--device", "nvidia.com/gpu=0"]
    assert render.gpu_flags(b) == ["--device", "nvidia.com/gpu=1"]
    assert "--gpus" not in render.render_unit(a)


def test_explicit_gpu_indices_are_kept_and_the_rest_fill_around_them():
    result = resolve(two_services(gpu_count=4, gpu_indices=[0]))
    a, b = result.hosts["h1"].services
    assert (a.gpu_indices, b.gpu_indices) == ((1,), (0,))


def test_bad_gpu_indices_are_refused():
    for second, needle in (({"gpu_indices": [5]}, "does not exist"), ({"gpu_indices": [0, 1]}, "lists 2"),
                           ({"gpu_indices": [1, 1]}, "same entry twice")):
        errors = resolve(two_services(**second)).errors
        assert any(f == "gpu_indices" and needle in m for _, f, m in errors), (second, errors)
    both = [("h1", {"ssh_hostname": "192.0.2.1", "hardware": "h200", "gpu_count": 2, "services": [
        {"pool": "a", "model": "qwen3-8b", "engine": "vllm", "port": 8000, "gpus": 1, "gpu_indices": [1]},
        {"pool": "b", "model": "qwen3-8b", "engine": "vllm", "port": 8001, "gpus": 1, "gpu_indices": [1]}]})]
    assert any("given to both a and b" in m for _, _, m in resolve(both).errors)


def test_amd_services_get_their_own_render_nodes():
    result = resolve([("m1", {"ssh_hostname": "192.0.2.2", "hardware": "mi355x", "model": "kimi-k3",
                              "engine": "vllm", "revision": "d" * 40})])
    assert result.errors == []
    flags = render.gpu_flags(result.hosts["m1"].services[0])
    assert flags[:2] == ["--device", "/dev/kfd"] and "--device /dev/dri/renderD135" in " ".join(flags)
    assert "/dev/dri" not in flags  # not every render node of the host


def test_preflight_names_a_driver_changed_under_the_loaded_module():
    from modelfleet.stages.preflight import evaluate

    plan = resolve([("h1", {"ssh_hostname": "192.0.2.1", "hardware": "h200", "gpu_count": 1, "model": "qwen3-8b",
                            "engine": "vllm"})]).hosts["h1"]
    # What the probe reads after `apt-get upgrade` moved the driver's libraries: the module still loaded,
    # nvidia-smi failing ("Driver/library version mismatch").
    probe = {"nvidia_module": {"version": "580.95.05", "open": True}, "nvidia_versions": None, "nvidia_gpus": None}
    report = evaluate(plan, probe, defer_stack=True)
    assert any(p.startswith("driver mismatch: the loaded kernel module is 580.95.05") for p in report["problems"])
