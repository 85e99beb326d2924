"""A private key made at test time (openssl), so no key-looking text is committed."""

import subprocess


def private_key() -> str:
    return subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519"], check=True, capture_output=True,
                          text=True).stdout


def certificate(folder, names=("DNS:door.lab", "IP:10.0.0.1"), days=(-1, 90), key=None, name="door"):
    """A self-signed certificate for `names` (DNS:/IP: entries) valid from days[0] to days[1] around now, and its
    key (or `key`, another's), written as NAME.crt and NAME.key (0600) in `folder`: (cert path, key path)."""
    import datetime
    import ipaddress
    import os
    from pathlib import Path

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    own = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    entries = [x509.IPAddress(ipaddress.ip_address(n[3:])) if n.startswith("IP:") else x509.DNSName(n[4:])
               for n in names]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "door.lab")])
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(own.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now + datetime.timedelta(days=days[0]))
               .not_valid_after(now + datetime.timedelta(days=days[1])))
    if entries:
        builder = builder.add_extension(x509.SubjectAlternativeName(entries), critical=False)
    cert = builder.sign(own, hashes.SHA256())
    cert_path, key_path = Path(folder) / f"{name}.crt", Path(folder) / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key if key is not None else own.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()).decode()
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(pem)
    return cert_path, key_path
