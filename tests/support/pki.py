"""An offline certificate authority for the security tests (trustme), and the policy they run under.

Principals: ``services`` (the servers' own certificate, every namespace), ``acme`` and
``globex`` (one namespace each), ``operator`` (every namespace, plus a dashboard token) and
``stranger`` (signed by the CA, unknown to the policy). ``impostor`` carries acme's identity
but is signed by another CA.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import trustme

from nexuscrm_runtime.authorization import Policy, token_digest
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.tls import TlsFiles
from tests.support.certificates import Issuer, Leaf

NAMESPACES = {"services": ["*"], "acme": ["acme"], "globex": ["globex"], "operator": ["*"]}
TOKENS = {"operator": "operator-token-8f3c", "acme": "acme-token-51d0"}


def identity(name: str) -> str:
    """The certificate identity (DNS subject alternative name) of principal ``name``."""
    return f"{name}.nexuscrm.test"


@dataclasses.dataclass(frozen=True)
class Pki:
    """Where the CA bundle, each principal's certificate and key, and the policy were written."""

    directory: Path

    def env(self, name: str) -> dict[str, str]:
        """The NEXUSCRM_TLS_* variables of principal ``name``."""
        return {
            "NEXUSCRM_TLS_CA": str(self.directory / "ca.pem"),
            "NEXUSCRM_TLS_CERT": str(self.directory / f"{name}.pem"),
            "NEXUSCRM_TLS_KEY": str(self.directory / f"{name}.key"),
        }

    def server_env(self) -> dict[str, str]:
        """What a service needs to run with security: its certificate and the policy."""
        return {**self.env("services"), "NEXUSCRM_AUTHZ_POLICY": str(self.policy_path)}

    def tls(self, name: str) -> TlsFiles:
        """Principal ``name``'s certificate files, loaded."""
        files = TlsFiles.from_env(self.env(name))
        assert files is not None
        return files

    @property
    def policy_path(self) -> Path:
        """The policy file."""
        return self.directory / "policy.json"

    def security(self) -> Security:
        """The servers' ``Security``."""
        return Security(self.tls("services"), Policy.load(str(self.policy_path)))

    def issuer(self) -> Issuer:
        """The CA, to sign certificates of any shape (``certificates``)."""
        return Issuer.load((self.directory / "ca.pem").read_bytes(), (self.directory / "ca.key").read_bytes())

    def tls_of(self, leaf: Leaf, name: str) -> TlsFiles:
        """Client files presenting ``leaf`` (written under ``name``), trusting this CA."""
        (self.directory / f"{name}.pem").write_bytes(leaf.cert)
        (self.directory / f"{name}.key").write_bytes(leaf.key)
        return self.tls(name)


def _write_leaf(directory: Path, name: str, ca: trustme.CA, *identities: str) -> None:
    leaf = ca.issue_cert(*identities, common_name=identities[0])
    (directory / f"{name}.pem").write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    (directory / f"{name}.key").write_bytes(leaf.private_key_pem.bytes())


def make_pki(directory: Path) -> Pki:
    """Create the CA, the certificates and the policy under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    (directory / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (directory / "ca.key").write_bytes(ca.private_key_pem.bytes())
    _write_leaf(directory, "services", ca, identity("services"), "127.0.0.1", "localhost")
    for name in ("acme", "globex", "operator", "stranger"):
        _write_leaf(directory, name, ca, identity(name))
    _write_leaf(directory, "impostor", trustme.CA(), identity("acme"))
    policy = {
        "principals": [
            {
                "name": name,
                "certificate_identities": [identity(name)],
                "namespaces": namespaces,
                "token_sha256": [token_digest(TOKENS[name])] if name in TOKENS else [],
            }
            for name, namespaces in NAMESPACES.items()
        ]
    }
    (directory / "policy.json").write_text(json.dumps(policy))
    return Pki(directory)
