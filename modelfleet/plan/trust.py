"""Where trust starts: what may travel over plain HTTP, and the apt repositories' signing keys pinned by
fingerprint (catalog/signing_keys.yaml, checked on the host by files/key_fingerprint.py before apt trusts a key).

- The hub token never travels over plain HTTP: `hf_endpoint` is https://, loopback, or a host the site names in
  `insecure_http_hosts` (a trusted network of its own).
- A model that runs its own code (trust_remote_code) is fetched over https://, file:// or loopback only, whatever
  `insecure_http_hosts` says: nobody on the path may swap the code that runs.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import shlex
import urllib.parse
from pathlib import Path

import yaml

from modelfleet import FILES_DIR
from modelfleet.base import masking

CATALOG_FILE = Path(__file__).parent / "catalog" / "signing_keys.yaml"
CHECK_PROGRAM = FILES_DIR / "key_fingerprint.py"


@functools.cache  # read once per process: every host's plan asks (a YAML parse per host cost 9 ms)
def signing_keys() -> dict[str, dict]:
    """The catalog's pinned keys: repository -> {what, fingerprints, source}. Shared: never changed in place."""
    return yaml.safe_load(CATALOG_FILE.read_text())


# The repositories whose keys are pinned: catalog/signing_keys.yaml's entries (an OS family's own keys, e.g. the
# CUDA repository's rpm key, are entries of their own there).
REPOSITORIES = tuple(signing_keys())


def _host(url: str) -> tuple[str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return (parts.hostname or "").lower(), parts.port


def plain_http(url: str | None) -> bool:
    return bool(url) and urllib.parse.urlsplit(url).scheme == "http"


def loopback(url: str) -> bool:
    host = _host(url)[0]
    with contextlib.suppress(ValueError):
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    return False


def http_host(entry: str) -> tuple[str, int | None]:
    """An `insecure_http_hosts` entry as (host, port or None), compared as URLs' hosts are: lower case, an IPv6
    address in its one written form, with or without brackets (`[fe80::1]:8080`, `FE80::1`)."""
    entry = entry.strip()
    host, port = entry, None
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    elif entry.count(":") == 1:
        host, _, tail = entry.partition(":")
        port = int(tail) if tail.isdigit() else None
    with contextlib.suppress(ValueError):
        host = ipaddress.ip_address(host).compressed
    return host.lower().rstrip("."), port


def listed(url: str, insecure: tuple[str, ...] | list[str]) -> bool:
    """The URL's host (or host:port) is one the site named as reachable over plain HTTP (case-insensitive; IPv6
    in any notation)."""
    host, port = _host(url)
    with contextlib.suppress(ValueError):
        host = ipaddress.ip_address(host).compressed
    host = host.rstrip(".")
    return any(h == host and (p is None or p == port) for h, p in map(http_host, insecure))


def transport_problems(hf_endpoint: str, model_source: str | None, token_env: str, code_models: list[str],
                       insecure: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """(field, reason) for each way a token or a model's code would cross the network in clear. `code_models`:
    the models of the host's services that run their own code."""
    out = []
    if plain_http(hf_endpoint) and not loopback(hf_endpoint) and not listed(hf_endpoint, insecure):
        out.append(("hf_endpoint", f"{masking.url(hf_endpoint)} is plain HTTP: the hub token ({token_env}) would "
                                   "travel in clear; use https://, or name the host in insecure_http_hosts if "
                                   "the network to it is the site's own (loopback always may)"))
    source, fld = (model_source, "model_source") if model_source else (hf_endpoint, "hf_endpoint")
    if code_models and plain_http(source) and not loopback(source):
        out.append((fld, f"{', '.join(sorted(set(code_models)))} runs its own code (trust_remote_code): it is "
                         f"never fetched over plain HTTP ({masking.url(source)}), insecure_http_hosts "
                         "notwithstanding; use https://, file:// or a mirror on the host's loopback"))
    return out


def pinned(site: dict[str, list[str]] | None = None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each repository's fingerprints: the site's own (`repo_key_fingerprints`) where it names them, else the
    catalog's. A tuple of pairs, so a plan holding it stays hashable."""
    catalog = signing_keys()
    site = site or {}
    return tuple((repo, tuple(f.upper() for f in (site.get(repo) or catalog.get(repo, {}).get("fingerprints")
                                                    or ()))) for repo in REPOSITORIES)


def expected(pins: tuple[tuple[str, tuple[str, ...]], ...], repo: str) -> tuple[str, ...]:
    return dict(pins).get(repo, ())


def check_command(path: str, repo: str, fingerprints: tuple[str, ...]) -> str:
    """The host's check of the key at `path` (python3 and the program's text: one command, nothing uploaded);
    exit 1, naming repo, expected and found, when it is not pinned."""
    return " ".join(["python3", "-c", shlex.quote(CHECK_PROGRAM.read_text()), shlex.quote(path), shlex.quote(repo),
                     *map(shlex.quote, fingerprints)])
