"""Who may call what: callers are principals with namespaces, and every RPC has a rule.

The policy is a JSON file named by ``NEXUSCRM_AUTHZ_POLICY`` (docs/security.md)::

    {"principals": [
      {"name": "acme-connector", "certificate_identities": ["acme-connector.nexuscrm.internal"],
       "namespaces": ["acme"]},
      {"name": "operator", "certificate_identities": ["ops.nexuscrm.internal"],
       "token_sha256": ["<hex sha256 of the dashboard token>"], "namespaces": ["*"]}
    ]}

A gRPC caller is the principal whose ``certificate_identities`` holds an identity of the
client certificate the mutual TLS handshake verified (``tls``), read from the certificate
itself (``identity``: ``dns:NAME`` or a bare NAME match dNSName SANs, ``uri:URI`` URI SANs);
a certificate whose identities belong to two principals is refused. Nothing in a request
names the caller, and no refusal quotes a principal's name (it is the operator's label, not
the caller's business). ``token_sha256`` lets the dashboard's HTTP callers authenticate with a bearer
token; only its digest is stored. Namespace ``*`` grants every namespace and the operations
that span namespaces (schema changes, lists over all packs).

Each service gives the interceptor one ``Rule`` per RPC. A rule resolves the namespace of
what the request touches from the database (a pack, a WorkId, a fence; these never move
between namespaces, so checking before the handler runs is not a race) and refuses with
PERMISSION_DENIED, or NOT_FOUND where the caller names a row of another namespace (the same
answer as for a row that does not exist, so ids of other tenants cannot be probed). An RPC
without a rule is refused: a new RPC cannot ship unguarded.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc

from nexuscrm_runtime.config import ConfigError
from nexuscrm_runtime.identity import CertificateRefused, Identity, certificate_identities
from nexuscrm_runtime.metrics import wrap_rpc_handler
from workqueue.errors import DomainError, ErrorKind, InvalidArgument

log = logging.getLogger(__name__)
_Key = TypeVar("_Key", Identity, str)
ALL_NAMESPACES = "*"
POLICY_VARIABLE = "NEXUSCRM_AUTHZ_POLICY"
# Health checks and reflection need a verified certificate (mutual TLS) but no principal.
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/")


class PermissionDenied(DomainError):
    """The caller is known but may not do this."""

    kind = ErrorKind.PERMISSION_DENIED


class NotVisible(DomainError):
    """The named row does not exist or belongs to a namespace the caller may not see."""

    kind = ErrorKind.NOT_FOUND


@dataclasses.dataclass(frozen=True)
class Principal:
    """A caller and the namespaces it may act in (``*``: all of them)."""

    name: str
    namespaces: frozenset[str]

    @property
    def spans_namespaces(self) -> bool:
        """True when it may act in every namespace."""
        return ALL_NAMESPACES in self.namespaces

    def may_act_in(self, namespace: str) -> bool:
        """True when it may act in ``namespace``."""
        return self.spans_namespaces or namespace in self.namespaces


def token_digest(token: str) -> str:
    """The hex sha256 a policy stores for a bearer token."""
    return hashlib.sha256(token.encode()).hexdigest()


def _strings(entry: Mapping[str, Any], key: str, where: str) -> list[str]:
    values = entry.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ConfigError(f"{where}: {key} must be a list of non-empty strings")
    return values


def _identity(text: str, where: str) -> Identity:
    try:
        return Identity.parse(text)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def _claim(table: dict[_Key, Principal], key: _Key, principal: Principal, what: str) -> None:
    if key in table:
        raise ConfigError(f"{what} already belongs to {table[key].name}")
    table[key] = principal


def _check_owner_only_writable(path: str) -> None:
    """Refuse a policy that anyone but its owner could rewrite (it decides who may do what)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise ConfigError(f"{POLICY_VARIABLE} names a file that cannot be read ({error.strerror})") from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{POLICY_VARIABLE} names a file that its group or others may write (mode {stat.S_IMODE(mode):o}); "
            "make it writable by its owner only (chmod go-w)"
        )


@dataclasses.dataclass(frozen=True)
class Policy:
    """Principals by certificate identity and by token digest."""

    by_identity: Mapping[Identity, Principal]
    by_token_digest: Mapping[str, Principal]

    @classmethod
    def parse(cls, document: object, source: str) -> Policy:
        """Build from the decoded JSON; ``ConfigError`` names ``source`` and the entry at fault."""
        principals = document.get("principals") if isinstance(document, dict) else None
        if not isinstance(principals, list) or not principals:
            raise ConfigError(f"{source}: expected an object with a non-empty 'principals' list")
        by_identity: dict[Identity, Principal] = {}
        by_token: dict[str, Principal] = {}
        names: set[str] = set()
        for index, entry in enumerate(principals):
            where = f"{source}: principals[{index}]"
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not name or name in names:
                raise ConfigError(f"{where}: name must be a unique non-empty string")
            names.add(name)
            namespaces = _strings(entry, "namespaces", where)
            if not namespaces:
                raise ConfigError(f"{where}: namespaces must not be empty")
            principal = Principal(name, frozenset(namespaces))
            for text in _strings(entry, "certificate_identities", where):
                _claim(by_identity, _identity(text, where), principal, f"{where}: certificate identity {text!r}")
            for digest in _strings(entry, "token_sha256", where):
                _claim(by_token, digest, principal, f"{where}: token_sha256 {digest!r}")
        return cls(by_identity, by_token)

    @classmethod
    def load(cls, path: str) -> Policy:
        """Read and parse the policy file at ``path``, which only its owner may write."""
        _check_owner_only_writable(path)
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            raise ConfigError(f"{POLICY_VARIABLE} names a file that cannot be read ({error.strerror})") from None
        except ValueError as error:
            raise ConfigError(f"{POLICY_VARIABLE}: the policy is not valid JSON ({error})") from None
        return cls.parse(document, POLICY_VARIABLE)

    @classmethod
    def from_env(cls) -> Policy | None:
        """The policy ``NEXUSCRM_AUTHZ_POLICY`` names, None when unset."""
        path = cls.path_from_env()
        return cls.load(path) if path else None

    @staticmethod
    def path_from_env() -> str | None:
        """The file ``NEXUSCRM_AUTHZ_POLICY`` names, None when unset."""
        return os.environ.get(POLICY_VARIABLE) or None

    def for_identities(self, identities: Iterable[Identity]) -> Principal | None:
        """The one principal the identities belong to; None for none, ``PermissionDenied`` for two or more."""
        principals = {self.by_identity[i] for i in identities if i in self.by_identity}
        if len(principals) > 1:
            raise PermissionDenied("the client certificate names identities of more than one principal")
        return next(iter(principals), None)

    def for_certificate(self, certificate: bytes | None) -> Principal | None:
        """The principal of a verified leaf certificate (PEM or DER); None without one or when unknown.

        ``CertificateRefused`` (PERMISSION_DENIED) for a certificate that may speak for nobody.
        """
        if not certificate:
            return None
        return self.for_identities(certificate_identities(certificate))

    def for_token(self, token: str) -> Principal | None:
        """The principal a bearer token authenticates."""
        return self.by_token_digest.get(token_digest(token))


def peer_certificate(context: grpc.ServicerContext) -> bytes | None:
    """The verified client certificate (PEM) of a call over mutual TLS; None in plaintext."""
    certificates = cast("list[bytes] | None", context.auth_context().get("x509_pem_cert"))
    return certificates[0] if certificates else None


# The principal of the call this thread serves, set by the interceptor around the handler.
_CALLER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("nexuscrm_caller", default=None)


def recorded_operator(declared: str) -> str:
    """Who an operator's act records: the caller's principal, then the name the request declares.

    Over mutual TLS the principal is what the certificate proves, so it leads the record
    ("ops-cli (alice@acme)", or "ops-cli" when nothing is declared); a declared name alone is
    a label anyone could send. Without an authorization policy there is no principal and the
    declared name is recorded as sent.
    """
    principal = _CALLER.get()
    if principal is None or declared == principal.name:
        return declared
    return f"{principal.name} ({declared})" if declared else principal.name


# What a rule gets: the caller and the deserialized request; it returns normally or raises.
Rule = Callable[[Principal, Any], None]


def allow_any_principal(_principal: Principal, _request: object) -> None:
    """Rule of reads that reveal nothing of any namespace (the schema's version and shape)."""


def require_all_namespaces(principal: Principal, _request: object) -> None:
    """Rule of operations over every namespace (schema, host status, unscoped lists)."""
    if not principal.spans_namespaces:
        raise PermissionDenied("the caller may not do this: it needs access to every namespace ('*')")


def require_namespace(principal: Principal, namespace: str, field: str) -> None:
    """Refuse unless ``principal`` may act in ``namespace``, which the request's ``field`` names."""
    if not principal.may_act_in(namespace):
        raise PermissionDenied(f"the caller may not act in namespace {namespace!r}", field=field)


def require_visible(principal: Principal, namespace: str | None, field: str, value: str) -> None:
    """Refuse unless the row ``field`` = ``value`` exists (``namespace`` not None) and is the caller's."""
    if not value:
        raise InvalidArgument(f"{field} is required", field=field)
    if namespace is None or not principal.may_act_in(namespace):
        raise NotVisible(f"{field} {value!r} not found", field=field)


class AuthorizationInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]  # generic only in stubs
    """Authenticates every call by its certificate and applies the method's rule before the handler.

    ``rules`` maps full method names (``/package.Service/Method``) to their ``Rule``;
    ``policy()`` is the policy in force (it may be reloaded while serving).
    """

    def __init__(self, policy: Callable[[], Policy], rules: Mapping[str, Rule]) -> None:
        self._policy = policy
        self._rules = rules

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler
        rule = self._rules.get(method)

        @contextlib.contextmanager
        def authorized(request: Any, context: grpc.ServicerContext) -> Iterator[None]:
            certificate = peer_certificate(context)
            try:
                principal = self._policy().for_certificate(certificate)
            except (CertificateRefused, PermissionDenied) as error:
                log.warning("refused a client certificate: %s", error)
                raise
            if principal is None:  # verified by the CA, but not admitted by the policy
                log.warning("refused a certificate no principal has: %s", _described(certificate))
                raise PermissionDenied("the client certificate is not admitted by the authorization policy")
            if rule is None:
                raise PermissionDenied(f"{method} has no authorization rule")
            rule(principal, request)
            caller = _CALLER.set(principal)
            try:
                yield
            finally:
                _CALLER.reset(caller)

        return wrap_rpc_handler(handler, authorized)


def _described(certificate: bytes | None) -> str:
    """The identities of a certificate for a log line (``ascii``: no control character reaches the log)."""
    return ascii([str(identity) for identity in certificate_identities(certificate)]) if certificate else "none"
