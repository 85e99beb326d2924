"""The one home of masking: what modelfleet prints, or writes anywhere but a 0600 file, goes through `mask`.

A secret is known by its value (the API keys and hub token the inventory names by variable, pyinfra's passwords
in host data, a password in a URL: `learn`), or recognised by its form (credentials in a URL, `api_key=...`,
`Bearer ...`, a data key named like a secret). Known values are replaced wherever they appear, also as Python
or JSON would escape them and line by line (a key holding a newline is printed by an exception as two lines or
as `\\n`). The CLI and the pyinfra run write their streams through `streams()`, so a printer nobody thought of
(a traceback, pyinfra's operation names and command output) is masked too.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import threading
import traceback
import urllib.parse
from typing import Any

from modelfleet.base import keys

MASK = "********"
# A data key or environment variable named like a secret (pyinfra's `_sudo_password`, `ssh_key_password`...).
SECRET_NAME = re.compile(r"(?i)(key|token|secret|password|passwd|passphrase)$")
# pyinfra's `ssh_key` is the path to a key file; a bare `key` is a field's name in modelfleet's own JSON.
NOT_SECRET = frozenset({"ssh_key", "key"})
URL_CREDENTIALS = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s\"']+)@")
# A value after a secret's name (`api_key=...`, `"api-key": "..."`, `--api-key X`, `Bearer X`; not `name: text`,
# the form of modelfleet's own messages): what an engine logs about itself. MASK itself is left alone (masking
# twice changes nothing), and so is what only names one: a placeholder (`Bearer <key>`, `{key}`, `$KEY`, `%s`),
# a call or attribute (`token = job.get(...)`) or a word under 8 characters (`token=token`). Known secrets are
# masked by value wherever they appear; this catches the ones the control node does not hold.
NAMED_VALUE = re.compile(r"(?i)(\b[\w-]*(?:api[_-]?key|token|secret|password|passwd)"
                         r"(?:\s*=\s*['\"]?|['\"]?\s*:\s*['\"])"
                         r"|--[\w-]*(?:api-key|token|secret|password)\s+|\bbearer\s+)"
                         r"(?!\*{8}|<[\w-]+>|\{[\w.]+\}|\$\{?\w+\}?|%s)([^\s'\",;(){}\[\]]{8,})(?![\w(\[.])")
MIN_LENGTH = 4  # shorter values are not searched for (they would mask ordinary words)

_known: set[str] = set()
_lock = threading.Lock()


def secret_name(name: str) -> bool:
    """A key or variable whose value is a secret by its name."""
    return name not in NOT_SECRET and bool(SECRET_NAME.search(name))


def env_name_problem(name: str) -> str | None:
    """An engine `env` entry may not carry a secret: env values are printed by `render` and `show`."""
    if SECRET_NAME.search(name):
        return ("looks like a secret (its name ends in KEY, TOKEN, SECRET or PASSWORD): env values are printed "
                "by render and show; give the engine's key with `api_key_env` (the NAME of a control-node "
                "variable; it reaches the host only in a 0600 file)")
    return None


def _variants(value: str) -> set[str]:
    out = {value, value.strip(), json.dumps(value)[1:-1], repr(value)[1:-1],
           value.encode("unicode_escape").decode("ascii", "replace")}
    out |= {line.strip() for line in value.splitlines()}
    return {v for v in out if len(v) >= MIN_LENGTH and v != MASK}


def learn(*values: Any) -> None:
    """Remember secret values (None and short values are ignored): from now on `mask` replaces them."""
    with _lock:
        for value in values:
            if isinstance(value, str) and len(value.strip()) >= MIN_LENGTH:
                _known.update(_variants(value))


def forget() -> None:
    """Tests: start again from no known secret."""
    with _lock:
        _known.clear()


def _from_url(value: str) -> None:
    for match in URL_CREDENTIALS.finditer(value):
        user, _, password = match.group(2).partition(":")
        learn(urllib.parse.unquote(password) or urllib.parse.unquote(user))


def learn_data(data: dict[str, Any]) -> None:
    """Secrets in one host's data: values of keys named like secrets, passwords in URLs."""
    def walk(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(str(k), v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(key, v)
        elif isinstance(value, str):
            if secret_name(key):
                learn(value)
            _from_url(value)
    for key, value in data.items():
        walk(str(key), value)


def learn_inventory(result) -> None:
    """Every secret a resolved inventory points at: its hosts' data, and the control node's variables its API
    keys and hub token are named by (as the run will read them)."""
    for data in (getattr(result, "data", None) or {}).values():
        if isinstance(data, dict):
            learn_data(data)
    names = set()
    for plan in (getattr(result, "hosts", None) or {}).values():
        names.add(plan.hf_token_env)
        names |= {svc.api_key_env for svc in plan.services}
        for rp in getattr(plan, "routers", ()):
            names |= {rp.api_key_env, *rp.client_keys_env}  # the front door's clients' keys too
        for url in (plan.hf_endpoint, plan.model_source):
            if url:
                _from_url(url)
    learn(*(keys.from_env(name) for name in names))


def mask(text: str) -> str:
    """`text` with every known secret, URL credential and named secret value replaced by MASK."""
    if not text:
        return text
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        if secret in text:
            text = text.replace(secret, MASK)
    text = URL_CREDENTIALS.sub(lambda m: m.group(1) + MASK + "@", text)
    return NAMED_VALUE.sub(lambda m: m.group(1) + MASK, text)


def url(value: str | None) -> str | None:
    """A URL as it may be shown: credentials masked."""
    return mask(value) if value else value


def masked(value: Any, key: str = "") -> Any:
    """A structure (show's rows, render's JSON, a report) with secrets masked: a value under a key named like a
    secret entirely, every string through `mask`."""
    if isinstance(value, dict):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(v, key) for v in value]
    if isinstance(value, str):
        return MASK if secret_name(key) and value else mask(value)
    if secret_name(key) and value is not None and not isinstance(value, bool):
        return MASK
    return value


class MaskedStream:
    """A text stream whose writes go through `mask` (a line at a time, so a secret split across writes is
    still found); everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream
        self._pending = ""
        self._writing = threading.Lock()  # threads (fleet's per-host workers) share the stream

    def write(self, text):
        if not isinstance(text, str):
            return self._stream.write(text)  # bytes: the wrapped stream refuses them as it would have
        with self._writing:
            whole = self._pending + text
            head, sep, self._pending = whole.rpartition("\n")
            if sep:
                self._stream.write(mask(head + sep))
            if "\r" in self._pending or len(self._pending) > 4096:  # a progress line, or no newline coming
                self._stream.write(mask(self._pending))
                self._pending = ""
        return len(text)

    def flush(self):
        with self._writing:
            if self._pending:
                self._stream.write(mask(self._pending))
                self._pending = ""
        return self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _excepthook(kind, error, trace):
    sys.stderr.write(mask("".join(traceback.format_exception(kind, error, trace))))


@contextlib.contextmanager
def streams():
    """sys.stdout and sys.stderr masked while the block runs (the CLI's commands), and an uncaught exception's
    traceback (printed after the block ended) too."""
    sys.excepthook = _excepthook
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = MaskedStream(sys.stdout), MaskedStream(sys.stderr)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved


class _MaskedFile(MaskedStream):
    """A file written through `mask`, usable in `with` (special methods are looked up on the class)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.flush()
        self._stream.close()


DEBUG_LOG = "pyinfra-debug.log"


def _open_debug_log(file, mode="r", *args, **kwargs):
    """pyinfra's `open` in the module that writes DEBUG_LOG (an internal error's full traceback, in the working
    directory): that file is written masked and 0600, never through a symlink; anything else opens as usual."""
    if str(file).rpartition("/")[2] != DEBUG_LOG or "w" not in mode:
        return open(file, mode, *args, **kwargs)
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)  # a file left by an earlier run keeps its mode through O_TRUNC
    except OSError:
        return _MaskedFile(io.StringIO())  # a link or someone else's file there: the traceback is on stderr
    return _MaskedFile(os.fdopen(fd, "w", encoding="utf-8"))


def install() -> None:
    """For the rest of the process (pyinfra's run): its streams masked, an uncaught exception's traceback with
    them, and the traceback pyinfra writes to DEBUG_LOG on an internal error; sudo's password on stdin, never
    on a host's command line (modelfleet.base.sudo)."""
    # sudo loads pyinfra's connectors: only a pyinfra run installs it, the CLI and the checks' child do not
    from modelfleet.base import sudo

    sudo.install()
    sys.excepthook = _excepthook
    pyinfra_errors = sys.modules.get("pyinfra_cli.exceptions")
    if pyinfra_errors is not None:
        pyinfra_errors.open = _open_debug_log  # a module global shadows the builtin there
    if not isinstance(sys.stdout, MaskedStream):
        sys.stdout = MaskedStream(sys.stdout)
    if not isinstance(sys.stderr, MaskedStream):
        sys.stderr = MaskedStream(sys.stderr)
