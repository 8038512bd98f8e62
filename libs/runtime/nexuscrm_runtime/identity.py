"""Who a client certificate names: its identities, read from the verified certificate itself.

The TLS layer verified the chain; this module reads the leaf certificate it hands over (PEM
from gRPC's auth context, DER from an HTTPS socket) with ``cryptography`` and decides which
names it may speak for. grpcio's own ``peer_identities()`` is not used: it returns C strings
that end at the first NUL byte, so a certificate for ``ops.internal<NUL>.acme.example`` (which a
CA that checks only a name's suffix would issue to acme) read as ``ops.internal``.

Rules (docs/security.md):

- only end-entity certificates for client authentication: ``CA:TRUE`` is refused, and so
  is a certificate without an extended key usage or whose EKU lacks ``clientAuth``;
- identities are typed: dNSName SANs are ``dns:`` identities, URI SANs ``uri:`` ones, and a
  policy entry matches only its own kind; other SAN types (IP addresses, e-mail) name no
  principal;
- the subject's common name counts (as a ``dns:`` identity) only when the certificate has no
  SAN extension at all, and there must be exactly one;
- any name that is empty or holds a NUL, control, format or other non-printable character
  refuses the whole certificate: it cannot be compared with what an operator wrote.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import TypeVar

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from workqueue.errors import DomainError, ErrorKind

_Extension = TypeVar("_Extension", bound=x509.ExtensionType)
PARSED_CACHE = 1024  # certificates: parsing costs ~0.1 ms, and a client reuses its certificate


class IdentityKind(enum.StrEnum):
    """The kind of name an identity is; a policy entry matches only its own kind."""

    DNS = "dns"
    URI = "uri"


class CertificateRefused(DomainError):
    """The verified certificate may not speak for any principal (the message says why)."""

    kind = ErrorKind.PERMISSION_DENIED


@dataclasses.dataclass(frozen=True, order=True)
class Identity:
    """One typed name: ``dns:ops.example`` or ``uri:spiffe://example/ops``."""

    kind: IdentityKind
    value: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"

    @classmethod
    def parse(cls, text: str) -> Identity:
        """A policy entry: ``dns:NAME``, ``uri:URI`` or a bare NAME (a dNSName); ``ValueError`` if unusable."""
        kind, separator, value = text.partition(":")
        if separator and kind in IdentityKind.__members__.values():
            identity = cls(IdentityKind(kind), value)
        else:
            identity = cls(IdentityKind.DNS, text)
        check_printable(identity.value, f"identity {text!r}")
        return identity


def check_printable(name: str, what: str) -> None:
    """Refuse an empty name or one with NUL, control, format or other non-printable characters."""
    if not name or not name.isprintable():
        raise ValueError(f"{what} is empty or holds a NUL, control or non-printable character")


def _extension(certificate: x509.Certificate, kind: type[_Extension]) -> _Extension | None:
    try:
        return certificate.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


def _identities(certificate: x509.Certificate) -> tuple[Identity, ...]:
    constraints = _extension(certificate, x509.BasicConstraints)
    if constraints is not None and constraints.ca:
        raise CertificateRefused("the client certificate is a CA certificate (CA:TRUE)")
    usage = _extension(certificate, x509.ExtendedKeyUsage)
    if usage is None or ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        raise CertificateRefused("the client certificate is not for client authentication (no clientAuth EKU)")
    names = _extension(certificate, x509.SubjectAlternativeName)
    if names is None:
        common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        if len(common_names) != 1:
            raise CertificateRefused("the client certificate has no SAN and not exactly one common name")
        identities = [Identity(IdentityKind.DNS, str(common_names[0].value))]
    else:
        identities = [Identity(IdentityKind.DNS, value) for value in names.get_values_for_type(x509.DNSName)]
        identities += [
            Identity(IdentityKind.URI, value) for value in names.get_values_for_type(x509.UniformResourceIdentifier)
        ]
    for identity in identities:
        try:
            check_printable(identity.value, f"a {identity.kind} name of the client certificate")
        except ValueError as error:
            raise CertificateRefused(str(error)) from None
    return tuple(sorted(set(identities)))


@functools.lru_cache(maxsize=PARSED_CACHE)
def certificate_identities(encoded: bytes) -> tuple[Identity, ...]:
    """The identities of a verified leaf certificate (PEM or DER); ``CertificateRefused`` says why none.

    Identities are cached by the certificate's bytes (refusals are not: they are rare).
    """
    try:
        if encoded.lstrip().startswith(b"-----BEGIN"):
            certificate = x509.load_pem_x509_certificate(encoded)
        else:
            certificate = x509.load_der_x509_certificate(encoded)
        return _identities(certificate)
    except CertificateRefused:
        raise
    except ValueError:  # cryptography parses extensions lazily: a malformed one surfaces here
        raise CertificateRefused("the client certificate could not be parsed") from None
