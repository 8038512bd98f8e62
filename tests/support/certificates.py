"""Client certificates of any shape, signed by a test CA with ``cryptography``.

trustme issues well-formed leaves only; the security suite also needs the shapes a careless
or hostile CA would sign: names with NUL or control characters, URI SANs, CA:TRUE, missing
or foreign extended key usages, several principals' names in one certificate.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLIENT_AUTH = (ExtendedKeyUsageOID.CLIENT_AUTH,)
VALIDITY = datetime.timedelta(days=1)


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclasses.dataclass(frozen=True)
class Leaf:
    """A certificate and its key, PEM."""

    cert: bytes
    key: bytes


@dataclasses.dataclass(frozen=True)
class Issuer:
    """A CA that signs whatever it is asked to (``issue``)."""

    certificate: x509.Certificate
    key: CertificateIssuerPrivateKeyTypes

    @classmethod
    def new(cls) -> Issuer:
        """A fresh self-signed CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - VALIDITY)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    @classmethod
    def load(cls, cert_pem: bytes, key_pem: bytes) -> Issuer:
        """The CA whose certificate and key are given (the pki fixture's)."""
        key = serialization.load_pem_private_key(key_pem, password=None)
        return cls(x509.load_pem_x509_certificate(cert_pem), key)  # type: ignore[arg-type]  # a CA's key signs

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM."""
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        *,
        dns: Sequence[str] = (),
        uris: Sequence[str] = (),
        ips: Sequence[str] = (),
        common_name: str | None = None,
        ca: bool | None = False,
        usages: Sequence[x509.ObjectIdentifier] | None = CLIENT_AUTH,
    ) -> Leaf:
        """A leaf with exactly these names and extensions.

        A SAN extension only when ``dns``, ``uris`` or ``ips`` name something; ``ca`` None:
        no BasicConstraints; ``usages`` None: no extended key usage.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name is not None else []
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - VALIDITY)
            .not_valid_after(now + VALIDITY)
        )
        names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
        names += [x509.UniformResourceIdentifier(uri) for uri in uris]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=not subject)
        if ca is not None:
            builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        if usages is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        return Leaf(certificate.public_bytes(serialization.Encoding.PEM), _pem(key))
