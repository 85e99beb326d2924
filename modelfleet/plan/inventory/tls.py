"""A front door's certificate and key, checked on the control node as a client (and nginx) would: both PEM, the
key unencrypted and the certificate's own, the certificate valid now and its names (subjectAltName) covering
the name clients use, the key file private to its owner. Neither file's contents is ever shown."""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization

# `--strict` refuses (validate warns) a certificate that expires within this many days.
EXPIRY_WARNING_DAYS = 30

# Key formats nginx (OpenSSL's PEM reader, no passphrase) cannot start with, by their PEM header.
FOREIGN_KEYS = (
    ("BEGIN OPENSSH PRIVATE KEY", "an OpenSSH private key (ssh-keygen's own format), which nginx cannot read: give "
                                  "the PEM key the certificate was issued for (openssl genpkey / pkey)"),
    ("PuTTY-User-Key-File", "a PuTTY key, which nginx cannot read: give the PEM key the certificate was issued for"),
    ("BEGIN ENCRYPTED PRIVATE KEY", "encrypted (PKCS#8 with a passphrase): nginx would stop at start asking for "
                                    "it; give it decrypted (`openssl pkey -in KEY -out PLAIN`, mode 0600)"),
    ("Proc-Type: 4,ENCRYPTED", "encrypted (a PEM passphrase): nginx would stop at start asking for it; give it "
                               "decrypted (`openssl pkey -in KEY -out PLAIN`, mode 0600)"),
)


def _file_problems(path: str, secret: bool) -> str | None:
    """A key readable or writable by others, a certificate others may replace, or either owned by someone else
    than the user running modelfleet (or root)."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    loose = info.st_mode & (0o077 if secret else 0o022)
    if loose:
        what = "readable or writable by group or others" if secret else "writable by group or others"
        return f"is {what} (mode {stat.S_IMODE(info.st_mode):04o}): chmod {'600' if secret else '644'} it"
    if info.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {info.st_uid}, neither the user running modelfleet (uid {os.geteuid()}) nor root"
    return None


def _covers(certificate, name: str) -> bool:
    """The certificate's subjectAltName covers `name` as a client checks it (RFC 6125: a DNS name, `*` only as
    the whole leftmost label, matching one label; an IP address only by an IP entry; the CN is not read)."""
    # cryptography's x509 (about 12 ms to import) loads only for a front door that speaks TLS
    from cryptography import x509

    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if address is not None:
        return address in names.get_values_for_type(x509.IPAddress)
    wanted = name.rstrip(".").lower().split(".")
    for pattern in names.get_values_for_type(x509.DNSName):
        labels = pattern.rstrip(".").lower().split(".")
        if len(labels) != len(wanted):
            continue
        if labels == wanted or (labels[0] == "*" and len(labels) > 2 and labels[1:] == wanted[1:]):
            return True
    return False


def _load_key(text: str):
    """The private key, or the reason it cannot serve."""
    for marker, reason in FOREIGN_KEYS:
        if marker in text:
            return None, reason
    try:
        return serialization.load_pem_private_key(text.encode(), password=None), None
    except TypeError:
        return None, "encrypted: nginx would stop at start asking for its passphrase; give it decrypted"
    except (ValueError, Exception):  # noqa: BLE001  (cryptography raises several kinds for a bad key)
        return None, "not a PEM private key (contents not shown)"


def _public(value) -> bytes:
    return value.public_key().public_bytes(serialization.Encoding.DER,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)


def problems(cert: str, key: str, name: str, now: datetime.datetime | None = None,
             ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(errors, warnings) as (field, reason) for a certificate chain file `cert` and its key file `key`, for
    clients that reach the front door as `name`."""
    # cryptography's x509 (about 12 ms to import) loads only for a front door that speaks TLS
    from cryptography import x509

    errors: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    texts = {}
    for fld, path, secret in (("router_tls_cert", cert, False), ("router_tls_key", key, True)):
        try:
            texts[fld] = Path(path).read_text(errors="replace")
            loose = _file_problems(path, secret)
        except OSError as error:
            errors.append((fld, f"{path}: cannot be read on the control node ({error.strerror})"))
            continue
        if loose:
            errors.append((fld, f"{path}: {loose}"))
    leaf = private = None
    if "router_tls_cert" in texts:
        try:
            leaf = x509.load_pem_x509_certificates(texts["router_tls_cert"].encode())[0]
        except ValueError:
            errors.append(("router_tls_cert", f"{cert}: not a PEM certificate (contents not shown)"))
    if "router_tls_key" in texts:
        private, why = _load_key(texts["router_tls_key"])
        if why:
            errors.append(("router_tls_key", f"{key}: {why}"))
    if leaf is None:
        return errors, warnings
    if private is not None and _public(leaf) != _public(private):
        errors.append(("router_tls_key", f"{key}: is not the key of {cert} (their public keys differ): nginx "
                                         "refuses the pair; give the key the certificate was issued for"))
    now = now or datetime.datetime.now(datetime.timezone.utc)
    start, end = leaf.not_valid_before_utc, leaf.not_valid_after_utc
    if now < start:
        errors.append(("router_tls_cert", f"{cert}: not valid before {start:%Y-%m-%d %H:%M} UTC: clients refuse it"))
    elif now > end:
        errors.append(("router_tls_cert", f"{cert}: expired on {end:%Y-%m-%d %H:%M} UTC: clients refuse it"))
    elif end - now < datetime.timedelta(days=EXPIRY_WARNING_DAYS):
        warnings.append(("router_tls_cert", f"{cert}: expires on {end:%Y-%m-%d} UTC, within "
                                            f"{EXPIRY_WARNING_DAYS} days: renew it"))
    if not _covers(leaf, name):
        errors.append(("router_server_name", f"{name}: not among the names of {cert} (its subjectAltName): "
                                             "clients that check the name refuse the front door; set "
                                             "router_server_name to a name it covers, or issue one for it"))
    return errors, warnings
