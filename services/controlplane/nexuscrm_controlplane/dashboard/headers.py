"""The security headers every dashboard response carries, refusals included.

The page loads only its own script, style sheet and JSON (``'self'``); the timeline draws
its bars with ``style`` attributes, the only inline content it has, so ``style-src-attr``
allows those and nothing else inline. No page may frame it (clickjacking), and browsers
must not guess content types. HSTS only over HTTPS: sent over plain HTTP it means nothing,
and a local dashboard on a loopback port must not pin the browser to HTTPS for that host.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; style-src-attr 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HSTS_MAX_AGE = 31_536_000  # seconds (a year, the usual preload minimum)


def security_headers(*, https: bool) -> list[tuple[bytes, bytes]]:
    """The headers (raw ASGI pairs) every response gets; HSTS with ``https`` only."""
    headers = [
        (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
    ]
    if https:
        headers.append((b"strict-transport-security", f"max-age={HSTS_MAX_AGE}".encode()))
    return headers


class SecurityHeaders:
    """ASGI middleware adding ``security_headers`` to every HTTP response."""

    def __init__(self, app: ASGIApp, *, https: bool) -> None:
        self._app = app
        self._headers = security_headers(https=https)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self._headers]
            await send(message)

        await self._app(scope, receive, send_with_headers)


def security_headers_middleware(*, https: bool) -> Middleware:
    """The middleware, outermost, so that refusals (401, 403) carry the headers too."""
    return Middleware(SecurityHeaders, https=https)
