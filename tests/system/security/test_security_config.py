"""Security configuration: half a configuration, bad files and unguarded RPCs are refused at start."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_runtime.authorization import Policy, token_digest
from nexuscrm_runtime.config import ConfigError
from nexuscrm_runtime.identity import Identity
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.server import create_server
from nexuscrm_runtime.tls import TlsFiles
from tests.support.pki import Pki

INVARIANTS_NOT_CHECKED = "bad security configurations are refused at start: no RPC reaches the database"


def _set_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in ("NEXUSCRM_TLS_CA", "NEXUSCRM_TLS_CERT", "NEXUSCRM_TLS_KEY", "NEXUSCRM_AUTHZ_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_no_settings_mean_plaintext_without_authorization(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_env(monkeypatch, {})
    assert Security.from_env() is None


def test_both_settings_load(monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    _set_env(monkeypatch, pki.server_env())
    security = Security.from_env()
    assert security is not None
    principal = security.policy.for_identities([Identity.parse("acme.nexuscrm.test")])
    assert principal is not None and principal.namespaces == {"acme"}


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("NEXUSCRM_TLS_KEY", "NEXUSCRM_TLS_KEY must be set too"),
        ("NEXUSCRM_AUTHZ_POLICY", "mutual TLS needs an authorization policy"),
    ],
)
def test_half_a_configuration_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, pki: Pki, drop: str, message: str
) -> None:
    _set_env(monkeypatch, {name: value for name, value in pki.server_env().items() if name != drop})
    with pytest.raises(ConfigError, match=message):
        Security.from_env()


def test_a_policy_without_tls_is_refused(monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    _set_env(monkeypatch, {"NEXUSCRM_AUTHZ_POLICY": str(pki.policy_path)})
    with pytest.raises(ConfigError, match="needs mutual TLS"):
        Security.from_env()


def test_unreadable_or_non_pem_files_are_named(tmp_path: Path, pki: Pki) -> None:
    env = pki.env("acme")
    with pytest.raises(ConfigError, match="NEXUSCRM_TLS_CA names a file that cannot be read"):
        TlsFiles.from_env({**env, "NEXUSCRM_TLS_CA": str(tmp_path / "missing.pem")})
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="NEXUSCRM_TLS_CERT names a file that is not PEM"):
        TlsFiles.from_env({**env, "NEXUSCRM_TLS_CERT": str(tmp_path / "junk.pem")})


def test_tls_files_never_print_their_contents(pki: Pki) -> None:
    files = pki.tls("acme")
    assert "PRIVATE KEY" not in repr(files) and "PRIVATE KEY" not in str(files)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "non-empty 'principals' list"),
        ({"principals": [{"namespaces": ["a"]}]}, r"principals\[0\]: name must be"),
        ({"principals": [{"name": "a", "namespaces": []}]}, "namespaces must not be empty"),
        ({"principals": [{"name": "a", "namespaces": ["a"], "certificate_identities": "x"}]}, "list of non-empty"),
        (
            {
                "principals": [
                    {"name": "a", "namespaces": ["a"], "certificate_identities": ["x"]},
                    {"name": "b", "namespaces": ["b"], "certificate_identities": ["x"]},
                ]
            },
            "certificate identity 'x' already belongs to a",
        ),
        ({"principals": [{"name": "a", "namespaces": ["a"]}, {"name": "a", "namespaces": ["b"]}]}, "unique"),
    ],
)
def test_a_malformed_policy_names_the_entry(document: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Policy.parse(document, "policy.json")


def test_a_policy_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text("{principals: nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Policy.load(str(tmp_path / "policy.json"))


def test_tokens_are_matched_by_digest_only() -> None:
    policy = Policy.parse(
        {"principals": [{"name": "ops", "namespaces": ["*"], "token_sha256": [token_digest("s3cret")]}]}, "p"
    )
    principal = policy.for_token("s3cret")
    assert principal is not None and principal.spans_namespaces
    assert policy.for_token(token_digest("s3cret")) is None


def test_a_server_with_security_refuses_to_start_with_an_unguarded_rpc(engine: sa.Engine, pki: Pki) -> None:
    guarded = registration(Connectors(engine))
    rules = dict(guarded.rules)
    del rules["/nexuscrm.connectors.v1.ConnectorsService/Replay"]
    with pytest.raises(ValueError, match="ConnectorsService/Replay"):
        create_server([dataclasses.replace(guarded, rules=rules)], "127.0.0.1:0", security=pki.security())
