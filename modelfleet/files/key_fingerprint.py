"""Check an apt repository's signing key against the fingerprints pinned for it, on the host, after the download
and before apt may trust it (python3's standard library only: a host has no gpg until the stack is built).

    python3 key_fingerprint.py FILE REPO FINGERPRINT...

FILE: the key as published (ASCII-armoured, or a binary keyring such as cuda-keyring's). Every primary key in it
must be pinned (a keyring that adds a second key is refused too). Exit 0 when so; else 1, with one line on
stderr naming the repository, the fingerprints expected and the ones found.

The fingerprint is OpenPGP's (RFC 4880 12.2 for v4: SHA-1 of 0x99, a two-octet length and the public key
packet's body; RFC 9580 5.5.4 for v6 and the v5 draft: SHA-256 with 0x9B / 0x9A and a four-octet length).
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys

PUBLIC_KEY = 6  # packet tag of a primary public key (14 is a subkey: apt checks with its primary's trust)


def dearmor(data: bytes) -> bytes:
    """ASCII armour's base64 body (headers and the CRC line dropped); binary data as it is."""
    text = data.decode("ascii", "replace")
    if "-----BEGIN PGP" not in text:
        return data
    out = b""
    for block in re.findall(r"-----BEGIN PGP [A-Z ]+-----\r?\n(.*?)-----END PGP", text, re.S):
        body = block.split("\n\n", 1)[-1] if re.match(r"^[A-Za-z-]+: ", block) else block
        lines = [line.strip() for line in body.splitlines() if line.strip() and not line.startswith("=")]
        out += base64.b64decode("".join(lines))
    return out


def packets(data: bytes):
    """(tag, body) of each OpenPGP packet, old and new formats."""
    i = 0
    while i < len(data):
        head = data[i]
        if not head & 0x80:
            raise ValueError(f"not OpenPGP data at byte {i}")
        if head & 0x40:  # new format
            tag, i = head & 0x3F, i + 1
            first = data[i]
            if first < 192:
                length, i = first, i + 1
            elif first < 224:
                length, i = ((first - 192) << 8) + data[i + 1] + 192, i + 2
            elif first == 255:
                length, i = int.from_bytes(data[i + 1:i + 5], "big"), i + 5
            else:
                raise ValueError("partial body lengths do not occur in keys")
        else:  # old format
            tag, kind, i = (head >> 2) & 0x0F, head & 0x03, i + 1
            if kind == 3:
                raise ValueError("indeterminate length does not occur in keys")
            size = (1, 2, 4)[kind]
            length, i = int.from_bytes(data[i:i + size], "big"), i + size
        yield tag, data[i:i + length]
        i += length


def fingerprint(body: bytes) -> str:
    version = body[0]
    if version == 4:
        return hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()
    if version in (5, 6):
        prefix = b"\x9a" if version == 5 else b"\x9b"
        return hashlib.sha256(prefix + len(body).to_bytes(4, "big") + body).hexdigest().upper()
    raise ValueError(f"OpenPGP key version {version} is not one apt accepts")


def fingerprints(data: bytes) -> list[str]:
    """The primary keys' fingerprints, in the order the file holds them."""
    return [fingerprint(body) for tag, body in packets(dearmor(data)) if tag == PUBLIC_KEY]


def main(argv: list[str]) -> int:
    path, repo, expected = argv[0], argv[1], [e.upper().replace(" ", "") for e in argv[2:]]
    try:
        with open(path, "rb") as f:
            found = fingerprints(f.read())
    except (OSError, ValueError, IndexError) as error:
        found, why = [], f"unreadable ({error})"
    else:
        why = "no key in it" if not found else None
    if found and expected and set(found) <= set(expected):
        return 0
    print(f"refused: the signing key of {repo} ({path}) is not the one pinned: expected "
          f"{', '.join(expected) or 'a pinned fingerprint (none is set)'}; found {why or ', '.join(found)}",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
