"""Identities read from the certificate itself: each class generated, not only the known instances.

Certificates are built by a CA that signs anything (``tests.support.certificates``), then
read by ``nexuscrm_runtime.identity`` and looked up in a policy, as the authorization
interceptor does after the handshake (the handshake itself: ``test_endpoints.py``).
Classes: name encodings (any non-printable character anywhere, in any kind of name), SAN
kinds (dNSName, URI, IP; the common name only without SANs), CA flags and extended key
usages, and certificates naming two principals.
"""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexuscrm_runtime.authorization import PermissionDenied, Policy
from nexuscrm_runtime.identity import CertificateRefused, Identity, IdentityKind, certificate_identities
from tests.support.certificates import Issuer

ISSUER = Issuer.new()
CASES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LABEL = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
DNS_NAME = st.lists(LABEL, min_size=1, max_size=4).map(".".join)
URI = DNS_NAME.map(lambda host: f"spiffe://{host}/workload")
# Every character str.isprintable() refuses, in the ranges a DNS/URI SAN (ASCII) or a CN (UTF-8) can hold.
ASCII_CONTROL = st.sampled_from([chr(c) for c in (*range(0x20), 0x7F)])
UNICODE_UNPRINTABLE = st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Co", "Cn"], exclude_characters="\ud800")
EKUS = [
    ExtendedKeyUsageOID.CLIENT_AUTH,
    ExtendedKeyUsageOID.SERVER_AUTH,
    ExtendedKeyUsageOID.CODE_SIGNING,
    ExtendedKeyUsageOID.EMAIL_PROTECTION,
    ExtendedKeyUsageOID.TIME_STAMPING,
    ExtendedKeyUsageOID.OCSP_SIGNING,
    ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE,
]
USAGES = st.lists(st.sampled_from(EKUS), min_size=1, unique=True)  # an empty EKU is malformed DER (refused too)


def _policy(*entries: tuple[str, list[str]]) -> Policy:
    principals = [
        {"name": name, "certificate_identities": identities, "namespaces": [name]} for name, identities in entries
    ]
    return Policy.parse({"principals": principals}, "test policy")


def _spliced(name: str, bad: str, at: int) -> str:
    at %= len(name) + 1
    return name[:at] + bad + name[at:]


@CASES
@given(name=DNS_NAME, bad=ASCII_CONTROL, at=st.integers(min_value=0), kind=st.sampled_from(["dns", "uri", "cn"]))
def test_a_name_with_a_control_character_refuses_the_certificate(name: str, bad: str, at: int, kind: str) -> None:
    spliced = _spliced(name, bad, at)
    leaf = {
        "dns": lambda: ISSUER.issue(dns=[name, spliced]),
        "uri": lambda: ISSUER.issue(dns=[name], uris=[f"spiffe://{spliced}"]),
        "cn": lambda: ISSUER.issue(common_name=spliced),
    }[kind]()
    with pytest.raises(CertificateRefused, match="NUL, control or non-printable"):
        certificate_identities(leaf.cert)


@CASES
@given(name=DNS_NAME, bad=UNICODE_UNPRINTABLE, at=st.integers(min_value=0))
def test_a_common_name_with_any_unprintable_character_refuses_the_certificate(name: str, bad: str, at: int) -> None:
    leaf = ISSUER.issue(common_name=_spliced(name, bad, at))
    with pytest.raises(CertificateRefused, match="NUL, control or non-printable"):
        certificate_identities(leaf.cert)


def test_the_null_prefix_certificate_is_not_the_operator() -> None:
    """The instance the hostile tenant used: grpcio's peer_identities() read it as the operator."""
    policy = _policy(("operator", ["ops.nexuscrm.internal"]), ("acme", ["acme.example"]))
    for leaf in (
        ISSUER.issue(dns=["ops.nexuscrm.internal\0.acme.example"]),
        ISSUER.issue(common_name="ops.nexuscrm.internal\0.acme.example"),
    ):
        with pytest.raises(CertificateRefused):
            policy.for_certificate(leaf.cert)


@CASES
@given(dns=st.lists(DNS_NAME, max_size=3, unique=True), uris=st.lists(URI, max_size=3, unique=True))
def test_san_kinds_are_kept_apart(dns: list[str], uris: list[str]) -> None:
    leaf = ISSUER.issue(dns=dns, uris=uris, ips=["127.0.0.1"], common_name="cn.example")
    identities = certificate_identities(leaf.cert)
    expected = {Identity(IdentityKind.DNS, n) for n in dns} | {Identity(IdentityKind.URI, u) for u in uris}
    assert set(identities) == expected  # the IP SAN names nobody, and the CN does not count beside SANs
    for name in dns:  # a policy naming the same text as a URI does not match the dNSName, and back
        assert _policy(("p", [f"uri:{name}"])).for_certificate(leaf.cert) is None
        assert _policy(("p", [name])).for_certificate(leaf.cert) is not None
    for uri in uris:
        assert _policy(("p", [uri])).for_certificate(leaf.cert) is None
        assert _policy(("p", [f"dns:{uri}"])).for_certificate(leaf.cert) is None
        assert _policy(("p", [f"uri:{uri}"])).for_certificate(leaf.cert) is not None


@CASES
@given(name=DNS_NAME, san=st.sampled_from(["dns", "uri", "ip"]))
def test_the_common_name_counts_only_without_a_san(name: str, san: str) -> None:
    policy = _policy(("p", [name]))
    assert policy.for_certificate(ISSUER.issue(common_name=name).cert) is not None
    other = {"dns": {"dns": ["other.example"]}, "uri": {"uris": ["spiffe://other"]}, "ip": {"ips": ["10.0.0.1"]}}[san]
    assert policy.for_certificate(ISSUER.issue(common_name=name, **other).cert) is None  # type: ignore[arg-type]


def test_no_san_and_no_single_common_name_names_nobody() -> None:
    with pytest.raises(CertificateRefused, match="not exactly one common name"):
        certificate_identities(ISSUER.issue().cert)


@CASES
@given(ca=st.sampled_from([None, False, True]), usages=st.none() | USAGES)
def test_only_end_entity_certificates_for_client_authentication_are_accepted(
    ca: bool | None, usages: list[x509.ObjectIdentifier] | None
) -> None:
    leaf = ISSUER.issue(dns=["acme.example"], ca=ca, usages=usages)
    policy = _policy(("acme", ["acme.example"]))
    if ca is True:
        with pytest.raises(CertificateRefused, match="CA:TRUE"):
            policy.for_certificate(leaf.cert)
    elif usages is None or ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        with pytest.raises(CertificateRefused, match="clientAuth"):
            policy.for_certificate(leaf.cert)
    else:
        principal = policy.for_certificate(leaf.cert)
        assert principal is not None and principal.name == "acme"


@CASES
@given(first=st.sampled_from(["dns", "uri"]), second=st.sampled_from(["dns", "uri"]), swap=st.booleans())
def test_a_certificate_naming_two_principals_is_refused_in_any_order(first: str, second: str, swap: bool) -> None:
    names = {"dns": ("acme.example", "ops.example"), "uri": ("spiffe://acme", "spiffe://ops")}
    acme, ops = names[first][0], names[second][1]
    policy = _policy(("acme", [f"{first}:{acme}"]), ("operator", [f"{second}:{ops}"]))
    listed = [(first, acme), (second, ops)][:: -1 if swap else 1]
    leaf = ISSUER.issue(
        dns=[value for kind, value in listed if kind == "dns"], uris=[value for kind, value in listed if kind == "uri"]
    )
    with pytest.raises(PermissionDenied, match="more than one principal"):
        policy.for_certificate(leaf.cert)
    # Two identities of the same principal are one caller.
    assert _policy(("acme", [f"{first}:{acme}", f"{second}:{ops}"])).for_certificate(leaf.cert) is not None


@pytest.mark.parametrize("entry", ["ops\0.acme", "uri:spiffe://x\n", "dns:", "tab\there"])
def test_a_policy_identity_that_cannot_be_compared_is_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="NUL, control or non-printable"):
        _policy(("p", [entry]))


def test_der_and_pem_read_alike() -> None:
    leaf = ISSUER.issue(dns=["acme.example"], uris=["spiffe://acme"])
    der = x509.load_pem_x509_certificate(leaf.cert).public_bytes(serialization.Encoding.DER)
    assert certificate_identities(der) == certificate_identities(leaf.cert)


def test_garbage_is_refused_not_raised() -> None:
    with pytest.raises(CertificateRefused, match="could not be parsed"):
        certificate_identities(b"\x30\x03\x02\x01\x01")
