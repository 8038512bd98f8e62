"""A server's security settings: mutual TLS and the authorization policy, both or neither.

Authorization without TLS would trust nothing (the caller's identity is its verified
certificate), and TLS without a policy would let any certificate the CA ever signed do
anything; so a server refuses to start with only one of them (docs/security.md).
"""

from __future__ import annotations

import dataclasses

from nexuscrm_runtime.authorization import POLICY_VARIABLE, Policy
from nexuscrm_runtime.config import ConfigError
from nexuscrm_runtime.tls import TLS_VARIABLES, TlsFiles


@dataclasses.dataclass(frozen=True)
class Security:
    """The server's certificate files and the policy its RPCs are authorized by."""

    tls: TlsFiles
    policy: Policy

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
        return cls(tls, policy)
