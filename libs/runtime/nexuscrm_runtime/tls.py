"""Mutual TLS between the services and their clients, from three files named in the environment.

``NEXUSCRM_TLS_CA`` (the CA bundle that signs every service and client certificate),
``NEXUSCRM_TLS_CERT`` and ``NEXUSCRM_TLS_KEY`` (this process's certificate chain and private
key, PEM). All three or none: with none, servers and clients speak plaintext (local
development, tests); with all three, a server accepts only clients whose certificate the CA
signed, and a client verifies the server against the same CA and presents its own
certificate, whose identities (read by ``identity``) are what ``authorization`` authorizes.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping
from pathlib import Path

import grpc

from nexuscrm_runtime.config import ConfigError

TLS_VARIABLES = ("NEXUSCRM_TLS_CA", "NEXUSCRM_TLS_CERT", "NEXUSCRM_TLS_KEY")


def _read_pem(variable: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"{variable} names a file that cannot be read ({error.strerror})") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{variable} names a file that is not PEM")
    return data


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class TlsFiles:
    """The PEM contents of the CA bundle, certificate chain and private key (never printed).

    The paths are kept for servers that load files themselves (the dashboard's and the
    metrics endpoint's HTTPS) and for ``reread``.
    """

    ca: bytes
    cert: bytes
    key: bytes
    ca_path: str
    cert_path: str
    key_path: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TlsFiles | None:
        """The files ``environ`` names, None when it names none; ``ConfigError`` naming what is wrong."""
        paths = {name: environ.get(name, "") for name in TLS_VARIABLES}
        given = [name for name, path in paths.items() if path]
        if not given:
            return None
        if len(given) < len(TLS_VARIABLES):
            missing = ", ".join(name for name in TLS_VARIABLES if name not in given)
            raise ConfigError(f"{missing} must be set too: TLS needs all of {', '.join(TLS_VARIABLES)}")
        ca, cert, key = (_read_pem(name, paths[name]) for name in TLS_VARIABLES)
        return cls(
            ca=ca,
            cert=cert,
            key=key,
            ca_path=paths["NEXUSCRM_TLS_CA"],
            cert_path=paths["NEXUSCRM_TLS_CERT"],
            key_path=paths["NEXUSCRM_TLS_KEY"],
        )

    def reread(self) -> TlsFiles:
        """The same three files read again (after a rotation); ``ConfigError`` if they are unusable.

        The new key must match the new certificate, so that a rotation caught half-written
        is refused instead of breaking every handshake.
        """
        files = TlsFiles.from_env(dict(zip(TLS_VARIABLES, (self.ca_path, self.cert_path, self.key_path), strict=True)))
        if files is None:  # the paths are never empty
            raise RuntimeError("TLS paths vanished")
        files.server_context()
        return files

    def server_context(self, *, require_client_certificate: bool = False) -> ssl.SSLContext:
        """A TLS server context presenting our certificate (HTTPS side servers); ``ConfigError`` if unusable.

        ``require_client_certificate``: only clients with a certificate the CA signed may connect.
        """
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert_path, self.key_path)
            if require_client_certificate:
                context.load_verify_locations(cadata=self.ca.decode("ascii", "replace"))
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"NEXUSCRM_TLS_CERT and NEXUSCRM_TLS_KEY cannot be used together ({error})") from None
        return context

    def server_certificate_configuration(self) -> grpc.ServerCertificateConfiguration:
        """Server side: our certificate and the CA that must have signed every client's."""
        return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], root_certificates=self.ca)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: verify the server against the CA and present our certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def open_channel(target: str, tls: TlsFiles | None = None) -> grpc.Channel:
    """A channel to ``target``: mutual TLS with ``tls`` (default: this process's environment), else plaintext."""
    tls = tls or TlsFiles.from_env()
    if tls is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, tls.channel_credentials())
