"""The service stage and the engine cache: the keyed directory and its key file before the unit that mounts it,
nothing when converged, and old keys pruned beyond model_keep_revisions (through pyinfra's @fake connector)."""


import pytest

from modelfleet.plan import render  # noqa: E402
from modelfleet.plan.inventory import resolve  # noqa: E402
from tests.helpers.fake_hosts import b300_host, changed_ops, converged_replies, serve  # noqa: E402


@pytest.fixture(autouse=True)
def reports(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELFLEET_REPORTS", str(tmp_path))


def service(**extra):
    return resolve([("@fake/b300-01", {**b300_host(), **extra})]).hosts["@fake/b300-01"].services[0]


def test_a_new_key_gets_its_directory_and_key_file_before_the_unit(fake, uploads, monkeypatch):
    svc = service()
    cache = render.engine_cache(svc)
    replies = converged_replies(fake, svc)
    # The unit on the host predates the cache: its file differs, and no cache directory exists yet.
    state_lines = [line for line in replies["@@modelfleet-state"] if cache.root not in line]
    drop = state_lines.index(f"@@modelfleet-state path /etc/systemd/system/{svc.unit_name}")
    state_lines[drop + 1] = "file 644 root root " + "0" * 64
    host = {**b300_host(), "fake_responses": {**replies, "@@modelfleet-state": state_lines}}
    state = fake.run_fake([("b300-01", host)], serve)
    commands = fake.executed(state, "b300-01")
    made = [i for i, c in enumerate(commands) if c.startswith(f"mkdir -p {cache.dir} ")]
    assert made and any(c.startswith(f"mkdir -p {cache.root} ") for c in commands[:made[0]])
    assert uploads.files[cache.key_file] == cache.key_json
    unit = uploads.files[f"/etc/systemd/system/{svc.unit_name}"]
    assert f"-v {cache.dir}:/cache" in unit
    restart = commands.index(f"systemctl restart {svc.unit_name}")
    assert made[0] < restart


def _with_root_entries(fake, svc, entries):
    cache = render.engine_cache(svc)
    replies = converged_replies(fake, svc)
    lines = replies["@@modelfleet-state"]
    at = lines.index(f"@@modelfleet-state path {cache.root}")
    lines[at + 2:at + 2] = (["entries", "entry .modelfleet-owned", f"entry {cache.key}"]
                            + [f"entry {e}" for e in entries])
    return replies


@pytest.mark.parametrize("stale, keep, pruned", [
    (["1" * 16], 1, False),
    (["1" * 16, "2" * 16], 1, True),
    (["1" * 16, "2" * 16], 2, False),
])
def test_old_keys_beyond_keep_are_pruned_and_the_one_in_use_never(fake, stale, keep, pruned):
    svc = service(model_keep_revisions=keep)
    host = {**b300_host(), "model_keep_revisions": keep, "fake_responses": _with_root_entries(fake, svc, stale)}
    state = fake.run_fake([("b300-01", host)], serve)
    commands = fake.executed(state, "b300-01")
    prunes = [c for c in commands if "xargs -r -I@ rm -rf" in c]
    if not pruned:
        assert prunes == [] and changed_ops(state, "b300-01") == []
        return
    assert len(prunes) == 1
    root = render.engine_cache(svc).root
    assert prunes[0] == (f"sh -c 'cd {root} && ls -dt -- {' '.join(sorted(stale))} | tail -n +{keep + 1} | "
                         "xargs -r -I@ rm -rf -- @ @.key.json @.modelfleet-set-aside'")
    assert render.engine_cache(svc).key not in prunes[0]
