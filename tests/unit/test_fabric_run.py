"""fabric_run: a pool's fabric as the stages use it in a run (none for a pool of one host), a service as its
containers run on its host (its member's fabric, an AMD host's render group), and one refusal line per fabric
problem of a pool across hosts."""

from types import SimpleNamespace

from modelfleet.host.fabric import PoolFabric
from modelfleet.host.fabric_run import as_run, pool_fabric, refusals
from modelfleet.plan import render
from modelfleet.plan.inventory import resolve
from tests.helpers.fabric_doubles import fabric

PAIR = {"hardware": "gb300", "model": "kimi-k3.1-pro", "engine": "vllm", "revision": "e" * 40, "pool": "k31"}


def pair(errors=(), members=("t1", "t2")):
    result = resolve([(n, {**PAIR, "ssh_hostname": f"10.0.0.{i + 1}"}) for i, n in enumerate(("t1", "t2"))])
    assert result.errors == []
    asked = []

    def derived(pool):
        asked.append(pool)
        return PoolFabric(pool, hosts={n: fabric(n) for n in members}, errors=list(errors))

    return SimpleNamespace(inventory=result, fabric=derived, probe_on=lambda name: {}), result, asked


def test_a_pool_across_hosts_gets_its_fabric_and_a_pool_of_one_host_none():
    ctx, result, asked = pair()
    assert pool_fabric(ctx, "k31").hosts["t1"].ifname == "enP6p3s0f0np0" and asked == ["k31"]
    alone = resolve([("h1", {"hardware": "h200", "gpu_count": 1, "model": "qwen3-8b", "engine": "vllm"})])
    ctx_alone = SimpleNamespace(inventory=alone, fabric=lambda pool: (_ for _ in ()).throw(AssertionError(pool)))
    assert pool_fabric(ctx_alone, alone.hosts["h1"].services[0].pool) is None


def test_a_member_runs_with_its_own_fabric_in_its_unit():
    ctx, result, _ = pair()
    svc = result.hosts["t2"].services[0]
    run = as_run(ctx, svc)
    assert run.fabric.host == "t2" and svc.fabric is None
    unit = render.render_unit(run)
    assert "/dev/infiniband/rdma_cm" in unit and "/dev/infiniband/rdma_cm" not in render.render_unit(svc)


def test_an_amd_host_runs_with_its_render_group_by_number():
    result = resolve([("m1", {"ssh_hostname": "192.0.2.2", "hardware": "mi355x", "model": "kimi-k3",
                              "engine": "vllm", "revision": "d" * 40})])
    ctx = SimpleNamespace(inventory=result, probe_on=lambda name: {"render_gid": 992})
    assert as_run(ctx, result.hosts["m1"].services[0]).render_gid == 992


def test_each_fabric_problem_is_one_line_naming_pool_place_and_field():
    ctx, result, _ = pair(errors=[("host t2", "NCCL_IB_HCA", "mlx5_4 has no RoCE v2 GID")])
    assert refusals(ctx, result.hosts["t2"].services) == ["pool k31: host t2: NCCL_IB_HCA: mlx5_4 has no RoCE v2 GID"]
    ctx, result, _ = pair(members=("t1",))
    assert refusals(ctx, result.hosts["t2"].services) == [
        "pool k31: host t2: fabric: no fabric derived for this member"]
    ctx, result, _ = pair()
    assert refusals(ctx, [s for p in result.hosts.values() for s in p.services]) == []


def test_a_member_whose_driver_shows_fewer_gpus_refuses_the_pool_naming_hosts_and_counts():
    ctx, result, _ = pair()
    gpus = {"t1": [{"index": i} for i in range(4)], "t2": [{"index": i} for i in range(3)]}
    ctx.probe_on = lambda name: {"nvidia_gpus": gpus[name]}
    assert refusals(ctx, result.hosts["t1"].services) == [
        "pool k31: gpus: unequal GPUs per host (seen by the drivers; the pool needs 4 each): t1 4, t2 3: NCCL "
        "hangs at init when the hosts of a pool carry different numbers of ranks; give every member the same "
        "number of GPUs, or take the short host out"]
    gpus["t2"] = []  # no driver answering yet: preflight's to judge after gpu_driver
    assert refusals(ctx, result.hosts["t1"].services) == []
    gpus["t2"] = [{"index": i} for i in range(4)]
    assert refusals(ctx, result.hosts["t1"].services) == []
