"""Who may open the dashboard when the Controlplane runs with security (docs/security.md).

The dashboard shows every namespace's packs, so only a principal of every namespace (``*``)
may see it. Browsers authenticate with HTTP Basic (user = the principal's name, password =
its token) and scripts with ``Authorization: Bearer <token>``; the policy stores only the
token's sha256 (``token_sha256``). Served over HTTPS with the Controlplane's certificate, so
the token never crosses the network in clear.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable

from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, Response

from nexuscrm_runtime.authorization import Policy

REALM = 'Basic realm="NexusCRM dashboard"'


class NotAllowed(AuthenticationError):
    """A known principal without access to every namespace."""


def _token(authorization: str) -> tuple[str, str | None]:
    """(token, the user name Basic claimed or None) from an Authorization header."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value:
        return value.strip(), None
    if scheme.lower() == "basic" and value:
        try:
            user, _, token = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise AuthenticationError("malformed Basic credentials") from None
        return token, user
    raise AuthenticationError("send a Bearer token or Basic credentials")


class TokenBackend(AuthenticationBackend):
    """Authenticates a request by its token and admits only principals of every namespace."""

    def __init__(self, policy: Callable[[], Policy]) -> None:
        self._policy = policy

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
        """The principal as the request's user; ``AuthenticationError`` refuses the request."""
        token, claimed = _token(conn.headers.get("Authorization", ""))
        principal = self._policy().for_token(token)
        if principal is None or claimed not in (None, principal.name):
            raise AuthenticationError("unknown token")
        if not principal.spans_namespaces:
            raise NotAllowed("this principal may not see every namespace ('*'), which the dashboard shows")
        return AuthCredentials(["dashboard"]), SimpleUser(principal.name)


def _refuse(conn: HTTPConnection, error: AuthenticationError) -> Response:
    if isinstance(error, NotAllowed):
        return PlainTextResponse(str(error), status_code=403)
    return PlainTextResponse(f"authentication required: {error}", status_code=401, headers={"WWW-Authenticate": REALM})


def token_middleware(policy: Callable[[], Policy]) -> Middleware:
    """The middleware that puts the whole dashboard behind the tokens of ``policy()``, the policy in force."""
    return Middleware(AuthenticationMiddleware, backend=TokenBackend(policy), on_error=_refuse)
