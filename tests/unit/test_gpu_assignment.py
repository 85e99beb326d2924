"""Each service gets its own GPUs: disjoint indices on a host, through CDI device requests (NVIDIA) or its own
render nodes (AMD), never `--gpus all`."""

from pathlib import Path

from modelfleet.plan import render
from modelfleet.plan.inventory import resolve


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


def test_amd_containers_get_the_hosts_render_group_by_number():
    """The render group's id is the host's (its probe reads `getent group render`): by name it would resolve in
    the image, whose /etc/group may not have it. A host without the group gets video only."""
    from types import SimpleNamespace

    from modelfleet.host.fabric_run import as_run

    result = resolve([("m1", {"ssh_hostname": "192.0.2.2", "hardware": "mi355x", "model": "kimi-k3",
                              "engine": "vllm", "revision": "d" * 40})])
    svc = result.hosts["m1"].services[0]
    for gid, tail in ((992, ["--group-add", "video", "--group-add", "992"]), (None, ["--device",
                                                                                  "/dev/dri/renderD135",
                                                                                  "--group-add", "video"])):
        ctx = SimpleNamespace(inventory=result, probe_on=lambda name, gid=gid: {"render_gid": gid})
        flags = render.gpu_flags(as_run(ctx, svc))
        assert flags[-len(tail):] == tail and "render" not in flags
    assert "render" not in render.gpu_flags(svc)  # before the probe: no group by name


def test_preflight_names_a_driver_changed_under_the_loaded_module():
    from modelfleet.run.stages.preflight import evaluate

    plan = resolve([("h1", {"ssh_hostname": "192.0.2.1", "hardware": "h200", "gpu_count": 1, "model": "qwen3-8b",
                            "engine": "vllm"})]).hosts["h1"]
    # What the probe reads after `apt-get upgrade` moved the driver's libraries: the module still loaded,
    # nvidia-smi failing ("Driver/library version mismatch").
    probe = {"nvidia_module": {"version": "580.95.05", "open": True}, "nvidia_versions": None, "nvidia_gpus": None}
    report = evaluate(plan, probe, defer_stack=True)
    assert any(p.startswith("driver mismatch: the loaded kernel module is 580.95.05") for p in report["problems"])


def test_a_service_spanning_numa_nodes_is_told_which_indices_keep_it_on_one():
    """The recorded 8x B300 topology (GPUs 0-3 on node 0, 4-7 on node 1): a 3-GPU pool on 0-2 and a 4-GPU pool
    after it on 3-6, as lowest-free assignment would place them, cross the socket interconnect; 4-7 would not.
    (The catalog has no 2-7 GPU recipe on B300 yet: the services' indices are set the way a site recipe's
    would be assigned.)"""
    from dataclasses import replace

    import yaml

    from modelfleet.host.facts.gpu import NvidiaTopology
    from modelfleet.plan.gpu_predicates import locality_notes

    case = yaml.safe_load((Path(__file__).parents[1] / "facts" / "gpu.NvidiaTopology" / "b300x8_9nic.yaml").read_text())
    topology = NvidiaTopology().process(case["output"])
    hosts = [("h1", {"ssh_hostname": "192.0.2.1", "hardware": "b300", "gpu_count": 8, "services": [
        {"pool": "a", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm", "port": 8000},
        {"pool": "b", "model": "tiny-lab", "engine": "vllm", "recipe": "tiny-lab-vllm", "port": 8001}]})]
    result = resolve(hosts)
    assert result.errors == []
    plan = result.hosts["h1"]

    def placed(a, b):
        return replace(plan, services=(replace(plan.services[0], gpu_indices=a),
                                       replace(plan.services[1], gpu_indices=b)))

    assert locality_notes(placed((0, 1, 2), (3, 4, 5, 6)), topology) == [
        "b: GPUs 3,4,5,6 span NUMA nodes 0,1; gpu_indices [4, 5, 6, 7] would keep it on node 1"]
    assert locality_notes(placed((0, 1, 2), (4, 5, 6, 7)), topology) == []
    assert locality_notes(placed((0, 1, 2), (3, 4, 5, 6)), {"numa": {"GPU0": 0}}) == []  # one node: nothing to say
