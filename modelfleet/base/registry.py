"""Resolve an image tag to its manifest digest on the control node (Docker Registry HTTP API v2).

The digest is pinned once per run here and every host pulls and runs `repo@sha256:...`, so hosts of a pool
can never run different builds of a moving tag.

Credentials come from Docker's own `config.json` on the control node, found as Docker finds it
(`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`): the registry's credential helper
(`credHelpers`, else `credsStore`), else its `auths` entry (`auth`: base64 `user:password`, or an
`identitytoken`). They answer the registry's challenge: Basic directly, Bearer through the token service its
`WWW-Authenticate` names (realm, service, scope). Without credentials the anonymous token is asked for.
Credentials are only ever sent over HTTPS, or to loopback and to registries the site names in
`insecure_registries`; they are never part of a message, a log line or an argv.

Registries are reached over HTTPS, except loopback ones (as Docker does) and those the site names in
`insecure_registries` (plain HTTP).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from modelfleet.base import runscope
from modelfleet.base.errors import ModelfleetError

DOCKER_HUB = "registry-1.docker.io"
# How Docker's config.json names Docker Hub (`docker login` writes the first).
DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", DOCKER_HUB)
ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
TIMEOUT_S = 30
HELPER_TIMEOUT_S = 30


class RegistryError(ModelfleetError):
    pass


@dataclass(frozen=True)
class Credentials:
    """What config.json holds for one registry (never printed: the repr names only where it came from)."""

    username: str | None = None
    password: str | None = None
    identity_token: str | None = None
    origin: str = ""  # "config.json auths" or "credential helper docker-credential-X", for messages

    def __repr__(self) -> str:
        return f"Credentials(from {self.origin})"

    __str__ = __repr__


def split_reference(image: str) -> tuple[str, str, str]:
    """'vllm/vllm-openai:v1' -> ('registry-1.docker.io', 'vllm/vllm-openai', 'v1')."""
    ref = image.partition("@")[0]
    name, tag = ref, "latest"
    if ":" in ref.rsplit("/", 1)[-1]:
        name, _, tag = ref.rpartition(":")
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        registry, repo = name.split("/", 1)
    else:
        registry, repo = DOCKER_HUB, name if "/" in name else f"library/{name}"
    return registry, repo, tag


def _host_of(netloc: str) -> str:
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0]
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def _loopback(netloc: str) -> bool:
    host = _host_of(netloc)
    return host in ("localhost", "::1") or host.startswith("127.")


def plain_http_allowed(netloc: str, insecure: frozenset[str] = frozenset()) -> bool:
    """Loopback (as Docker allows), and what the site names in `insecure_registries` (exactly host[:port])."""
    return _loopback(netloc) or netloc in insecure


def scheme(registry: str, insecure: frozenset[str] = frozenset()) -> str:
    return "http" if plain_http_allowed(registry, insecure) else "https"


def base_url(registry: str, insecure: frozenset[str] = frozenset()) -> str:
    """The registry's API root, as digest pinning reaches it."""
    return f"{scheme(registry, insecure)}://{registry}/v2/"


def insecure_of(hosts_data) -> frozenset[str]:
    """The registries any host names in `insecure_registries` (one site-wide set: the control node pins for
    all hosts at once), from each host's data."""
    return frozenset(r for data in hosts_data for r in (data.get("insecure_registries") or ()))


def site_insecure() -> frozenset[str]:
    """Inside a pyinfra run: insecure_of the inventory's hosts (checked against the schema before the run
    connects), read once per run. Empty outside a run."""
    state = runscope.current()
    if state is None or getattr(state, "inventory", None) is None:
        return frozenset()
    return runscope.slot("insecure registries", lambda: insecure_of(host.data for host in state.inventory))


# --- Docker's config.json -------------------------------------------------------------------------------------

def docker_config_path() -> Path:
    """Where Docker reads its client configuration: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`."""
    folder = os.environ.get("DOCKER_CONFIG")
    return Path(folder).expanduser() / "config.json" if folder else Path("~/.docker/config.json").expanduser()


def _server_key(key: str) -> str:
    """An `auths` / `credHelpers` key as a registry name: `https://reg:5000/v1/` -> `reg:5000`."""
    if key in DOCKER_HUB_KEYS:
        return DOCKER_HUB
    netloc = urllib.parse.urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]
    return DOCKER_HUB if netloc in DOCKER_HUB_KEYS else netloc


def _helper_server(registry: str) -> str:
    """The server name a credential helper was given at `docker login` time."""
    return DOCKER_HUB_KEYS[0] if registry == DOCKER_HUB else registry


def _from_helper(helper: str, registry: str) -> Credentials | None:
    """`docker-credential-<helper> get`, the server on stdin, the secret on stdout (never argv)."""
    program = f"docker-credential-{helper}"
    try:
        run = subprocess.run([program, "get"], input=_helper_server(registry), capture_output=True, text=True,
                             timeout=HELPER_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RegistryError(f"{registry}: Docker's config names the credential helper {program}, which could "
                            f"not run ({type(error).__name__}); install it or fix config.json") from None
    if run.returncode != 0:
        return None  # "credentials not found in native keychain": no credentials for this registry
    try:
        answer = json.loads(run.stdout)
    except ValueError:
        raise RegistryError(f"{registry}: {program} answered something that is not JSON") from None
    user, secret = answer.get("Username") or None, answer.get("Secret") or None
    if not secret:
        return None
    origin = f"credential helper {program}"
    if user == "<token>":
        return Credentials(identity_token=secret, origin=origin)
    return Credentials(username=user, password=secret, origin=origin)


def _from_auths(entry: dict, path: Path) -> Credentials | None:
    origin = f"{path} auths"
    if entry.get("identitytoken"):
        return Credentials(identity_token=entry["identitytoken"], origin=origin)
    if entry.get("auth"):
        try:
            user, sep, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise RegistryError(f"{path}: an `auth` entry is not base64 of user:password") from None
        if not sep:
            raise RegistryError(f"{path}: an `auth` entry is not base64 of user:password")
        return Credentials(username=user, password=password, origin=origin)
    if entry.get("username") and entry.get("password"):
        return Credentials(username=entry["username"], password=entry["password"], origin=origin)
    return None


def credentials(registry: str, path: Path | None = None) -> Credentials | None:
    """This registry's credentials from Docker's config.json, as `docker pull` on this machine would use them."""
    path = path or docker_config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise RegistryError(f"cannot read Docker's config {path}: {type(error).__name__}") from None
    if not isinstance(config, dict):
        raise RegistryError(f"Docker's config {path} is not a JSON object")
    helpers = {_server_key(k): v for k, v in (config.get("credHelpers") or {}).items()}
    if registry in helpers:
        return _from_helper(helpers[registry], registry)
    if config.get("credsStore"):
        found = _from_helper(config["credsStore"], registry)
        if found:
            return found
    auths = {_server_key(k): v for k, v in (config.get("auths") or {}).items() if isinstance(v, dict)}
    return _from_auths(auths[registry], path) if registry in auths else None


# --- the registry's challenge -----------------------------------------------------------------------------------

def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="https://auth/token",service="reg",scope="repository:x:pull"` -> ('bearer', {...})."""
    kind, _, rest = header.strip().partition(" ")
    return kind.lower(), {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}


def _basic(creds: Credentials) -> str:
    return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()


def _may_send(url: str, insecure: frozenset[str]) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and plain_http_allowed(parts.netloc, insecure))


def _bearer_token(registry: str, params: dict, repo: str, creds: Credentials | None,
                  insecure: frozenset[str]) -> str:
    realm = params.get("realm")
    if not realm or urllib.parse.urlsplit(realm).scheme not in ("http", "https"):
        raise RegistryError(f"{registry}: its Bearer challenge names no token service (realm)")
    scope = params.get("scope") or f"repository:{repo}:pull"
    fields = {**({"service": params["service"]} if params.get("service") else {}), "scope": scope}
    if creds and not _may_send(realm, insecure):
        raise RegistryError(f"{registry}: its token service {realm} is not HTTPS; credentials are not sent over "
                            "plain HTTP (name its host:port in insecure_registries to allow it)")
    if creds and creds.identity_token:  # OAuth2 refresh token, as `docker login` stores for some registries
        body = urllib.parse.urlencode({**fields, "grant_type": "refresh_token", "client_id": "modelfleet",
                                       "refresh_token": creds.identity_token}).encode()
        req = urllib.request.Request(realm, data=body, method="POST")
        req.add_unredirected_header("Content-Type", "application/x-www-form-urlencoded")
    else:
        req = urllib.request.Request(f"{realm}{'&' if '?' in realm else '?'}{urllib.parse.urlencode(fields)}")
        if creds:
            req.add_unredirected_header("Authorization", _basic(creds))  # never follows a redirect elsewhere
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise RegistryError(
                f"{registry}: its token service {realm} refused "
                + (f"the credentials from {creds.origin} (HTTP {exc.code}): check `docker login {registry}` on "
                   "the control node" if creds else
                   f"an anonymous token (HTTP {exc.code}): `docker login {registry}` on the control node "
                   f"(credentials go to {docker_config_path()})")) from None
        raise RegistryError(f"{registry}: its token service {realm} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RegistryError(f"{registry}: cannot get a token from {realm}: {type(exc).__name__}") from None
    token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    if not token:
        raise RegistryError(f"{registry}: its token service {realm} sent no token")
    return f"Bearer {token}"


def _answer(registry: str, challenge: str, repo: str, insecure: frozenset[str], config: Path) -> str:
    """The Authorization value answering the registry's 401 challenge."""
    kind, params = parse_challenge(challenge)
    creds = credentials(registry, config)
    if kind == "bearer":
        return _bearer_token(registry, params, repo, creds, insecure)
    if kind == "basic":
        if not creds or not creds.username:
            raise RegistryError(f"{registry} asks for a login and {config} holds none for it: "
                                f"`docker login {registry}` on the control node")
        return _basic(creds)
    raise RegistryError(f"{registry}: unsupported authentication scheme {kind or '(none)'!r}")


def _resolve(image: str, insecure: frozenset[str], config: Path) -> str:
    registry, repo, tag = split_reference(image)
    url = f"{base_url(registry, insecure)}{repo}/manifests/{tag}"
    authorization = None
    for _attempt in range(2):
        req = urllib.request.Request(url, method="HEAD", headers={"Accept": ACCEPT})
        if authorization:
            if not _may_send(url, insecure):
                raise RegistryError(f"{image}: {registry} is not HTTPS; credentials are not sent over plain HTTP")
            req.add_unredirected_header("Authorization", authorization)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                digest = resp.headers.get("Docker-Content-Digest")
                if not digest:
                    raise RegistryError(f"{image}: registry sent no Docker-Content-Digest")
                return digest
        except urllib.error.HTTPError as exc:
            challenge = exc.headers.get("WWW-Authenticate", "")
            if exc.code == 401 and challenge and authorization is None:
                authorization = _answer(registry, challenge, repo, insecure, config)
                continue
            if exc.code == 401:
                raise RegistryError(f"{image}: {url} refused the credentials (HTTP 401): check `docker login "
                                    f"{registry}` on the control node") from None
            raise RegistryError(f"{image}: {url} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            hint = "" if scheme(registry, insecure) == "http" else (
                " (a plain-HTTP registry must be named in insecure_registries)")
            raise RegistryError(f"{image}: cannot reach {registry} over {scheme(registry, insecure).upper()}: "
                                f"{type(reason).__name__}: {reason}{hint}") from None
    raise RegistryError(f"{image}: {registry} refused the token it issued")


def resolve_digest(image: str, insecure: frozenset[str] | None = None) -> str:
    """The manifest digest of `image`'s tag; `insecure`: plain-HTTP registries (default: the run's inventory's)."""
    if "@sha256:" in image:
        return image.split("@", 1)[1]
    key = (image, frozenset(site_insecure() if insecure is None else insecure), docker_config_path())
    known = runscope.slot("digests", dict)  # once per run: every host of a pool names the same images
    if key not in known:
        known[key] = _resolve(*key)
    return known[key]


def pinned(image: str, insecure: frozenset[str] | None = None) -> str:
    """The image reference with its digest: 'repo:tag@sha256:...'."""
    if "@sha256:" in image:
        return image
    return f"{image}@{resolve_digest(image, insecure)}"
