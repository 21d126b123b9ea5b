"""ContextRender as a separate server (docs/method.md §9: paper §3.4 and §D).

An agent runtime keeps its own, untrimmed history; before each model call an
adapter sends the new messages (or the whole list) and gets back the history
rendered under the budget B. The graph (one SQLite file, many sessions) is
the only store; every render is a view.

    contextrender serve --port 8765 --graph run.sqlite

Endpoints (JSON; every error is ``{"detail": "...", "error": {"message", "type", "code"}}``: 400 for
messages that are not valid chat messages — none of the batch is stored — or a body that is not JSON,
422 for a parameter outside its domain: method, overrides, budget (a JSON integer, never a string or
a boolean), session id, view window; 404 for an unknown session, 409 for a history that contradicts
the stored one, 413 for a body or a view over its limit, 507 when the graph file cannot be written
(a full disk: nothing of that request is stored); 500 for a policy that broke its contract):

=======  ===============================  =============================================
PUT/POST ``/sessions/{id}``               create or resume (``{"meta": {}, "encoding"}``)
GET      ``/sessions``, ``/sessions/{id}`` list sessions, one session's counts
POST     ``/sessions/{id}/messages``       append a list of OpenAI messages, or
                                           ``{"messages", "mode": "sync", "on_conflict"}``
GET      ``/sessions/{id}/messages``       the stored transcript
POST     ``/sessions/{id}/render``         ``{budget, method, overrides, messages?}`` →
                                           ``{messages, tokens, visible, usage, layout, …}``
GET      ``/sessions/{id}/scores``         ``?budget=&method=&overrides=`` → one ResultScore row per
                                           result (none when the full history fits: ``shortcut``)
GET      ``/sessions/{id}/edges``          TFA reuse edges and c_t(r)
GET      ``/sessions/{id}/readiness``      call readiness of the session's answers (docs/method.md §11)
GET      ``/sessions/{id}/usage``          ``?last=N`` → the upstream's billed figures of the session's answered
                                           requests (proxy, wrap): totals, and the latest N rows (default and at
                                           most 1000)
GET      ``/sessions/{id}/export``         the session as a replay-trace line
GET      ``/sessions/{id}/view``           ``?budget=&methods=a,b&from=&to=`` (or ``&last=N``) → the session's HTML
                                           view of those invocations (default the latest 30; at most 200:
                                           422 above, 413 for a page over 32 MB; contextrender/view.py)
GET      ``/health``
=======  ===============================  =============================================

Sync, forks, ``layout`` and concurrency are the session library's
(:mod:`contextrender.service.sessions`); this module maps its typed results
to these bodies (``to_json()``) and its error kinds to statuses
(:data:`STATUS_OF_KIND`).

Access: :mod:`contextrender.service.guard` checks Host, Origin, Content-Type and
the optional token before any route runs. Overrides are data: only the
method's tunable keys with plain values (:func:`contextrender.registry.validate_overrides`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from contextrender import __version__
from contextrender.service.errors import BadRequest, ErrorKind, ServiceError
from contextrender.service.guard import AccessPolicy, Guard, error_body
from contextrender.service.sessions import MAX_USAGE_ROWS, ContextService

#: Default request-body limit (bytes) for the server and the proxy.
DEFAULT_MAX_BODY = 20 * 1024 * 1024

#: The session API's status for each kind of refused operation.
STATUS_OF_KIND: Mapping[ErrorKind, int] = {
    ErrorKind.BAD_REQUEST: 422,
    ErrorKind.INVALID_MESSAGES: 400,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.INTERNAL: 500,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.STORAGE: 507,
}


def http_status(error: ServiceError) -> int:
    """The status the session API answers ``error`` with."""
    return STATUS_OF_KIND[error.kind]


class _TooLarge(StarletteHTTPException):
    """Raised from the body stream; an HTTPException so FastAPI's body parsing re-raises it."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the {limit}-byte limit")


class BodyLimitMiddleware:
    """413 for bodies above ``max_bytes``: declared (Content-Length) or streamed (chunked)."""

    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                await JSONResponse(error_body(400, "invalid Content-Length header"), 400)(scope, receive, send)
                return
            if too_big:
                await JSONResponse(error_body(413, f"request body exceeds the {self.max_bytes}-byte limit"),
                                   413)(scope, receive, send)
                return
        seen = 0

        async def limited() -> Any:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return msg

        await self.app(scope, limited, send)


#: The 400's message for a body that does not parse as JSON (the body is never echoed).
NOT_JSON = "request body is not valid JSON"


def _validation_message(exc: RequestValidationError) -> str:
    """One line naming the first refused parameter and why (the value is never echoed: it may be huge)."""
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x not in ("body", "query", "path", "header")]
    where = f"'{'.'.join(loc)}'" if loc else "the request"
    if first.get("type") == "int_parsing_size":
        why = "is too long a number"
    else:
        why = str(first.get("msg", "is invalid")).replace("Input should be", "should be")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {why}{more}"


def install_error_handlers(app: FastAPI) -> None:
    """Every error in the services' JSON shape (:func:`~contextrender.service.guard.error_body`): refused session
    operations with :data:`STATUS_OF_KIND`, an oversized body with 413, malformed parameters with 422, the
    framework's own refusals (an unparsable body: 400; no such route: 404) with their status, and anything
    unexpected with a 500 that names no detail beyond the error's type (the log has the traceback)."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        status = http_status(exc)
        return JSONResponse(error_body(status, exc.message), status)

    @app.exception_handler(_TooLarge)
    async def _too_large(request: Request, exc: _TooLarge) -> JSONResponse:
        return JSONResponse(error_body(413, str(exc.detail)), 413)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if any(e.get("type") == "json_invalid" for e in exc.errors()):  # the body itself, not a parameter
            return JSONResponse(error_body(400, NOT_JSON), 400)
        return JSONResponse(error_body(422, _validation_message(exc)), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else "invalid request"
        return JSONResponse(error_body(exc.status_code, detail), exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body(500, internal_error_message(exc)), 500)


def internal_error_message(exc: BaseException) -> str:
    """What a 500 says: the error's type only (its message may hold request data or paths; the log has it)."""
    return f"internal error ({type(exc).__name__}); the service log has the details"


class SessionBody(BaseModel):
    meta: dict[str, Any] = Field(default_factory=dict)
    encoding: str | None = None


class MessagesBody(BaseModel):
    messages: list[Any]
    mode: Literal["append", "sync"] = "append"
    on_conflict: Literal["error", "fork"] = "error"


class RenderBody(BaseModel):
    budget: Any = None  # checked by the service: a JSON integer > 0, never a string or a boolean
    method: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    messages: list[Any] | None = None
    on_conflict: Literal["error", "fork"] = "error"


def _overrides_query(raw: str | None) -> Any:
    """The ``overrides`` query parameter decoded; the service validates it against the method."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise BadRequest(f"'overrides' query parameter is not JSON: {e.msg}") from None
    except RecursionError:
        raise BadRequest("'overrides' query parameter is nested too deeply") from None


def session_router(service: ContextService) -> APIRouter:
    """The session API over ``service`` (mounted by the server and by the proxy)."""
    r = APIRouter()
    _add_session_routes(r, service)
    _add_render_routes(r, service)
    return r


def _add_session_routes(r: APIRouter, service: ContextService) -> None:
    """Health, the session list, create/resume, one session's counts, its messages (read and write)."""

    @r.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "sessions": len(service.sessions()), "default_method": service.default_method,
                "default_budget": service.default_budget, "embedder": service.embedder.name}

    @r.get("/sessions")
    def list_sessions() -> dict[str, Any]:
        return {"sessions": service.sessions()}

    def _create(sid: str, body: SessionBody | None) -> JSONResponse:
        b = body or SessionBody()
        out = service.create(sid, meta=b.meta, encoding=b.encoding)
        return JSONResponse(out.to_json(), status_code=201 if out.created else 200)

    @r.put("/sessions/{sid}")
    def put_session(sid: str, body: Annotated[SessionBody | None, Body()] = None) -> JSONResponse:
        return _create(sid, body)

    @r.post("/sessions/{sid}")
    def post_session(sid: str, body: Annotated[SessionBody | None, Body()] = None) -> JSONResponse:
        return _create(sid, body)

    @r.get("/sessions/{sid}")
    def get_session(sid: str) -> dict[str, Any]:
        return service.info(sid).to_json()

    @r.get("/sessions/{sid}/messages")
    def get_messages(sid: str) -> dict[str, Any]:
        return service.transcript(sid).to_json()

    @r.post("/sessions/{sid}/messages")
    def post_messages(sid: str, body: Annotated[Any, Body()]) -> dict[str, Any]:
        # A bare list appends; an object chooses the mode.
        if isinstance(body, list):
            return service.append(sid, body).to_json()
        try:
            req = MessagesBody.model_validate(body)
        except ValidationError as e:
            raise BadRequest("body must be a list of messages or {\"messages\": [...], \"mode\": "
                             f"\"append\"|\"sync\", \"on_conflict\": \"error\"|\"fork\"}}: {e.errors()[0]['msg']}"
                             ) from None
        if req.mode == "append":
            return service.append(sid, req.messages).to_json()
        return service.sync(sid, req.messages, req.on_conflict).to_json()


def _add_render_routes(r: APIRouter, service: ContextService) -> None:
    """Render, scores, reuse edges, call readiness, billed usage, the HTML view and the trace export of one session."""

    @r.post("/sessions/{sid}/render")
    def render(sid: str, body: Annotated[RenderBody | None, Body()] = None) -> dict[str, Any]:
        b = body or RenderBody()
        return service.render(sid, messages=b.messages, budget=b.budget, method=b.method, overrides=b.overrides,
                              on_conflict=b.on_conflict).to_json()

    @r.get("/sessions/{sid}/scores")
    def scores(sid: str, budget: int | None = Query(default=None, gt=0), method: str | None = None,
               overrides: str | None = Query(default=None, description="JSON object of dotted keys")
               ) -> dict[str, Any]:
        return service.scores(sid, budget=budget, method=method, overrides=_overrides_query(overrides)).to_json()

    @r.get("/sessions/{sid}/edges")
    def edges(sid: str) -> dict[str, Any]:
        return service.edges(sid).to_json()

    @r.get("/sessions/{sid}/readiness")
    def readiness(sid: str) -> dict[str, Any]:
        return service.readiness(sid).to_json()

    @r.get("/sessions/{sid}/usage")
    def usage(sid: str, last: int | None = Query(default=None, ge=1, le=MAX_USAGE_ROWS,
                                                  description="rows of the latest N requests")) -> dict[str, Any]:
        return service.usage(sid, last=last).to_json()

    @r.get("/sessions/{sid}/view", response_model=None)
    def view(sid: str, budget: int | None = Query(default=None, gt=0),
             methods: str | None = Query(default=None, description="one or two methods, comma-separated"),
             start: int | None = Query(default=None, alias="from", ge=0, description="first invocation drawn"),
             end: int | None = Query(default=None, alias="to", ge=0, description="last invocation drawn"),
             last: int | None = Query(default=None, ge=1, description="draw the latest N invocations")) -> Any:
        # A plain def: FastAPI runs it in its thread pool, so the replay never blocks the event loop (/health).
        names = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
        return HTMLResponse(service.view(sid, budget=budget, methods=names, start=start, end=end, last=last))

    @r.get("/sessions/{sid}/export", response_model=None)
    def export(sid: str, format: Literal["json", "jsonl"] = "json") -> Any:
        ep = service.export(sid).to_json()
        if format == "jsonl":
            return PlainTextResponse(json.dumps(ep, ensure_ascii=False) + "\n", media_type="application/x-ndjson")
        return ep


def create_app(graph_path: str = ":memory:", default_method: str = "contextrender", default_budget: int = 6000,
               embedding: str = "local", *, compactor: Any = "extractive", max_body_bytes: int = DEFAULT_MAX_BODY,
               service: ContextService | None = None, access: AccessPolicy | None = None,
               warm: bool = True) -> FastAPI:
    """The ContextRender server.

    ``access`` says which hosts, browser origins and token are accepted
    (:mod:`contextrender.service.guard`); the default accepts loopback host names
    only, no browser origin and no token. Bind it to 127.0.0.1 (the CLI's
    default). ``warm``: load the embedding model at start-up
    (:class:`~contextrender.service.sessions.ContextService`); ignored when ``service`` is given.
    """
    owned = service is None
    svc = service or ContextService(graph_path, default_method=default_method, default_budget=default_budget,
                                    embedding=embedding, compactor=compactor, warm=warm)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        if owned:
            svc.close()

    # No /docs or /openapi.json: the Swagger page loads scripts from a CDN into this origin.
    app = FastAPI(title="ContextRender", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.service = svc
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(Guard, policy=access or AccessPolicy.for_bind("127.0.0.1"))  # outermost: runs first
    install_error_handlers(app)
    app.include_router(session_router(svc))
    return app


# ContextService is re-exported: create_app takes one, and callers outside the service still import it here.
__all__ = ["BodyLimitMiddleware", "ContextService", "DEFAULT_MAX_BODY", "NOT_JSON", "STATUS_OF_KIND", "create_app",
           "http_status", "install_error_handlers", "internal_error_message", "session_router"]
