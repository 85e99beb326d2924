"""A private key made at test time (openssl), so no key-looking text is committed."""

import subprocess


def private_key() -> str:
    return subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519"], check=True, capture_output=True,
                          text=True).stdout
