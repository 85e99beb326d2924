"""What a run remembers (modelfleet.base.runscope): one store per pyinfra State, gone with it; a scope for work
outside a run; nothing kept where neither is open. And the package keeps no cache of its own outside it."""

import ast
import gc
import weakref

from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state

from modelfleet import PACKAGE_DIR
from modelfleet.base import runscope

# Module-level look-ups allowed outside a run: they read files of the installed package (or the installed
# packages' entry points), which do not change while a process runs. Anything that asks a host, a registry or
# the hub, or holds something for a run, lives in runscope.
PACKAGE_CONSTANTS = {
    ("plan/catalog/__init__.py", "load_catalog"), ("run/stages/netcheck.py", "fabric_catalog"),
    ("plan/catalog/routers.py", "specs"), ("plan/exposure.py", "key_coverage"),
    ("plan/inventory/resolver.py", "_pyinfra_keys"), ("base/op_order.py", "_GLOBAL_ARGUMENTS"),
    ("plan/engine_flags.py", "table"), ("host/os/__init__.py", "table"), ("plan/trust.py", "signing_keys"),
    ("plan/xids.py", "catalog"), ("plan/nvlink_errors.py", "catalog"),
}
# Module-level holders allowed: the run store itself, and the record of which pyinfra command line the
# inventory guard validated (made before pyinfra builds its State, for that one process's command); the secrets
# the mask knows, which outlive a run (a traceback printed after it) and exist before one (the CLI's streams).
HOLDERS = {("base/runscope.py", "_stores"), ("plan/inventory/door.py", "_guarded"),
           ("base/masking.py", "_known"), ("base/masking.py", "_lock")}
MUTABLE = {"dict", "set", "list", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "defaultdict",
           "OrderedDict", "Semaphore", "Lock", "RLock"}


def state() -> State:
    return State(Inventory(([("@local", {})], {})), Config())


def test_a_run_keeps_its_slots_and_a_new_run_starts_empty():
    first, second = state(), state()
    with ctx_state.use(first):
        runscope.slot("digests", dict)["a"] = 1
        assert runscope.slot("digests", dict) == {"a": 1}
    with ctx_state.use(second):
        assert runscope.slot("digests", dict) == {}
    assert runscope.slot("digests", dict, run=first) == {"a": 1}


class Held:
    pass


def test_a_run_store_goes_with_its_state():
    run, held = state(), Held()
    runscope.slot("x", dict, run=run)["held"] = held
    gone_run, gone_held = weakref.ref(run), weakref.ref(held)
    del run, held
    gc.collect()
    assert gone_run() is None and gone_held() is None  # the store neither keeps its run alive nor outlives it


def test_outside_a_run_nothing_is_kept_unless_a_scope_is_open():
    runscope.slot("digests", dict)["a"] = 1
    assert runscope.slot("digests", dict) == {}
    with runscope.scope():
        runscope.slot("digests", dict)["a"] = 1
        assert runscope.slot("digests", dict) == {"a": 1}
        assert runscope.lock("x") is runscope.lock("x")
    assert runscope.slot("digests", dict) == {} and runscope.lock("x") is not runscope.lock("x")


def module_level_caches(root=PACKAGE_DIR) -> list[tuple[str, str]]:
    """(module, name) of every module-level mutable container and every cached function under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel.startswith("files/"):  # programs a host runs, one process per command: no run of ours to outlive
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                value, targets = node.value, node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                called = isinstance(value, ast.Call) and getattr(value.func, "attr", getattr(value.func, "id", ""))
                empty = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(
                    value, "keys", getattr(value, "elts", None))
                if called in MUTABLE or empty:
                    found += [(rel, name) for name in names]
            if isinstance(node, ast.FunctionDef):
                for deco in node.decorator_list:
                    target = deco.func if isinstance(deco, ast.Call) else deco
                    if getattr(target, "attr", getattr(target, "id", "")) in ("lru_cache", "cache", "cached_property"):
                        found.append((rel, node.name))
    return found


def test_the_package_keeps_no_cache_outside_the_run_store():
    found = set(module_level_caches())
    assert found - PACKAGE_CONSTANTS - HOLDERS == set(), "a module-level cache: keep it in modelfleet.base.runscope"
    assert PACKAGE_CONSTANTS | HOLDERS <= found  # the lists name only what is there


def test_the_walk_finds_each_shape_of_a_cache(tmp_path):
    (tmp_path / "m.py").write_text(
        "import functools, weakref\nfrom functools import cache\nLIMITS = {'a': 1}\n_seen = {}\n"
        "_held: dict = dict()\n_runs = weakref.WeakKeyDictionary()\n@functools.lru_cache(maxsize=None)\n"
        "def f():\n    pass\n@cache\ndef g():\n    pass\ndef h():\n    local = {}\n")
    assert module_level_caches(tmp_path) == [("m.py", "_seen"), ("m.py", "_held"), ("m.py", "_runs"),
                                             ("m.py", "f"), ("m.py", "g")]


def test_a_memo_is_worked_out_once_per_object_per_run():
    calls, first, second = [], object(), object()
    with ctx_state.use(state()):
        for of in (first, first, second):
            runscope.memo("m", of, lambda of=of: calls.append(of) or len(calls))
        assert runscope.memo("m", first, lambda: 0) == 1 and calls == [first, second]
    with ctx_state.use(state()):
        assert runscope.memo("m", first, lambda: "again") == "again"


def test_a_handler_is_attached_once_to_its_own_run():
    first, second = state(), state()
    made = [runscope.attached("h", BaseStateCallback, run=run) for run in (first, first, second)]
    assert made[0] is made[1] and made[0] is not made[2]
    assert sum(h is made[0] for h in first.callback_handlers) == 1
    assert made[0] not in second.callback_handlers and made[2] in second.callback_handlers
