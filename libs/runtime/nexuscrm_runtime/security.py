"""A server's security settings: mutual TLS and the authorization policy, both or neither.

Authorization without TLS would trust nothing (the caller's identity is its verified
certificate), and TLS without a policy would let any certificate the CA ever signed do
anything; so a server refuses to start with only one of them (docs/security.md).

Both are reloaded from the same files while serving (``reload``, on SIGHUP): a new policy
applies to the next call, new certificates to the next handshake. A reload that fails keeps
what was in force and says why; it never leaves a server without security.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from nexuscrm_runtime.authorization import POLICY_VARIABLE, Policy
from nexuscrm_runtime.config import ConfigError
from nexuscrm_runtime.tls import TLS_VARIABLES, TlsFiles

log = logging.getLogger(__name__)


class Security:
    """The server's certificate files and the policy its RPCs are authorized by, as now in force.

    ``policy_path`` is where ``reload`` reads the policy again (None: the policy never changes).
    """

    def __init__(self, tls: TlsFiles, policy: Policy, policy_path: str | None = None) -> None:
        self._tls = tls
        self._policy = policy
        self._policy_path = policy_path
        self._listeners: list[Callable[[TlsFiles], None]] = []
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> Security | None:
        """Read both from the environment; None when neither is configured."""
        tls = TlsFiles.from_env()
        policy = Policy.from_env()
        if tls is None and policy is None:
            return None
        if tls is None:
            raise ConfigError(f"{POLICY_VARIABLE} needs mutual TLS: set {', '.join(TLS_VARIABLES)}")
        if policy is None:
            raise ConfigError(f"mutual TLS needs an authorization policy: set {POLICY_VARIABLE}")
        return cls(tls, policy, Policy.path_from_env())

    @property
    def tls(self) -> TlsFiles:
        """The certificate files in force."""
        return self._tls

    @property
    def policy(self) -> Policy:
        """The policy in force."""
        return self._policy

    def server_credentials(self) -> grpc.ServerCredentials:
        """Mutual TLS for a gRPC port whose certificates follow ``reload`` (grpc asks before each handshake)."""
        presented = self._tls

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            nonlocal presented
            if self._tls is presented:
                return None  # unchanged: grpc keeps the current configuration
            presented = self._tls
            return presented.server_certificate_configuration()

        return grpc.dynamic_ssl_server_credentials(
            presented.server_certificate_configuration(),
            fetch,  # type: ignore[arg-type]  # grpc documents None as "unchanged"; the stubs omit it
            require_client_authentication=True,
        )

    def on_reload(self, listener: Callable[[TlsFiles], None]) -> None:
        """Call ``listener`` with the new files after each successful reload (an HTTPS side server)."""
        self._listeners.append(listener)

    def reload(self) -> bool:
        """Read the certificate files and the policy again; keep the old ones if either is refused.

        Returns True when the new ones are in force. Never raises for a bad file: the refusal
        is logged as one line naming the problem.
        """
        with self._lock:
            try:
                tls = self._tls.reread()
                policy = Policy.load(self._policy_path) if self._policy_path else self._policy
                for listener in self._listeners:
                    listener(tls)
            except (ConfigError, OSError, ValueError) as error:
                log.error("reload refused, the previous certificates and policy stay in force: %s", error)
                return False
            self._tls, self._policy = tls, policy
        log.info("reloaded the certificates and the authorization policy")
        return True
