"""What one pyinfra run remembers, kept in one place: every cache and held thing (resolved digests and
checkpoints, the run context, held locks and reports, the boot timeline) is a named slot of the run's store,
keyed by pyinfra's State, so a new run, or a new test, never sees an older run's inventory or answers.

Outside a pyinfra run (the CLI's own commands), a command that wants its look-ups shared opens `scope()`;
without one nothing is kept, and each call asks again."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from gevent.lock import Semaphore
from pyinfra.api import State
from pyinfra.context import ctx_state

T = TypeVar("T")

_stores: weakref.WeakKeyDictionary[State, dict] = weakref.WeakKeyDictionary()
_outside: ContextVar[dict | None] = ContextVar("modelfleet_scope", default=None)


def current() -> State | None:
    """The State of the pyinfra run in progress (pyinfra's `state` is a context proxy), or None."""
    return ctx_state.get()


def store(run: State | None = None) -> dict | None:
    """The run's store (the scope's outside a run); None where nothing is kept."""
    run = run or current()
    if run is None:
        return _outside.get()
    if run not in _stores:
        _stores[run] = {}
    return _stores[run]


def slot(name: str, factory: Callable[[], T], run: State | None = None) -> T:
    """The run's `name` slot, made by `factory()` on first use; a fresh, unkept one where nothing is kept."""
    held = store(run)
    if held is None:
        return factory()
    if name not in held:
        held[name] = factory()
    return held[name]


def memo(name: str, of: object, compute: Callable[[], T]) -> T:
    """compute(), once per run for the object `of` (by identity); the slot holds `of` too, so its id is not
    reused for another object while the run lasts."""
    known = slot(name, dict)
    held = known.get(id(of))
    if held is None or held[0] is not of:
        held = known[id(of)] = (of, compute())
    return held[1]


def attached(name: str, factory: Callable[[], T], run: State | None = None) -> T:
    """The run's `name` callback handler (pyinfra's BaseStateCallback), made and attached to the run's State on
    first use: it hears that run's events and no other's."""
    run = run or current()

    def made() -> T:
        handler = factory()
        run.add_callback_handler(handler)
        return handler

    return slot(name, made, run=run)


def lock(name: str) -> Semaphore:
    """A lock of the run's (greenlets of one run share it); a fresh one where nothing is kept."""
    return slot(f"lock {name}", Semaphore)


@contextlib.contextmanager
def scope() -> Iterator[dict]:
    """Look-ups shared until the block ends, for work outside a pyinfra run (one CLI command)."""
    token = _outside.set({})
    try:
        yield _outside.get()
    finally:
        _outside.reset(token)
