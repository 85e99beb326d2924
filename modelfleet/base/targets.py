"""Which machine a host argument reaches, worked out the way pyinfra's SSH connector would reach it, before
anything connects: the argument as pyinfra reads it (`@ssh/NAME`, `@local`, a bare name), the name through the
SSH config's `HostName` (pyinfra's own reader of ~/.ssh/config), then getaddrinfo, as paramiko connects. Two
spellings of one machine (`127.1`, `0x7f000001`, `2130706433`, `[::1]`, `0:0::1`, `GPU1.example.com.`, an SSH
alias) end on the same address, so a destructive command (`modelfleet retire`) compares addresses and names with
those of every host the inventory still serves, and refuses a match naming that host.

Text alone cannot prove two arguments differ: an inventory host's name that resolves now is compared by its
addresses, and one that does not resolve by its name's text (lower case, no trailing dot, no brackets)."""

from __future__ import annotations

import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyinfra.connectors.sshuserclient.client import get_ssh_config

from modelfleet.base.errors import ModelfleetError

# pyinfra's local connector: commands run on this machine.
LOCAL = "@local"
LOOPBACK = frozenset({"127.0.0.1", "::1"})


class TargetError(ModelfleetError, ValueError):
    """A host argument that is not one host as retire reaches it (the message says which and why)."""


@dataclass(frozen=True)
class Target:
    """One host argument: as typed, the one spelling handed to pyinfra, and what it reaches (names compared as
    text, addresses as getaddrinfo gives them). `unresolved`: why nothing would be reached (then nothing is)."""

    given: str
    pyinfra: str
    names: frozenset[str]
    addresses: frozenset[str] = field(default_factory=frozenset)
    unresolved: str | None = None


def canonical_ip(text: str) -> str | None:
    """The address `text` spells, in one notation (IPv4 dotted quad, IPv6 compressed, an IPv4-mapped IPv6 as
    IPv4, no zone), or None when it is not an address. IPv4 is read as inet_aton reads it (as getaddrinfo does):
    `127.1`, `0x7f000001`, `2130706433` and `0177.0.0.1` are 127.0.0.1."""
    text = text.strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        if not text or not all(c.isalnum() or c == "." for c in text):
            return None
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip)


def canonical_name(text: str) -> str:
    """A host name or address as compared: an address in one notation, a name in lower case without its
    trailing dot (DNS names are case-blind and `name.` is `name` fully qualified)."""
    return canonical_ip(text) or text.strip("[]").rstrip(".").lower()


def ssh_hostname(name: str, config_file: str | None = None) -> str:
    """Where pyinfra's SSH connector connects for `name`: the SSH config's HostName for it (pyinfra's own
    reader: ~/.ssh/config, or `config_file`), else `name`."""
    config = get_ssh_config(config_file)
    return (config.lookup(name).get("hostname") if config else None) or name


def addresses(name: str) -> frozenset[str]:
    """Every address getaddrinfo gives for `name` (paramiko tries them in turn), in canonical notation; raises
    socket.gaierror when it gives none."""
    ip = canonical_ip(name)
    if ip:
        return _loopback_pair(frozenset({ip}))
    infos = socket.getaddrinfo(name.strip("[]"), None, type=socket.SOCK_STREAM)
    return _loopback_pair(frozenset(filter(None, (canonical_ip(str(info[4][0])) for info in infos))))


def _loopback_pair(found: frozenset[str]) -> frozenset[str]:
    """127.0.0.1 and ::1 are both this machine's `localhost` (one sshd on the wildcard answers both)."""
    return found | LOOPBACK if found & LOOPBACK else found


def _maybe(name: str) -> frozenset[str]:
    try:
        return addresses(name)
    except (OSError, UnicodeError):
        return frozenset()


def local_addresses() -> frozenset[str]:
    """What `@local` is, as addresses: loopback and this machine's own name's addresses (an SSH host on one of
    them is this machine too)."""
    return LOOPBACK | _maybe("localhost") | _maybe(socket.gethostname())


def parse(given: str) -> str:
    """The host part of one host argument (LOCAL for `@local`), or TargetError saying why it is not one host
    that retire reaches (over SSH or @local)."""
    if not given or given != given.strip() or any(c.isspace() or ord(c) < 32 for c in given):
        raise TargetError(f"{given!r}: a host argument is one name or address, without spaces")
    if "," in given:
        raise TargetError(f"{given!r} is a list (pyinfra splits it at the commas): give each host as an argument "
                          "of its own")
    if given == LOCAL:
        return LOCAL
    if given.startswith("@"):
        connector, _, rest = given[1:].partition("/")
        if connector != "ssh" or not rest:
            raise TargetError(f"{given!r}: retire reaches a host over SSH (HOST or @ssh/HOST) or @local, not "
                              f"through @{connector}")
        given = rest
    if "@" in given:
        raise TargetError(f"{given!r}: give the SSH user with --ssh-user, not in the host argument")
    if "/" in given:
        raise TargetError(f"{given!r} looks like a path (pyinfra reads a file as an inventory of hosts): give a "
                          "host name or address")
    host = given[1:-1] if given.startswith("[") and given.endswith("]") else given
    if ":" in host and not canonical_ip(host):
        raise TargetError(f"{given!r}: give the SSH port with --ssh-port, not in the host argument")
    return host


def target(given: str) -> Target:
    """One host argument, checked (TargetError) and resolved as pyinfra would connect to it."""
    host = parse(given)
    if host == LOCAL:
        return Target(given, LOCAL, frozenset({LOCAL}), local_addresses())
    connects_to = ssh_hostname(host)
    names = frozenset({canonical_name(host), canonical_name(connects_to)})
    try:
        found = addresses(connects_to)
    except (OSError, UnicodeError) as error:
        why = f"{connects_to} does not resolve ({getattr(error, 'strerror', None) or error})"
        return Target(given, f"@ssh/{host}", names, unresolved=why)
    return Target(given, f"@ssh/{host}", names, found)


def served(result) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Every host the inventory holds -> (its names as compared, the addresses it is reached at): its name, its
    ssh_hostname, the SSH config's HostName for that (its own ssh_config_file too), and what each resolves to.
    The names resolve at once (threads), so a slow resolver costs one timeout, not one per host."""
    names, asked = {}, set()
    for name in dict.fromkeys([*result.hosts, *result.data]):
        data = result.data.get(name) or {}
        if name == LOCAL:
            names[name] = (frozenset({LOCAL}), ())
            continue
        bare = name.removeprefix("@ssh/")
        address = str(data.get("ssh_hostname") or getattr(result.hosts.get(name), "address", "") or bare)
        connects_to = ssh_hostname(address, data.get("ssh_config_file"))
        names[name] = (frozenset(canonical_name(n) for n in (bare, address, connects_to)), (connects_to, bare))
        asked |= {connects_to, bare}
    with ThreadPoolExecutor(max_workers=min(32, len(asked) or 1)) as pool:
        found = dict(zip(asked, pool.map(_maybe, asked), strict=True))
    return {name: (texts, local_addresses() if name == LOCAL else frozenset().union(*(found[n] for n in looked)))
            for name, (texts, looked) in names.items()}


def still_served(result, targets: list[Target]) -> list[str]:
    """A line for each target that reaches a host the inventory still serves, naming that host and what matched."""
    hosts = served(result)
    out = []
    for t in targets:
        for name, (names, reached) in hosts.items():
            same = sorted(t.names & names) or sorted(t.addresses & reached)
            if same:
                how = "its name" if t.names & names else "its address"
                out.append(f"{t.given} reaches host {name} of the inventory ({how} {', '.join(same)}): take it out "
                           "of the inventory first (a converge retires what the inventory no longer names on the "
                           "hosts it still holds)")
                break
        else:
            # A served host that resolves to nothing now could be the very address given: nothing is proved.
            blind = sorted(name for name, (_, reached) in hosts.items()
                           if not reached and (name.startswith("@ssh/") or not name.startswith("@")))
            if blind:
                out.append(f"{t.given}: host(s) {', '.join(blind)} of the inventory do not resolve now, so retire "
                           f"cannot prove {t.given} is none of them: make them resolve, or take them out of the "
                           "inventory, then retire again")
    return out


def same_machine(targets: list[Target]) -> list[str]:
    """A line for each target that reaches a machine an earlier one reaches (pyinfra would run on it twice at
    once)."""
    out = []
    for i, t in enumerate(targets):
        for earlier in targets[:i]:
            same = sorted(t.names & earlier.names) or sorted(t.addresses & earlier.addresses)
            if same:
                out.append(f"{t.given} and {earlier.given} reach the same host ({', '.join(same)}): give it once")
                break
    return out
