"""A member's RDMA rail (modelfleet.host.rails) from recorded fabric dumps: the backend route group's active,
full-membership ports in rail order, the frontend and the rest left out with why, and members held to one rail."""

from __future__ import annotations

from pathlib import Path

from modelfleet.host.facts.fabric import parse_fabric
from modelfleet.host.rails import check_rails, common_family, rail, what_was_left

FABRIC = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"


def fact(name: str) -> dict:
    return parse_fabric((FABRIC / name).read_text().splitlines())


def test_the_backend_route_group_is_the_rail_and_the_frontend_bond_is_left_out():
    chosen = rail(fact("b300-worker.txt"), "bond0")
    assert chosen.link_layer == "Ethernet" and chosen.key == "routes 10.224.0.0/16"
    assert chosen.hcas == [(f"mlx5_{i}", "1") for i in range(10, 18)]
    assert chosen.left_out["mlx5_bond_0:1"] == "another route group (frontend, Ethernet)"
    assert "mlx5_bond_0:1: another route group" in what_was_left(chosen)
    assert what_was_left(chosen, rail_only=True) == "no other HCA on this rail"
    assert common_family({"w": chosen}) == "AF_INET"


def test_members_on_different_link_layers_or_with_fewer_hcas_are_refused_by_host():
    head, ib = rail(fact("b300-head.txt"), "bond0"), rail(fact("h100-ib-0.txt"), None)
    errors: list = []
    check_rails([], {"b300-a": head, "h100-b": ib}, {}, errors)
    assert ("host h100-b", "NCCL_IB_HCA", "HCAs on InfiniBand, b300-a's on Ethernet") in errors
    errors.clear()
    fewer = rail(fact("b300-worker.txt"), "bond0")
    fewer.hcas = fewer.hcas[:6]
    check_rails([], {"b300-a": head, "b300-b": fewer}, {}, errors)
    assert [(w, f) for w, f, m in errors] == [("host b300-b", "NCCL_IB_HCA")]
    assert errors[0][2].startswith("6 usable HCAs") and "b300-a has 8" in errors[0][2]
    # A member whose HCAs the inventory names is not derived, so not held to the others.
    errors.clear()
    check_rails([], {"b300-a": head, "b300-b": fewer}, {"b300-b": "=mlx5_10"}, errors)
    assert errors == []
