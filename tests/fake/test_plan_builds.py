"""A run resolves its inventory once (the guard's resolution is the run's where pyinfra loaded the inventory:
tests/unit/test_inventory_applies.py) and makes each service's plan a fixed number of times, whatever its stages
ask: the resolver builds it, gives it its GPUs (per host) and its rank (per pool), and the pins give it its
commit and image digest once. A stage that rebuilt a plan of its own would read values no other stage saw."""

import collections

from modelfleet.plan.inventory import door
from modelfleet.plan.inventory import plan as planmod
from modelfleet.run.pipeline import run_stages
from modelfleet.run.stages import images, preflight, service
from tests.helpers.fake_hosts import b300_host, b300_probe


def test_a_run_resolves_once_and_makes_each_plan_four_times(fake, uploads, monkeypatch, tmp_path):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))
    made, resolves = collections.Counter(), []
    init, resolve = planmod.ServicePlan.__init__, door.resolve

    def counted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made[self.pool] += 1

    def counted_resolve(*args, **kwargs):
        resolves.append(args)
        return resolve(*args, **kwargs)

    monkeypatch.setattr(planmod.ServicePlan, "__init__", counted)
    monkeypatch.setattr(door, "resolve", counted_resolve)  # what the run resolves with
    host = {**b300_host(), "fake_responses": {"@@modelfleet-probe": b300_probe(fake)}}
    state = fake.run_fake([("b300-01", host), ("b300-02", {**host, "pool": "k32"})],
                          lambda: run_stages(preflight, images, service))
    assert "systemctl start modelfleet-k31.service" in fake.executed(state, "b300-01")  # the stages ran
    assert len(resolves) == 1
    assert made == {"k31": 4, "k32": 4}  # built, GPUs, rank, pinned
