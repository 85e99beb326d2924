"""What a value may look like before it reaches a unit file, an env file, a YAML config, a path or a command
line on a host. Each rule returns None when the value fits, else the reason (which never repeats a value that
may be a secret). The inventory schema applies them field by field; the renderer applies `no_control` again to
everything it writes, so no value can ever add a line to a rendered file."""

from __future__ import annotations

import ipaddress
import re

from pydantic import AfterValidator

# C0 and C1 controls, the Unicode line and paragraph separators (str.splitlines and some logs break there) and
# the bidirectional overrides (text that reads otherwise than it runs).
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")  # pools, groups: they become unit and file names
SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")  # may be a hub id (org/model)
# Branches, tags and commits as git allows them, minus what could leave a directory: no `..`, no leading
# `/` or `-`, no empty component.
REVISION = re.compile(r"^(?!-)(?!/)(?!.*\.\.)(?!.*//)(?!.*/$)[A-Za-z0-9._/+-]{1,128}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
SECRET_VAR = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")  # a control-node variable holding a secret
INTERFACES = re.compile(r"^[\^=]?[A-Za-z0-9_.:@-]{1,15}(,[A-Za-z0-9_.:@-]{1,15})*$")  # NCCL/Gloo lists
IB_HCA = re.compile(r"^[\^=]?[A-Za-z0-9_.-]+(:[0-9]+)?(,[A-Za-z0-9_.-]+(:[0-9]+)?)*$")
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                      r"[A-Za-z0-9])?)*\.?$")
# Docker's reference grammar (github.com/distribution/reference), with a tag or digest required.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# A first component is a registry only with a dot, a port or as localhost (else it is a lower-case path).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = (rf"(?:localhost(?::[0-9]+)?|{_LABEL}(?:\.{_LABEL})+(?::[0-9]+)?|{_LABEL}:[0-9]+"
           r"|\[[0-9a-fA-F:]+\](?::[0-9]+)?)")
IMAGE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
                   rf"(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
PATH_CHARS = re.compile(r"^/[A-Za-z0-9_.@+/-]*$")
DEVICE = re.compile(r"^/dev/[A-Za-z0-9_./-]+$")
# Tokens pasted where a variable's name belongs: refused without being printed.
TOKEN_LIKE = re.compile(r"^(hf_|sk-|ghp_|xox|eyJ)|[a-z].*[0-9].*[A-Z]|[A-Z].*[0-9].*[a-z]")


def no_control(value: str) -> str | None:
    return "contains a control character (newline, tab, NUL...): it would add lines to a rendered file" \
        if CONTROL.search(value) else None


def printable(text: str) -> str:
    """Text for a report line: a control character shown escaped (`\\n`), never acted on by a terminal or a log."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def matches(pattern: re.Pattern, what: str):
    def rule(value: str) -> str | None:
        return no_control(value) or (None if pattern.match(value) else f"is not a valid {what}")
    return rule


name = matches(NAME, "name (letters, digits, . _ -; at most 63; it becomes unit and file names)")
served_name = matches(SERVED_NAME, "served name (letters, digits, . _ : / -)")
revision = matches(REVISION, "revision (a branch, tag or 40-hex commit; no `..`, no leading `/` or `-`)")
env_name = matches(ENV_NAME, "environment variable name")
interfaces = matches(INTERFACES, "interface list (e.g. eth0, ^lo,docker0, =ib0)")
ib_hca = matches(IB_HCA, "HCA list (e.g. mlx5_0:1,mlx5_1)")
device = matches(DEVICE, "device path under /dev/")


def env_value(value: str) -> str | None:
    return no_control(value)


# The kinds of value every door shares (inventory, group_data, --data, services, catalog and site files): each
# a rule returning the reason a value does not fit, or None.
VERSION = re.compile(r"^(v?[0-9]+(\.[0-9]+){0,3}([.+-][A-Za-z0-9]+)*|b[0-9]+)$")  # 0.34.0, v1.2-rc1, b11669
DRIVER = re.compile(r"^[0-9]{3}(\.[0-9]{1,3}){0,2}$")  # an NVIDIA branch (580) or release (580.95.05)
RELATIVE_FILE = re.compile(r"^(?![-/])[A-Za-z0-9_.*?\[\]+@=-]+(/[A-Za-z0-9_.*?\[\]+@=-]+)*$")
# a Debian package[=version]; {branch}: the driver branch
PACKAGE = re.compile(r"^[a-z0-9]([a-z0-9+.-]|{branch}){0,127}(=[A-Za-z0-9.+:~-]{1,64})?$")
HUB_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
FLAG = re.compile(r"^--?[A-Za-z][A-Za-z0-9_.-]*$")
VISIBLE_DEVICES = re.compile(r"^[A-Z_]*VISIBLE_DEVICES$")  # CUDA_, HIP_, ROCR_, NVIDIA_VISIBLE_DEVICES...


def single_line(value: str) -> str | None:
    """Free text that still reaches a file or a log line (a recipe's source, notes): one line, bounded."""
    return no_control(value) or (None if len(value) <= 4000 else "is longer than 4000 characters")


version = matches(VERSION, "version (e.g. 0.34.0, v1.2.3, b11669)")
driver = matches(DRIVER, "driver branch or release (e.g. 580 or 580.95.05)")
package = matches(PACKAGE, "package name (lower case letters, digits, + . -; optionally =version)")
hub_repo = matches(HUB_REPO, "hub repository (org/name)")
flag = matches(FLAG, "flag (--name or -n)")


def flag_value(value) -> str | None:
    """The value of a flag modelfleet writes after it (a recipe parameter): one argument, never read as a flag."""
    text = str(value)
    if no_control(text):
        return no_control(text)
    if flag_name(text) is not None:
        return "starts with `-`: the engine's parser would read it as a flag"
    return None


def relative_file(value: str) -> str | None:
    """A file inside the checkpoint's revision folder (glob characters allowed): never out of it."""
    if no_control(value):
        return no_control(value)
    if not RELATIVE_FILE.match(value):
        return "must be a relative path inside the revision's folder (letters, digits, _ . - + @ = and globs)"
    if any(part in (".", "..") for part in value.split("/")):
        return "may not contain `.` or `..` components: it must stay inside the revision's folder"
    return None


def env_entry(name_: str) -> str | None:
    """An engine environment variable modelfleet does not own: the GPUs a container sees are modelfleet's."""
    if VISIBLE_DEVICES.match(name_):
        return f"{name_} would contradict the GPUs modelfleet hands the container: set `gpu_indices` instead"
    return env_name(name_)


def checked(rule):
    """A pydantic validator from a rule: its reason becomes the error, the value is never echoed."""

    def check(value):
        reason = rule(value)
        if reason:
            raise ValueError(reason)
        return value

    return AfterValidator(check)


def secret_variable(value: str) -> str | None:
    """The *name* of a control-node variable; a value that looks like the secret itself is not echoed."""
    if SECRET_VAR.match(value):
        return None
    if TOKEN_LIKE.search(value) or len(value) > 40:
        return "looks like a secret, not a variable name (value not shown): give the NAME of the variable " \
               "that holds it"
    return "is not an environment variable name (upper case letters, digits and _)"


def image(value: str) -> str | None:
    if no_control(value):
        return no_control(value)
    if not IMAGE.match(value):
        return "is not an image reference (registry/repository:tag or @sha256:<64 hex>)"
    last = value.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in value:
        return "has no tag or digest: pin it (e.g. :v0.34.0 or @sha256:...)"
    if "@" in value and not DIGEST.search(value):
        return "has a malformed digest (want @sha256: and 64 lower-case hex digits)"
    return None


def address(value: str) -> str | None:
    """An IP address (what binds and rendezvous need)."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        return "is not an IP address"


def host_address(value: str) -> str | None:
    """What SSH connects to: an IP address or a DNS name."""
    if address(value) is None or (HOSTNAME.match(value) and not CONTROL.search(value)):
        return None
    return "is neither an IP address nor a host name"


# The rule of owned_directory, in names.
SYSTEM_TREES = ("bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin", "sys", "usr",
                "var", "snap", "lost+found")
# A directory of modelfleet's own in a system tree: /etc/modelfleet, /etc/modelfleet-prod, /var/lib/modelfleet_b...
OWN_HOME = re.compile(r"^/(etc|var/lib)/modelfleet([-_.][A-Za-z0-9][A-Za-z0-9_.-]*)?(/|$)")
FHS_TOPS = ("home", "media", "mnt", "opt", "root", "srv", "tmp")
# Emptied at boot (often a tmpfs) and writable by every user: never a home for checkpoints or secrets.
TEMP_TREES = ("/tmp", "/var/tmp", "/dev/shm")
VENDOR_TREES = re.compile(r"^/opt/(rocm|amdgpu|nvidia)[^/]*(/|$)")


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def owned_directory(value: str) -> str | None:
    """
    An absolute, normalised path modelfleet may take over (mkdir, chown, chmod 0700, a filesystem mounted on
    it, revisions pruned in it): never a system directory, at any depth. The rule, in full (FHS 3.0 names):
    - refused with everything below them: the system trees /bin /boot /dev /etc /lib /lib32 /lib64 /libx32
      /proc /run /sbin /sys /usr /var /snap /lost+found, except directories of modelfleet's own there
      (/etc/modelfleet, /etc/modelfleet-prod, /var/lib/modelfleet_b..., and what is below them); the
      temporary trees /tmp, /var/tmp, /dev/shm and their first level (any user may make /tmp/x first; all of
      it is emptied at boot: deeper, validate warns);
    - refused themselves: the FHS top levels /, /home, /media, /mnt, /opt, /root, /srv, /tmp (a directory below
      them is a site's own), and the hidden directories of /root with what is below them (/root/.ssh); the
      GPU vendors' trees /opt/rocm*, /opt/amdgpu*, /opt/nvidia* with what is below them;
    - refused with everything below them: a user's home (/home/NAME/...): an ordinary user owns it, and may
      swap what is in it for a symlink root would follow;
    - anything else is a site's own directory, a top level included (/data, /models, /nvme0, /raid0, /scratch).
    At run time the stages still take over only a directory modelfleet made (operations.files.directory).
    """
    if no_control(value):
        return no_control(value)
    if not value.startswith("/"):
        return "must be an absolute path"
    if not PATH_CHARS.match(value):
        return "may hold only letters, digits and . _ @ + - / (it goes into unit files and shell commands)"
    parts = [p for p in value.split("/") if p]
    if any(p in (".", "..") for p in parts) or "//" in value:
        return "must be normalised (no `.`, `..` or `//`)"
    cleaned = "/" + "/".join(parts)
    why = _system_directory(cleaned, parts)
    if why is None:
        return None
    mine = cleaned.rstrip("/") + "/modelfleet"
    example = mine if _system_directory(mine, parts + ["modelfleet"]) is None and not temporary(cleaned) \
        else "/srv/models, /etc/modelfleet"
    return f"{cleaned} {why}: modelfleet would chown, chmod or mount over it; name a directory of its own " \
           f"(e.g. {example})"


def temporary(path: str) -> str | None:
    """The temporary tree a path is in (deeper than its first level it passes owned_directory, with a warning:
    a CI clone's lab lives there)."""
    return next((top for top in TEMP_TREES if _inside(path, top)), None)


def _system_directory(path: str, parts: list[str]) -> str | None:
    temp = temporary(path)
    if temp and len(parts) - len(temp.strip("/").split("/")) <= 1:
        return f"is {temp} or directly in it: any user may make or replace it first, and it is emptied at boot"
    if not parts or (parts[0] in SYSTEM_TREES and not OWN_HOME.match(path)):
        return "is a system directory" if len(parts) < 2 else f"is inside the system directory /{parts[0]}"
    if len(parts) == 1 and parts[0] in FHS_TOPS:
        return "is a system directory"
    if parts[0] == "home" and len(parts) == 2:
        return "is a user's home directory"
    if parts[0] == "home":  # its owner may swap what is in it for a symlink that root would then follow
        return f"is inside /home/{parts[1]}, a directory an ordinary user owns"
    home_depth = 1 if parts[0] == "root" else 0
    if home_depth and len(parts) > home_depth and parts[home_depth].startswith("."):
        return f"is inside the hidden directory /{'/'.join(parts[:home_depth + 1])} of a home"
    if VENDOR_TREES.match(path):
        return "is inside a GPU vendor's tree under /opt"
    return None


def slug(text: str, sep: str = "_") -> str:
    """A name made safe for a file or unit name: every run of other characters becomes `sep`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", sep, text)


def flag_name(token: str) -> str | None:
    """`--port=8000` -> `--port`; None for values."""
    if not token.startswith("-") or token == "-" or re.match(r"^-[0-9.]", token):
        return None
    return token.split("=", 1)[0]
