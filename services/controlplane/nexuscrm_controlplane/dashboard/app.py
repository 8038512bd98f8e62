"""The dashboard's web application: one page, its static files and read-only JSON endpoints.

Built on Starlette (docs/decisions/050-observability-and-dashboard.md). Every route is a GET;
the endpoints are plain functions, which Starlette runs in its thread pool, over the bounded
reads of ``overview``. A domain error (an invalid search, an unknown pack) answers 400 with
its message; Connectors not answering the reads it serves (``dashboard.connectors``) answers
503 with ``{"error": "Connectors unavailable: ..."}``, and another refusal of Connectors 502;
nothing else of the error reaches the page. The overview and the timeline read the database
only, so they keep answering while Connectors is down. The worker list asks every Integration
host (``dashboard.workers``) and always answers 200, a host that does not answer marked so.

| route | answer |
|---|---|
| ``/`` | the page (``static/index.html``) |
| ``/static/...`` | its script and style sheet |
| ``/api/overview`` | ``overview.packs_overview`` |
| ``/api/packs/{pack}/timeline?after=`` | ``overview.pack_timeline`` |
| ``/api/receipts?state=&pack=`` | ``overview.receipts`` |
| ``/api/search?q=`` | ``overview.search`` |
| ``/api/workers`` | ``workers.IntegrationHosts.workers`` |
| ``/api/claim-pauses`` | ``operations.claim_pauses`` |
| ``/api/dead-letters?pack=`` | ``operations.dead_letters`` |
| ``/api/packs/{pack}/coverage?page_token=`` | ``operations.coverage`` |
| ``/api/flow-versions`` | ``operations.flow_versions`` |

The four operating panels (``operations``) ask Connectors too, so they answer 503 while it is
down; none of them changes anything: the page names the CLI commands that act.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from nexuscrm_controlplane.dashboard import operations, overview
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads, ConnectorsRefused, ConnectorsUnavailable
from nexuscrm_controlplane.dashboard.headers import security_headers_middleware
from nexuscrm_controlplane.dashboard.workers import IntegrationHosts
from nexuscrm_controlplane.lifecycle import validate_pack_id
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock
from workqueue.errors import DomainError

STATIC = Path(__file__).with_name("static")
NO_STORE = {"Cache-Control": "no-store"}


def _json(read: Callable[[Request], Any]) -> Callable[[Request], JSONResponse]:
    def endpoint(request: Request) -> JSONResponse:
        try:
            return JSONResponse(read(request), headers=NO_STORE)
        except ConnectorsUnavailable as error:
            return JSONResponse({"error": str(error)}, status_code=503, headers=NO_STORE)
        except ConnectorsRefused as error:
            return JSONResponse({"error": str(error)}, status_code=502, headers=NO_STORE)
        except DomainError as error:
            return JSONResponse({"error": str(error)}, status_code=400, headers=NO_STORE)

    return endpoint


def create_app(
    engine: Engine,
    *,
    connectors: ConnectorsReads,
    workers: IntegrationHosts,
    clock: DatabaseClock = DATABASE_CLOCK,
    middleware: Sequence[Middleware] = (),
    https: bool = False,
) -> Starlette:
    """The dashboard over ``engine``, ``connectors`` and ``workers``; it only ever reads.

    ``connectors``: the Connectors RPCs behind search and the receipt lists.
    ``workers``: the Integration hosts whose workers (and their clock skew) the page lists.
    ``middleware``: its access control, if any, inside the security headers (``headers``).
    ``https``: it is served over HTTPS (the headers then include HSTS).
    """

    def page(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=NO_STORE)

    def timeline(request: Request) -> Any:
        pack = validate_pack_id(request.path_params["pack"])
        return overview.pack_timeline(engine, pack, request.query_params.get("after", ""))

    def receipts(request: Request) -> Any:
        return overview.receipts(
            connectors, request.query_params.get("state", ""), request.query_params.get("pack", "")
        )

    def search(request: Request) -> Any:
        return overview.search(engine, connectors, request.query_params.get("q", ""))

    def dead_letters(request: Request) -> Any:
        pack = request.query_params.get("pack", "")
        return operations.dead_letters(engine, connectors, validate_pack_id(pack) if pack else "")

    def coverage(request: Request) -> Any:
        pack = validate_pack_id(request.path_params["pack"])
        return operations.coverage(connectors, pack, request.query_params.get("page_token", ""))

    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/overview", _json(lambda request: overview.packs_overview(engine, clock))),
            Route("/api/packs/{pack}/timeline", _json(timeline)),
            Route("/api/receipts", _json(receipts)),
            Route("/api/search", _json(search)),
            Route("/api/workers", _json(lambda request: workers.workers())),
            Route("/api/claim-pauses", _json(lambda request: operations.claim_pauses(engine, connectors))),
            Route("/api/dead-letters", _json(dead_letters)),
            Route("/api/packs/{pack}/coverage", _json(coverage)),
            Route("/api/flow-versions", _json(lambda request: operations.flow_versions(engine, connectors))),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[security_headers_middleware(https=https), *middleware],
    )
