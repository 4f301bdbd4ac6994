"""Throwaway certificates for tests and benchmarks, made with the ``openssl`` command line.

::

    from tidelog.broker.testing_tls import TestPki

    pki = TestPki.create(tmp_path)                 # a CA, a server certificate for
    settings = pki.broker_settings("SASL_SSL")     # localhost/127.0.0.1, a client one
    client = pki.client_settings("SASL_SSL")       # kafka-python names for the client

Keys are EC P-256 (fast to make). ``issue`` makes more: other names, an expired one
(``days=-1``), one from another CA (``TestPki.create`` again). Not for production: the CA
key sits next to the certificates without protection.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TestPki"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True, slots=True)
class TestPki:
    """A CA and certificates in ``directory``. Immutable; build with ``create``."""

    __test__ = False  # not a pytest class

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def create(cls, directory: str | Path, name: str = "ca") -> TestPki:
        """A new CA ``name`` in ``directory`` with a server (``localhost``, 127.0.0.1)
        and a client (``CN=alice,O=Tidelog``) certificate, valid for two days."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        ca_key, ca_cert = root / f"{name}.key", root / f"{name}.pem"
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "2",
            "-subj", f"/CN=Tidelog test {name}", cwd=root,
        )  # fmt: skip
        pki = cls(root, ca_cert, ca_key, root / "x", root / "x", root / "x", root / "x")
        server_cert, server_key = pki.issue(f"{name}-server", "/CN=localhost", server=True)
        client_cert, client_key = pki.issue(f"{name}-client", "/O=Tidelog/CN=alice")
        return cls(root, ca_cert, ca_key, server_cert, server_key, client_cert, client_key)

    def issue(
        self, stem: str, subject: str, *, server: bool = False, days: int = 2
    ) -> tuple[Path, Path]:
        """(certificate, key) signed by this CA; ``days`` -1 makes an expired one."""
        key, csr, cert = (self.directory / f"{stem}.{s}" for s in ("key", "csr", "pem"))
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", subject, cwd=self.directory,
        )  # fmt: skip
        args = [
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert), "-CAkey",
            str(self.ca_key), "-CAcreateserial", "-out", str(cert), "-days", str(days),
        ]  # fmt: skip
        if server:
            ext = self.directory / f"{stem}.ext"
            ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
            args += ["-extfile", str(ext)]
        _openssl(*args, cwd=self.directory)
        return cert, key

    def broker_settings(self, protocol: str = "SSL", client_auth: str = "none") -> dict[str, str]:
        """Broker settings for ``protocol`` with this PKI's server certificate."""
        return {
            "security.protocol": protocol,
            "ssl.certfile": str(self.server_cert),
            "ssl.keyfile": str(self.server_key),
            "ssl.cafile": str(self.ca_cert),
            "ssl.client.auth": client_auth,
        }

    def client_settings(
        self, protocol: str = "SSL", *, certificate: bool = False
    ) -> dict[str, str]:
        """Client settings (kafka-python names) trusting this CA; ``certificate``: present
        the client certificate (mutual TLS)."""
        out = {"security_protocol": protocol, "ssl_cafile": str(self.ca_cert)}
        if certificate:
            out["ssl_certfile"] = str(self.client_cert)
            out["ssl_keyfile"] = str(self.client_key)
        return out
