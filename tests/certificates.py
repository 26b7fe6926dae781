"""Certificates made by openssl for the TLS tests: a CA and certificates it signs."""

from __future__ import annotations

import os
from pathlib import Path


def make_ca(tmp: Path, name: str) -> tuple[str, str]:
    """A self-signed CA made by openssl: (key file, certificate file)."""
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.pem", "-days", "2", "-subj", f"/CN={name}"], check=True,
                   capture_output=True)
    return f"{tmp}/{name}.key", f"{tmp}/{name}.pem"


def make_cert(tmp: Path, name: str, ca: tuple[str, str], san: str = "IP:127.0.0.1") -> tuple[str, str]:
    """A certificate for ``san`` signed by ``ca`` (from :func:`make_ca`): (certificate, key)."""
    import subprocess

    ca_key, ca_crt = ca
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{tmp}/{name}.key",
                    "-out", f"{tmp}/{name}.csr", "-subj", f"/CN={name}", "-addext", f"subjectAltName={san}"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", f"{tmp}/{name}.csr", "-CA", ca_crt, "-CAkey", ca_key,
                    "-CAcreateserial", "-out", f"{tmp}/{name}.pem", "-days", "2", "-copy_extensions", "copy"],
                   check=True, capture_output=True)
    os.chmod(f"{tmp}/{name}.key", 0o600)
    return f"{tmp}/{name}.pem", f"{tmp}/{name}.key"
