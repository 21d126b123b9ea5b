"""An OpenAI-compatible proxy that renders ``messages`` before forwarding (docs/method.md §9).

    contextrender proxy --upstream https://api.openai.com/v1 --budget 6000 --method contextrender --port 8766

Point any OpenAI-compatible client at ``http://127.0.0.1:8766/v1``. For each
``POST /v1/chat/completions``:

1. session: the ``X-ContextRender-Session`` header, else a key derived from
   the system prompt and the first user message (:func:`derive_session_key`);
2. the request's ``messages`` (the client's full history) are synced into the
   graph; if they contradict what is stored (the client edited its past, or
   two runs share a key), the history continues in a fork ``key~N`` — logged,
   never a 500;
3. ``messages`` is replaced by the history rendered under B. Kept messages are
   forwarded as the client sent them (images, extra fields intact); only an
   omitted result's body (its marker) or a clipped task message changes
   (:func:`~contextrender.service.streams.forwarded_messages`);
4. everything else in the body (tools, tool_choice, stream, stream_options,
   temperature, …) goes upstream unchanged, with the client's Authorization
   header or, if it sent none (or sent the proxy's own access token there),
   ``Bearer $CONTEXTRENDER_UPSTREAM_API_KEY``;
5. the answer is recorded: non-streaming, the assistant message; streaming,
   SSE chunks are relayed unchanged as they arrive while content and
   tool-call fragments are assembled
   (:class:`~contextrender.service.streams.StreamAssembler`), and the
   assembled assistant message is added to the graph *before* the final
   ``[DONE]`` is relayed, so the client's next request — which carries that
   message — syncs cleanly. Recording is best effort: a failure to assemble
   or store is logged and never breaks the relay.

Access (:mod:`contextrender.service.guard`): only loopback ``Host`` names (plus
``--allow-host``), no browser ``Origin`` unless allowed, JSON bodies only on
chat completions and the session API, and an optional access token. Without
a token, any local process that can reach the port can spend the upstream
key: set one (``CONTEXTRENDER_TOKEN``) on shared machines.

Upstream errors come back with their status and body. Bodies above the limit
(20 MB by default) get 413; malformed JSON or bodies get 400 (nothing of a
rejected request is stored). Requests of one
session are serialised; sessions run concurrently. Keys are never logged or
stored: the graph holds messages only. Response headers
``X-ContextRender-Session`` / ``-Tokens`` / ``-Budget`` say what was done, and
``X-ContextRender-Ready: k/n`` how many of the session's answered tool calls that needed a value only
an earlier tool result held had it in the render they answered (call readiness; the calls of the
latest answer, with what the render hid, at ``GET /sessions/{sid}/readiness``);
``X-ContextRender-Cache`` the upstream's prompt-cache figures (a whole answer's own; on a stream, the
session's earlier requests'), each answered request's usage being recorded in the session
(docs/service.md, "Prompt-cache usage"; ``GET /stats``: the proxy's totals per API since start);
``X-ContextRender-Budget`` and ``X-ContextRender-Method`` request headers
override the defaults per request (a method named there gets no CLI
overrides). The session API (:mod:`contextrender.service.server`) is mounted too (``/sessions/...``),
so recorded sessions can be inspected and exported, unless
``session_api=False`` (``--no-session-api``).

``POST /v1/responses`` (the OpenAI Responses API) takes the same steps over
:mod:`~contextrender.service.responses_api` (:func:`handle_responses`); a request that relies on
upstream state (``previous_response_id``, ``conversation``) is refused with 400, or with
``stateful_responses="passthrough"`` forwarded unmanaged. Every answer the proxy relays without
rendering carries ``X-ContextRender-Managed: false``, and the first request to a path that generates
from a conversation (``/v1/completions``, …) is logged as a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from contextrender import __version__
from contextrender.adapters._common import derive_session_key, valid_session_id
from contextrender.billing import PromptUsage
from contextrender.graph import UsageTotals
from contextrender.redact import redact
from contextrender.service import anthropic_messages, chat_completions, expansion, responses_api
from contextrender.service.errors import ErrorKind, ServiceError
from contextrender.service.guard import AUTH_STATE_KEY, TOKEN_HEADER, AccessPolicy, Guard, error_body
from contextrender.service.results import RenderResult
from contextrender.service.server import (
    DEFAULT_MAX_BODY,
    BodyLimitMiddleware,
    install_error_handlers,
    internal_error_message,
    session_router,
)
from contextrender.service.server import STATUS_OF_KIND as SESSION_STATUS_OF_KIND
from contextrender.service.sessions import ContextService
from contextrender.service.streams import (
    AnthropicStreamAssembler,
    ResponsesStreamAssembler,
    StreamAssembler,
    chat_prompt_usage,
    forwarded_messages,
)

#: What assembles a streamed answer for recording, per API.
_Assembler = StreamAssembler | AnthropicStreamAssembler | ResponsesStreamAssembler

log = logging.getLogger(__name__)

API_KEY_ENV = "CONTEXTRENDER_UPSTREAM_API_KEY"
SESSION_HEADER = "x-contextrender-session"
BUDGET_HEADER = "x-contextrender-budget"
METHOD_HEADER = "x-contextrender-method"
#: Most digits the budget header may have (a budget is a token count: 9 digits is far beyond any context).
MAX_BUDGET_DIGITS = 9
#: The largest history budget a request may ask for: beyond every model's context window (a typo, not a budget).
MAX_BUDGET = 10_000_000
#: The Anthropic Messages API's route (Claude Code adds ``?beta=true``).
MESSAGES_PATH = "/v1/messages"
#: Where Anthropic clients put their key; a request that carries ``anthropic-version`` is one of theirs.
ANTHROPIC_KEY_HEADER = "x-api-key"
#: The OpenAI Responses API's route.
RESPONSES_PATH = "/v1/responses"
#: On every answer the proxy did not render (a passthrough): ``false``.
MANAGED_HEADER = "x-contextrender-managed"
#: What ``stateful_responses`` may be: refuse a request that relies on upstream state, or pass it through.
STATEFUL_CHOICES = ("refuse", "passthrough")
#: On a rendered answer: the upstream's prompt-cache figures (docs/service.md, "Prompt-cache usage").
CACHE_HEADER = "x-contextrender-cache"
#: The proxy's own totals since start, per rendered API.
STATS_PATH = "/stats"


def cache_header(usage: PromptUsage, scope: str, requests: int | None = None) -> str:
    """``X-ContextRender-Cache``'s value: ``read=R; write=W; prompt=P; output=O; scope=S`` — the figures of this
    request (``scope=request``: a whole answer) or of the session's earlier requests (``scope=session``, with
    ``requests=K``, how many of them carried usage: a stream's headers go out before its own usage exists)."""
    text = (f"read={usage.cache_read}; write={usage.cache_write}; prompt={usage.prompt}; output={usage.output}; "
            f"scope={scope}")
    return text if requests is None else f"{text}; requests={requests}"

# Request headers not forwarded upstream (hop-by-hop, recomputed, or ours).
_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                 "te", "trailer", "transfer-encoding", "upgrade", "accept-encoding", "cookie"}
# Response headers not relayed (httpx decodes the body, so length/encoding change; the proxy's own server adds
# ``date`` and ``server``, so the upstream's would make two of each).
_DROP_RESPONSE = {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive", "date",
                  "server"}


def _oai_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status, headers=headers)


#: Anthropic's error type for each status the proxy answers with itself.
_ANTHROPIC_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error", 504: "timeout_error",
    529: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    """The Messages API's error shape: ``{"type": "error", "error": {"type": ..., "message": ...}}``."""
    kind = _ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _anthropic_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(anthropic_error_body(status, message), status)


class _RelayResponse(StreamingResponse):
    """A streaming response that always runs ``on_close`` (release the session, close upstream),
    even if the client goes away before the body starts."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


class _KeyLocks:
    """One asyncio lock per session key, dropped when nobody holds or waits for it (bounded memory)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: str) -> Callable[[], None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        await lock.acquire()
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            lock.release()
            cur, n = self._locks[key]
            if n <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (cur, n - 1)

        return release

    def __len__(self) -> int:
        return len(self._locks)


def _proxy_body_types(path: str) -> tuple[str, ...]:
    # The rendered APIs and the session API take JSON only; other OpenAI endpoints also take uploads.
    if path.startswith("/v1/") and path not in ("/v1/chat/completions", MESSAGES_PATH, RESPONSES_PATH):
        return ("application/json", "multipart/form-data")
    return ("application/json",)


def _split_upstream(upstream: str) -> tuple[httpx.URL, str | None]:
    """The upstream base URL without credentials, and the Basic header its ``user:password@`` asked for.

    httpx would otherwise turn URL credentials into an Authorization header on
    every request, silently replacing the client's key and the operator's.
    """
    url = httpx.URL(upstream)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"upstream must be an http(s) URL with a host, got {redact(upstream)!r}")
    if not (url.username or url.password):
        return url, None
    import base64

    cred = base64.b64encode(f"{url.username}:{url.password}".encode()).decode()
    return url.copy_with(username=None, password=None), f"Basic {cred}"


def _below(base: httpx.URL, path: str) -> str | None:
    """``base/path`` if it stays under ``base`` on the same host and port, else None."""
    segments = path.split("/")
    # '%' too: an escape the upstream decodes after us ('..%2F') must not smuggle a dot segment in.
    # '?' and '#' (a decoded %3F or %23) would end the path: the rest is not a path at all.
    if ("\\" in path or "%" in path or "?" in path or "#" in path or any(s in (".", "..") for s in segments)
            or "" in segments[:-1]):
        return None
    try:
        url = base.copy_with(path=base.path.rstrip("/") + "/" + path)
    except httpx.InvalidURL:  # any other character a URL path cannot hold
        return None
    if (url.host, url.port, url.scheme) != (base.host, base.port, base.scheme) or not url.path.startswith(
            base.path.rstrip("/") + "/"):
        return None
    return str(url)


def _token_forms(token: str | None) -> frozenset[str]:
    if not token:
        return frozenset()
    t = token.strip().lower()
    return frozenset({t, f"bearer {t}"})


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: The proxy's status for each kind of refused operation: the session API's, but 400 where it says 422,
#: since OpenAI's own API answers a bad parameter with 400 and its clients expect that.
STATUS_OF_KIND: Mapping[ErrorKind, int] = {**SESSION_STATUS_OF_KIND, ErrorKind.BAD_REQUEST: 400}


def upstream_failure(exc: Exception) -> tuple[int, str, bool]:
    """(status, message, worth retrying) for a request the upstream never answered: the upstream URL it went to
    (scheme, host, port and path; no credentials or query) and why — refused, DNS, TLS, timed out."""
    try:
        request = exc.request if isinstance(exc, httpx.RequestError) else None
    except RuntimeError:  # an error raised before a request was built
        request = None
    where = "the upstream"
    if request is not None:
        url = request.url.copy_with(query=None, fragment=None, username=None, password=None)
        where = redact(str(url))
    chain: list[BaseException] = []  # the error and what caused it (anyio wraps the OS error twice)
    cur: BaseException | None = exc
    while cur is not None and len(chain) < 8 and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = " ".join(f"{type(c).__name__} {c}" for c in chain).lower()
    if isinstance(exc, httpx.TimeoutException):
        phase = {httpx.ConnectTimeout: "connecting", httpx.ReadTimeout: "waiting for its answer",
                 httpx.WriteTimeout: "sending the request", httpx.PoolTimeout: "waiting for a free connection"}
        during = next((v for k, v in phase.items() if isinstance(exc, k)), "")
        return 504, f"upstream {where} timed out{' ' + during if during else ''} ({type(exc).__name__})", True
    if any(isinstance(c, ConnectionRefusedError) for c in chain) or "refused" in text:
        cause, retry = "connection refused: is the upstream running, and is --upstream right?", False
    elif any(isinstance(c, socket.gaierror) for c in chain) or any(k in text for k in ("name or service not known", "nodename nor servname", "getaddrinfo",
                                  "name resolution", "no address associated")):
        cause, retry = "its host name does not resolve (DNS)", False
    elif any(isinstance(c, ssl.SSLError) for c in chain) or "ssl" in text or "certificate" in text:
        cause, retry = "TLS handshake failed (certificate or protocol)", False
    elif isinstance(exc, httpx.RemoteProtocolError):
        cause, retry = "it closed the connection without an answer", True
    else:
        cause, retry = "connection failed", True
    return 502, f"upstream {where} unreachable: {cause} ({type(exc).__name__})", retry


def _unreachable(exc: Exception, error: Callable[[int, str], JSONResponse] = _oai_error) -> JSONResponse:
    """The API's own error shape for an upstream that never answered, logged at WARNING. A failure that retrying
    cannot fix (refused, DNS, TLS) says ``x-should-retry: false``, which the openai and anthropic SDKs (and the
    CLIs built on them) honour, so the client reports it at once instead of backing off for a minute."""
    status, message, retry = upstream_failure(exc)
    log.warning("%s", message)
    resp = error(status, message)
    resp.headers["x-should-retry"] = "true" if retry else "false"
    return resp


def _relay_headers(resp: httpx.Response, extra: dict[str, str]) -> dict[str, str]:
    h = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
    h.update(extra)
    return h


class _ApiKeyToken:
    """The access token presented as an Anthropic client's API key counts as presented.

    An Anthropic SDK sends its key in ``x-api-key``; given the proxy's token as its key (as an
    OpenAI client's is, in ``Authorization``), the request is let through the guard as if it
    came in ``X-ContextRender-Token``, and neither header goes upstream (the env key does).
    Compared in constant time; any other value is left for the guard to refuse.
    """

    def __init__(self, app: Any, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.token is not None:
            headers = list(scope.get("headers") or [])
            names = {k.lower() for k, _ in headers}
            key = next((v for k, v in headers if k.lower() == ANTHROPIC_KEY_HEADER.encode()), None)
            if (key is not None and b"authorization" not in names and TOKEN_HEADER.encode() not in names
                    and hmac.compare_digest(key.strip(), self.token)):
                scope = {**scope, "headers": [*headers, (TOKEN_HEADER.encode(), key.strip())]}
        await self.app(scope, receive, send)


def _messages_api(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def _reshaped_error(status: int, raw: bytes) -> bytes | None:
    """``raw`` in Anthropic's error shape if it is the proxy's own error body (:func:`error_body`), else None."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict) or set(body) != {"detail", "error"} or not isinstance(body["detail"], str):
        return None
    if body != error_body(status, body["detail"]):
        return None  # an upstream's body, relayed as it is
    return json.dumps(anthropic_error_body(status, body["detail"])).encode()


class _AnthropicErrors:
    """The proxy's own refusals on the Messages API (the guard's, the body limit's) in Anthropic's error
    shape, so an Anthropic SDK reads them as it reads the API's; the upstream's answers pass unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _messages_api(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] | None = None  # an error's start, held until its body is complete
        body = b""

        async def reshape(message: Any) -> None:
            nonlocal held, body
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            new = _reshaped_error(held["status"], body)
            if new is not None:
                headers = [(k, v) for k, v in held.get("headers") or [] if k.lower() != b"content-length"]
                held = {**held, "headers": [*headers, (b"content-length", str(len(new)).encode())]}
                body = new
            await send(held)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshape)


@dataclass
class ProxyState:
    """What every proxy request shares: the service, the upstream and its credentials, the defaults,
    the per-session locks, and the upstream client (opened and closed by the app's lifespan)."""

    service: ContextService
    owned: bool  # the proxy built the service, so it closes it
    base_url: httpx.URL  # without credentials or query
    base_params: httpx.QueryParams  # the --upstream query (Azure's ?api-version=...), sent on every request
    basic_auth: str | None  # the Authorization header the --upstream credentials ask for
    env_key: str | None
    force_env_key: bool
    token_values: frozenset[str]  # the access token as it may appear in a header, lower-cased
    budget: int
    method: str
    overrides: dict[str, Any] | None
    timeout: httpx.Timeout
    key_locks: _KeyLocks = field(default_factory=_KeyLocks)
    client: httpx.AsyncClient | None = None
    stateful_responses: str = "refuse"  # one of STATEFUL_CHOICES
    warned: set[str] = field(default_factory=set)  # what warn_once has logged
    #: Per rendered API (:data:`APIS`), the requests answered since start and their billed figures (``GET /stats``).
    stats: dict[str, UsageTotals] = field(default_factory=dict)
    stats_lock: threading.Lock = field(default_factory=threading.Lock)
    expansions: int = 0  # contextrender_expand calls answered since start (``GET /stats``)
    started: float = field(default_factory=time.time)  # Unix time the proxy's state was built

    def warn_once(self, what: str, message: str, *args: Any) -> None:
        """Log ``message`` at warning level the first time ``what`` happens (bounded: a few fixed kinds)."""
        if what not in self.warned and len(self.warned) < 1024:
            self.warned.add(what)
            log.warning(message, *args)

    @property
    def http(self) -> httpx.AsyncClient:
        """The upstream client; only while the app runs."""
        if self.client is None:
            raise RuntimeError("the proxy's upstream client is open only while the app runs (its lifespan)")
        return self.client

    def upstream_headers(self, request: Request, anthropic: bool | None = None) -> dict[str, str]:
        """The client's headers as they go upstream: hop-by-hop, ours and the access token dropped, and the
        key chosen (the client's, else the env key or the ``--upstream`` credentials).

        ``anthropic``: the request is an Anthropic client's (default: it carries ``anthropic-version``),
        whose key travels in ``x-api-key``; an OpenAI client's travels in ``Authorization``.
        """
        token_in_auth = bool(request.scope.get("state", {}).get(AUTH_STATE_KEY))
        # The access token never goes upstream, in whichever header a client put it.
        h = {k: v for k, v in request.headers.items()
             if k.lower() not in _DROP_REQUEST and not k.lower().startswith("x-contextrender-")
             and k.lower() != TOKEN_HEADER and not (token_in_auth and k.lower() == "authorization")
             and v.strip().lower() not in self.token_values}
        if anthropic is None:
            anthropic = "anthropic-version" in request.headers
        key_headers = ("authorization", ANTHROPIC_KEY_HEADER) if anthropic else ("authorization",)
        has_auth = any(k.lower() in key_headers for k in h)
        if self.env_key and (self.force_env_key or not has_auth):
            h = {k: v for k, v in h.items() if k.lower() not in key_headers}
            if anthropic:
                h[ANTHROPIC_KEY_HEADER] = self.env_key
            else:
                h["authorization"] = f"Bearer {self.env_key}"
        elif self.basic_auth is not None and not has_auth:  # credentials given in --upstream, used only when nothing else
            h["authorization"] = self.basic_auth
        return h

    def record(self, sid: str, message: Any) -> None:
        """Best effort: recording never breaks relaying (the next request carries the message anyway)."""
        try:
            self.service.append(sid, [message])
        except Exception as e:  # noqa: BLE001 - any failure is logged, the client still gets its answer
            log.warning("session %s: response not recorded: %s", sid, redact(str(getattr(e, "message", e))))

    def record_answer(self, res: RenderResult, api: _Api, message: Any, usage: PromptUsage | None,
                      streamed: bool) -> None:
        """An upstream answer to the request ``res`` rendered: its assistant message (None: none to record) and its
        usage as billed (None: unknown) go into the session, and the proxy's totals count it. Best effort, as
        :meth:`record`."""
        if message is not None:
            self.record(res.session, message)
        with self.stats_lock:
            self.stats[api.name] = self.stats.get(api.name, UsageTotals()).add(usage)
        try:
            self.service.record_usage(res.session, api.name, usage, streamed=streamed, at=res.stored)
        except Exception as e:  # noqa: BLE001 - as for the message: logged, never breaks the answer
            log.warning("session %s: usage not recorded: %s", res.session, redact(str(getattr(e, "message", e))))

    def stats_json(self) -> dict[str, Any]:
        """``GET /stats``: since when, per rendered API the answered requests (each upstream request, expand rounds
        included) and their billed figures, and the expand calls the proxy answered."""
        with self.stats_lock:
            per = {name: self.stats.get(name, UsageTotals()) for name in APIS}
            expansions = self.expansions
        everything = UsageTotals()
        for t in per.values():
            everything = UsageTotals(everything.requests + t.requests, everything.known + t.known,
                                     everything.usage + t.usage)
        return {"since": self.started, "apis": {name: t.to_json() for name, t in per.items()},
                "total": everything.to_json(), "expand_calls": expansions}


def _proxy_state(upstream: str, graph_path: str, *, budget: int, method: str, overrides: dict[str, Any] | None,
                 embedding: str, compactor: Any, api_key_env: str, force_env_key: bool, timeout: float,
                 connect_timeout: float, service: ContextService | None, access: AccessPolicy,
                 warm: bool) -> ProxyState:
    """Check the configuration (budget, upstream URL, method and overrides) and build the shared state."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    base_url, basic_auth = _split_upstream(upstream)
    base_params = httpx.QueryParams(base_url.params)
    owned = service is None
    svc = service or ContextService(graph_path, default_method=method, default_budget=budget,
                                    embedding=embedding, compactor=compactor, warm=warm, overrides=overrides)
    try:
        svc.policy(method, overrides)  # fail at start-up on a bad method or override
    except ServiceError as e:
        if owned:
            svc.close()
        raise ValueError(e.message) from None
    return ProxyState(service=svc, owned=owned, base_url=base_url.copy_with(query=None), base_params=base_params,
                      basic_auth=basic_auth, env_key=os.environ.get(api_key_env) or None,
                      force_env_key=force_env_key, token_values=_token_forms(access.token), budget=budget,
                      method=method, overrides=overrides, timeout=httpx.Timeout(timeout, connect=connect_timeout))


def create_proxy_app(upstream: str, graph_path: str = ":memory:", *, budget: int = 6000,
                     method: str = "contextrender", overrides: dict[str, Any] | None = None,
                     embedding: str = "local", compactor: Any = "extractive", api_key_env: str = API_KEY_ENV,
                     force_env_key: bool = False, max_body_bytes: int = DEFAULT_MAX_BODY, timeout: float = 600.0,
                     connect_timeout: float = 10.0, service: ContextService | None = None,
                     session_api: bool = True, access: AccessPolicy | None = None, warm: bool = True,
                     stateful_responses: str = "refuse") -> FastAPI:
    """The proxy app. ``upstream`` is the provider's OpenAI base URL, e.g. ``https://api.openai.com/v1``.

    ``force_env_key``: send the env key even when the client sent its own
    Authorization (for SDKs that insist on a placeholder key).
    ``session_api``: also mount the session API (``/sessions/...``: full
    transcripts); turn it off when only the proxy is needed.
    ``access``: accepted hosts, browser origins and token
    (:mod:`contextrender.service.guard`); by default loopback host names only, no
    browser origin, no token. A client that authenticates with
    ``Authorization: Bearer <token>`` gets the env key sent upstream in its
    place; one that uses ``X-ContextRender-Token`` keeps its own
    Authorization.
    ``warm``: load the embedding model at start-up, before the first request
    (:class:`~contextrender.service.sessions.ContextService`); ignored when ``service`` is given.
    ``stateful_responses``: a Responses API request that relies on upstream state (``previous_response_id``,
    ``conversation``) cannot be rendered: ``"refuse"`` answers it with 400, ``"passthrough"`` forwards it
    unmanaged (a warning logged, ``X-ContextRender-Managed: false`` on the answer).
    """
    if stateful_responses not in STATEFUL_CHOICES:
        raise ValueError(f"stateful_responses must be one of {', '.join(STATEFUL_CHOICES)}, got {stateful_responses!r}")
    access = access or AccessPolicy.for_bind("127.0.0.1")
    state = _proxy_state(upstream, graph_path, budget=budget, method=method, overrides=overrides,
                         embedding=embedding, compactor=compactor, api_key_env=api_key_env,
                         force_env_key=force_env_key, timeout=timeout, connect_timeout=connect_timeout,
                         service=service, access=access, warm=warm)
    state.stateful_responses = stateful_responses

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        state.client = httpx.AsyncClient(timeout=state.timeout)
        try:
            yield
        finally:
            await state.client.aclose()
            if state.owned:
                state.service.close()

    # No /docs or /openapi.json: the Swagger page loads scripts from a CDN into this origin.
    app = FastAPI(title="ContextRender proxy", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.service = state.service
    app.state.key_locks = state.key_locks
    app.state.proxy = state
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(Guard, policy=access, body_types=_proxy_body_types)
    app.add_middleware(_ApiKeyToken, token=access.token)  # outside the guard: it runs first
    app.add_middleware(_AnthropicErrors)  # outermost: sees the guard's refusals too
    install_error_handlers(app)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette answers these outside every middleware (_AnthropicErrors included): shape them here.
        if _messages_api(request.scope.get("path", "")):
            return _anthropic_error(500, internal_error_message(exc))
        return _oai_error(500, internal_error_message(exc))

    if session_api:
        app.include_router(session_router(state.service))
    _add_proxy_routes(app, state)
    return app


def _add_proxy_routes(app: FastAPI, state: ProxyState) -> None:
    """The API routes: chat completions and messages rendered, the model list and every other path relayed, and
    the proxy's usage totals (``GET /stats``)."""

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        return await handle_chat_completions(state, request)

    @app.post(MESSAGES_PATH, response_model=None)
    async def messages(request: Request) -> Response:
        return await handle_messages(state, request)

    @app.post(RESPONSES_PATH, response_model=None)
    async def responses(request: Request) -> Response:
        return await handle_responses(state, request)

    # The rendered routes spelled with a trailing slash: rendered too, never passed through.
    managed = {"chat/completions": handle_chat_completions, MESSAGES_PATH[4:]: handle_messages,
               RESPONSES_PATH[4:]: handle_responses}

    counted = False

    @app.post(MESSAGES_PATH + "/count_tokens", response_model=None)
    async def count_tokens(request: Request) -> Response:
        """Passed through unchanged: the upstream counts the client's full history, not the render."""
        nonlocal counted
        if not counted:
            counted = True
            log.info("%s/count_tokens is passed through: it counts the client's full history, not the render "
                     "the proxy sends", MESSAGES_PATH)
        return await passthrough("messages/count_tokens", request)

    @app.get(STATS_PATH)
    async def stats() -> dict[str, Any]:
        """The proxy's totals since start, per rendered API: answered requests, those with usage, and the
        upstream's billed figures summed (docs/service.md, "Prompt-cache usage")."""
        return state.stats_json()

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> Response:
        base_url = state.base_url
        try:
            up = await state.http.get(str(base_url.join(base_url.path.rstrip("/") + "/models")),
                                      headers=state.upstream_headers(request), params=state.base_params)
        except httpx.HTTPError as e:
            return _unreachable(e)
        return Response(up.content, status_code=up.status_code, headers=_relay_headers(up, {MANAGED_HEADER: "false"}))

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], response_model=None)
    async def passthrough(path: str, request: Request) -> Response:
        """Other OpenAI endpoints (embeddings, …) go upstream untouched — under the upstream's base path only.

        Their answers say so (``X-ContextRender-Managed: false``); the first time an endpoint that generates
        from a conversation (``/v1/completions``, ``/v1/responses/compact``, …) passes, a warning says that
        its history is not held under B.
        """
        handler = managed.get(path.rstrip("/")) if request.method == "POST" else None
        if handler is not None:
            return await handler(state, request)
        if _generates(request.method, path):
            state.warn_once(f"path:{path}", "POST /v1/%s is passed through unmanaged: the proxy renders only "
                            "/v1/chat/completions, %s and %s, so this history is not held under B (further "
                            "requests to it are passed through without this warning)", path, RESPONSES_PATH,
                            MESSAGES_PATH)
        url = _below(state.base_url, path)
        if url is None:
            return _oai_error(400, "path must stay below the upstream base URL (no '.', '..', '%', backslashes or "
                                   "empty segments)")
        headers = state.upstream_headers(request)
        try:
            up = await state.http.request(request.method, url, params=state.base_params.merge(request.query_params),
                                          content=await request.body(), headers=headers)
        except httpx.HTTPError as e:
            return _unreachable(e)
        return Response(up.content, status_code=up.status_code, headers=_relay_headers(up, {MANAGED_HEADER: "false"}))


#: Path segments of endpoints that generate from a conversation: passed through, their history is not rendered.
_GENERATIVE = frozenset({"completions", "responses", "messages", "runs", "realtime", "compact"})
#: Last segments of endpoints that only count a conversation's tokens.
_COUNTING = frozenset({"count_tokens", "input_tokens"})


def _generates(method: str, path: str) -> bool:
    segments = path.strip("/").split("/")
    return method == "POST" and bool(_GENERATIVE.intersection(segments)) and segments[-1] not in _COUNTING


# -- one chat completion ----------------------------------------------------------------


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request that passed the proxy's checks, and where and how to render it."""

    body: dict[str, Any]
    messages: list[Any]
    key: str  # the session key (the fork the history lands in may differ)
    budget: int
    method: str
    overrides: dict[str, Any] | None


def _json_object(raw: bytes) -> dict[str, Any] | JSONResponse:
    """The body as a JSON object whose text is valid Unicode, or the 400 that says why not."""
    try:
        body = json.loads(raw, parse_constant=_no_constants)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        return _oai_error(400, f"request body is not valid JSON: {e}")
    except RecursionError:
        return _oai_error(400, "request body is nested too deeply")
    if not isinstance(body, dict):
        return _oai_error(400, "request body must be a JSON object")
    try:  # everything that goes upstream must be valid Unicode, checked before anything is stored
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return _oai_error(400, "request body holds text that is not valid Unicode (a lone surrogate)")
    return body


def parse_chat_request(state: ProxyState, raw: bytes, headers: Mapping[str, str]) -> ChatRequest | JSONResponse:
    """Check a chat completion request before anything is stored; a refusal is the 400 to answer with."""
    body = _json_object(raw)
    if isinstance(body, JSONResponse):
        return body
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _oai_error(400, "'messages' must be a non-empty list of chat messages")
    settings = _render_settings(state, messages, headers)
    if isinstance(settings, JSONResponse):
        return settings
    key, b, m, overrides = settings
    return ChatRequest(body=body, messages=messages, key=key, budget=b, method=m, overrides=overrides)


def _render_settings(state: ProxyState, messages: list[Any], headers: Mapping[str, str]
                     ) -> tuple[str, int, str, dict[str, Any] | None] | JSONResponse:
    """Session key, budget, method and overrides of a request (its ``X-ContextRender-*`` headers, else the
    proxy's defaults; the key derived from the OpenAI-format ``messages``), or the 400 that refuses them."""
    key = headers.get(SESSION_HEADER)
    if key is not None and not valid_session_id(key):
        return _oai_error(400, f"invalid {SESSION_HEADER} header: 1-200 characters from [A-Za-z0-9._:~@+=-]")
    if key is None:
        try:
            key = derive_session_key(messages)
        except Exception:  # noqa: BLE001 - malformed entries are reported by the sync below
            key = derive_session_key([])
    b = state.budget
    if headers.get(BUDGET_HEADER):
        raw_b = headers[BUDGET_HEADER].strip()
        # Decimal text of at most MAX_BUDGET_DIGITS digits: int() of thousands of digits is refused (or slow).
        if not raw_b.isascii() or not raw_b.isdigit() or len(raw_b) > MAX_BUDGET_DIGITS:
            return _oai_error(400, f"{BUDGET_HEADER} must be a positive integer of at most {MAX_BUDGET_DIGITS} "
                                   "digits (tokens of history)")
        b = int(raw_b)
        if not 1 <= b <= MAX_BUDGET:
            return _oai_error(400, f"{BUDGET_HEADER}: {b} tokens is not a history budget: give B between 1 and "
                                   f"{MAX_BUDGET:,} (the tokens of history each request may send), or drop the "
                                   f"header to use the proxy's default ({state.budget})")
    m = headers.get(METHOD_HEADER) or state.method
    return key, b, m, state.overrides if m == state.method else None


def _answer_headers(res: RenderResult, budget: int) -> dict[str, str]:
    """The ``X-ContextRender-*`` headers of the answer: session, history tokens, budget, call readiness."""
    extra = {"x-contextrender-session": res.session, "x-contextrender-tokens": str(res.tokens),
             "x-contextrender-budget": str(budget)}
    ready = res.readiness
    if ready.needing_calls:  # the session's answers so far: calls ready / calls that needed a value
        extra["x-contextrender-ready"] = f"{ready.ready_calls}/{ready.needing_calls}"
    return extra


def _log_render(res: RenderResult, budget: int, seconds: float) -> None:
    hidden = [f"{c.call} ({', '.join(c.missing)})" for c in res.readiness.previous_answer if c.missing]
    log.info("session %s: %d messages (+%d) -> %d history tokens (B=%d, %s) in %.1f ms%s%s", res.session,
             res.stored, res.added, res.tokens, budget, res.method, 1e3 * seconds,
             " [forked]" if res.forked else "",
             f"; the previous answer's calls lacked values the render hid: {'; '.join(hidden)}" if hidden else "")


async def handle_chat_completions(state: ProxyState, request: Request) -> Response:
    """``POST /v1/chat/completions``: sync and render the history, forward it, record and relay the answer.

    Requests of one session run one at a time: the session's lock is held until the answer is
    recorded (for a stream, until the relay ends).
    """
    req = parse_chat_request(state, await request.body(), request.headers)
    if isinstance(req, JSONResponse):
        return req

    def render(budget: int) -> tuple[RenderResult, dict[str, Any]]:
        res = state.service.render(req.key, messages=req.messages, budget=budget, method=req.method,
                                   overrides=req.overrides, on_conflict="fork", offer_expand=True)
        return res, {**req.body, "messages": forwarded_messages(req.messages, res)}

    return await _relay_rendered(state, request, req.key, req.budget, render, CHAT_API)


#: The status logged for a request whose client left before the answer (nginx's "client closed request").
CLIENT_GONE = 499


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (its body was read already, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """``work`` (the upstream call), cancelled as soon as the client disconnects: the upstream request is
    closed and the caller's ``finally`` frees the session at once, not when the upstream answers or times out."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done() and not gone.done():  # this coroutine itself was cancelled
            task.cancel()
        gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    log.info("client disconnected before the upstream answered; upstream request cancelled")
    return Response(status_code=CLIENT_GONE)


def startup_line(app: FastAPI, listen: str, graph_path: str) -> str:
    """The one line a started proxy prints: where it listens, where each API goes, B, the method, the embedder,
    the graph file (no credentials or query of the upstream URL)."""
    state: ProxyState = app.state.proxy
    apis = {"Chat Completions": "chat/completions", "Responses": "responses", "Messages": "messages"}
    routes = "; ".join(f"{name} -> {redact(_api_url(state, path))}" for name, path in apis.items())
    return (f"contextrender proxy: listening on {listen}; {routes}; B={state.budget}, method={state.method}, "
            f"embedder={getattr(state.service.embedder, 'name', '?')}, graph={graph_path}")


def _api_url(state: ProxyState, path: str) -> str:
    """The upstream URL of one of the rendered APIs' fixed paths."""
    url = _below(state.base_url, path)
    assert url is not None  # a fixed, clean relative path always stays below the base
    return url


class _Unrecorded(Exception):
    """An upstream answer the proxy relays but cannot record; the message says why (it is logged)."""


@dataclass(frozen=True)
class _Api:
    """What differs between the rendered APIs once the conversation is rendered: where the request goes, whose
    headers and error shape the client speaks, how a streamed answer is assembled and a whole one read (its
    assistant message, and its ``usage`` object as billed: each API's own reader)."""

    name: str  # what the usage rows and /stats call it
    path: str  # below the upstream base URL
    anthropic: bool | None  # the client's key header (None: by its anthropic-version header)
    error: Callable[[int, str], JSONResponse]
    assembler: Callable[[], _Assembler]
    answer: Callable[[Any], dict[str, Any]]  # the assistant message of the JSON body to record; raises _Unrecorded
    usage: Callable[[Any], PromptUsage | None]  # the JSON body's ``usage`` object as billed (None: unknown)
    wire: expansion.Wire  # the expand tool's pieces in this API's shape


def _chat_answer(data: Any) -> dict[str, Any]:
    try:
        msg = dict(data["choices"][0]["message"])
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise _Unrecorded(f"upstream answer has no choices[0].message ({type(e).__name__}); not recorded") from None
    msg.setdefault("role", "assistant")
    return msg


def _messages_answer(data: Any) -> dict[str, Any]:
    try:
        return anthropic_messages.assistant_message(data["content"])
    except (ValueError, KeyError, TypeError, ServiceError) as e:
        raise _Unrecorded(f"upstream answer has no content blocks ({type(e).__name__}); not recorded") from None


def _responses_answer(data: Any) -> dict[str, Any]:
    try:
        output = data.get("output") if isinstance(data, dict) else None
        if isinstance(output, list) and output:
            return responses_api.assistant_message(output)
    except ServiceError as e:  # an item it cannot read (a call without call_id)
        raise _Unrecorded(f"upstream response not recorded ({type(e).__name__})") from None
    raise _Unrecorded("upstream response not recorded (no output items)")


def _json_of(up: httpx.Response) -> Any:
    """The upstream's JSON body, parsed once for both readers (None when it is not JSON: nothing to read)."""
    try:
        return up.json()
    except (ValueError, UnicodeDecodeError):
        return None


CHAT_API = _Api("chat", "chat/completions", None, _oai_error, StreamAssembler, _chat_answer, chat_prompt_usage,
                chat_completions.WIRE)
MESSAGES_API = _Api("messages", "messages", True, _anthropic_error, AnthropicStreamAssembler, _messages_answer,
                    anthropic_messages.prompt_usage,
                    anthropic_messages.WIRE)
RESPONSES_API = _Api("responses", "responses", False, _oai_error, ResponsesStreamAssembler, _responses_answer,
                     responses_api.prompt_usage,
                     responses_api.WIRE)
#: The rendered APIs, by the name their usage is counted under.
APIS: Mapping[str, _Api] = {a.name: a for a in (CHAT_API, MESSAGES_API, RESPONSES_API)}


async def _relay_rendered(state: ProxyState, request: Request, key: str, budget: int,
                          render: Callable[[int], tuple[RenderResult, dict[str, Any]]], api: _Api,
                          params: httpx.QueryParams | None = None) -> Response:
    """The steps every rendered API shares: under the session's lock, ``render`` (in a worker thread: sync, render
    under the budget it is given, and the body to forward), then forward it and record and relay the answer — through
    the expand loop (:func:`_forward_expanding`) when the render's markers carry handles.

    Requests of one session run one at a time: the lock is held until the answer is recorded (for a stream,
    until the relay ends, when the relaying response releases it).
    """
    release = await state.key_locks.acquire(key)
    handed_off = False
    try:
        t0 = time.perf_counter()
        try:
            res, fwd = await run_in_threadpool(render, budget)
        except ServiceError as e:
            return api.error(STATUS_OF_KIND[e.kind], e.message)
        extra = _answer_headers(res, budget)
        _log_render(res, budget, time.perf_counter() - t0)
        headers = state.upstream_headers(request, anthropic=api.anthropic)
        headers["content-type"] = "application/json"
        url = _api_url(state, api.path)
        params = state.base_params if params is None else params
        if expansion.offers(res) and _can_expand(api, fwd):  # offered only where it can run (the render functions)
            loop = expansion.Loop(state.service, res, api.wire, fwd, budget)
            return await unless_disconnected(request, _forward_expanding(state, loop, render, url, params, headers,
                                                                         extra, api))
        payload = json.dumps(fwd, ensure_ascii=False).encode()
        if not fwd.get("stream"):
            return await unless_disconnected(request, _forward(state, res, url, params, payload, headers, extra,
                                                               api))
        if res.prompt_usage.known:  # docs/service.md, "Prompt-cache usage": the session's before this request
            extra[CACHE_HEADER] = cache_header(res.prompt_usage.usage, "session", res.prompt_usage.known)
        out = await unless_disconnected(request, _forward_stream(state, res, url, params, payload, headers,
                                                                 extra, release, api))
        handed_off = isinstance(out, _RelayResponse)
        return out
    finally:
        if not handed_off:
            release()


async def _forward(state: ProxyState, res: RenderResult, url: str, params: httpx.QueryParams, payload: bytes,
                   headers: dict[str, str], extra: dict[str, str], api: _Api) -> Response:
    """A non-streaming answer: forward, record the assistant message it holds and its usage, answer with the
    upstream's response (and this request's usage in ``X-ContextRender-Cache``)."""
    try:
        up = await state.http.post(url, content=payload, headers=headers, params=params)
    except httpx.HTTPError as e:
        return _unreachable(e, api.error)
    if up.status_code < 400:
        data = _json_of(up)
        usage = api.usage(data.get("usage")) if isinstance(data, dict) else None
        msg = None
        if data is None:
            log.warning("session %s: upstream answer is not JSON; not recorded", res.session)
        else:
            try:
                msg = api.answer(data)
            except _Unrecorded as e:
                log.warning("session %s: %s", res.session, e)
        await run_in_threadpool(state.record_answer, res, api, msg, usage, False)
        if usage is not None:  # docs/service.md, "Prompt-cache usage": a whole answer's own figures
            extra = {**extra, CACHE_HEADER: cache_header(usage, "request")}
    return Response(up.content, status_code=up.status_code, headers=_relay_headers(up, extra))


async def _forward_stream(state: ProxyState, res: RenderResult, url: str, params: httpx.QueryParams,
                          payload: bytes, headers: dict[str, str], extra: dict[str, str],
                          release: Callable[[], None], api: _Api) -> Response:
    """A streaming answer: an upstream error comes back whole; a stream is relayed as it arrives
    (:func:`_relay`, ``api``'s assembler putting the answer together for the record), and the response that
    relays it takes over ``release``."""
    client = state.http
    try:
        up = await client.send(client.build_request("POST", url, content=payload, headers=headers, params=params),
                               stream=True)
    except httpx.HTTPError as e:
        return _unreachable(e, api.error)
    if up.status_code >= 400:
        return await _read_whole(up, extra)
    closed = False

    async def on_close() -> None:
        nonlocal closed
        if not closed:
            closed = True
            try:
                await up.aclose()
            finally:
                release()

    return _RelayResponse(_relay(state, up, res, api), on_close, status_code=up.status_code,
                          headers=_relay_headers(up, extra))


def _can_expand(api: _Api, fwd: Mapping[str, Any]) -> bool:
    """Whether the expand loop can run on this forwarded body: its history is a list (and, for the Messages API,
    ends with the user's turn: an assistant prefill is continued by the model, not answered)."""
    history = fwd.get(api.wire.history)
    if not isinstance(history, list) or not history:
        return False
    return api is not MESSAGES_API or (isinstance(history[-1], dict) and history[-1].get("role") == "user")


async def _forward_expanding(state: ProxyState, loop: expansion.Loop, render: Callable[[int], tuple[RenderResult,
                             dict[str, Any]]], url: str, params: httpx.QueryParams, headers: dict[str, str],
                             extra: dict[str, str], api: _Api) -> Response:
    """The expand loop (:mod:`~contextrender.service.expansion`): forward with the tool added; an answer that calls
    it is answered here and the request sent again with the round appended; the first answer without expand calls
    is the client's, recorded and relayed as it came (a stream is read whole first, then relayed byte for byte: the
    client sees no stream of an answer that was not its own). Every round's usage is recorded as billed."""
    res = loop.res
    client = state.http
    while True:
        payload = json.dumps(loop.body(), ensure_ascii=False).encode()
        streamed = bool(loop.fwd.get("stream"))
        chunks: list[bytes] = []
        try:
            if streamed:
                up = await client.send(client.build_request("POST", url, content=payload, headers=headers,
                                                            params=params), stream=True)
                if up.status_code >= 400:
                    return await _read_whole(up, extra)
                asm = api.assembler()
                try:
                    async for chunk in up.aiter_bytes():
                        chunks.append(chunk)
                        asm.feed(chunk)
                finally:
                    await up.aclose()
                asm.close()
                complete = asm.complete
                msg = asm.message() if complete else None
                raw = api.wire.streamed(asm) if complete else None
                usage = asm.usage()
            else:
                up = await client.post(url, content=payload, headers=headers, params=params)
                if up.status_code >= 400:
                    return Response(up.content, status_code=up.status_code, headers=_relay_headers(up, extra))
                data = _json_of(up)
                try:
                    msg = api.answer(data) if data is not None else None
                except _Unrecorded:
                    msg = None
                raw = api.wire.whole(data)
                usage = api.usage(data.get("usage")) if isinstance(data, dict) else None
        except httpx.HTTPError as e:
            return _unreachable(e, api.error)
        if msg is None or not expansion.expand_calls(msg):  # the client's answer
            await run_in_threadpool(state.record_answer, res, api, msg, usage, streamed)
            final = dict(extra)
            if loop.expanded:
                final[expansion.EXPANSIONS_HEADER] = str(loop.expanded)
            if loop.rerendered:
                final[expansion.RERENDERS_HEADER] = str(loop.rerendered)
            if usage is not None and not streamed:
                final[CACHE_HEADER] = cache_header(usage, "request")
            body = b"".join(chunks) if streamed else up.content
            return Response(body, status_code=up.status_code, headers=_relay_headers(up, final))
        await run_in_threadpool(state.record_answer, res, api, None, usage, streamed)  # billed, not the client's
        try:
            again = await run_in_threadpool(loop.answer, msg, raw)
        except expansion.Stop as e:
            log.warning("session %s: %s", res.session, e)
            return api.error(502, str(e))
        except ServiceError as e:
            return api.error(STATUS_OF_KIND[e.kind], e.message)
        with state.stats_lock:
            state.expansions += len(expansion.expand_calls(msg))
        if again is not None:
            try:
                loop.rendered_again(*await run_in_threadpool(render, again))
            except ServiceError as e:
                return api.error(STATUS_OF_KIND[e.kind], e.message)
        log.info("session %s: expand round %d answered (%d expansions so far, +%d history tokens)", res.session,
                 loop.rounds, loop.expanded, loop.added)


async def _read_whole(up: httpx.Response, extra: dict[str, str]) -> Response:
    """The upstream's whole answer (an error's body), relayed; ``up`` is closed however the read ends (the
    client leaving cancels it)."""
    try:
        data = await up.aread()
    finally:
        await up.aclose()
    return Response(data, status_code=up.status_code, headers=_relay_headers(up, extra))


async def _relay(state: ProxyState, up: httpx.Response, res: RenderResult, api: _Api) -> AsyncIterator[bytes]:
    """The upstream's chunks, unchanged, while the answer is assembled and recorded with its usage (best effort)."""
    # Relay first: a chunk reaches the client whatever assembling or recording it does.
    sid = res.session
    asm: _Assembler | None = api.assembler()
    recorded = False
    async for chunk in up.aiter_bytes():
        if asm is not None:
            try:
                asm.feed(chunk)
            except Exception as e:  # noqa: BLE001 - never let recording break the stream
                log.warning("session %s: cannot assemble the stream (%s); not recorded", sid, type(e).__name__)
                asm = None
        if asm is not None and asm.done and asm.complete and not recorded:
            # Record before the client sees [DONE] (message_stop): its next request carries this message. Every
            # API's usage has come by then (chat's in the chunk before [DONE]).
            await run_in_threadpool(state.record_answer, res, api, asm.message(), asm.usage(), True)
            recorded = True
        yield chunk
    if recorded:
        return
    msg = None
    try:
        if asm is not None:
            asm.close()
            if asm.complete:
                msg = asm.message()
            else:
                log.warning("session %s: upstream stream ended without %s (or with an error); not recorded", sid,
                            asm.FINISH)
    except Exception as e:  # noqa: BLE001
        log.warning("session %s: cannot assemble the stream (%s); not recorded", sid, type(e).__name__)
        asm = None
    # The upstream answered: its usage is recorded whatever became of the message (unknown without one).
    await run_in_threadpool(state.record_answer, res, api, msg, asm.usage() if asm is not None else None, True)



# -- one Messages API request (Anthropic) ------------------------------------------------


@dataclass(frozen=True)
class MessagesRequest:
    """A Messages API request that passed the proxy's checks: the body, its conversation as the graph
    stores it (:func:`~contextrender.service.anthropic_messages.to_openai`), and where and how to render it."""

    body: dict[str, Any]
    converted: anthropic_messages.Converted
    key: str
    budget: int
    method: str
    overrides: dict[str, Any] | None


def parse_messages_request(state: ProxyState, raw: bytes,
                           headers: Mapping[str, str]) -> MessagesRequest | JSONResponse:
    """Check a Messages API request before anything is stored; a refusal is the 400 to answer with."""
    body = _json_object(raw)
    if isinstance(body, JSONResponse):
        return body
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _anthropic_error(400, "'messages' must be a non-empty list of messages")
    try:
        converted = anthropic_messages.to_openai(body.get("system"), messages)
    except ServiceError as e:
        return _anthropic_error(STATUS_OF_KIND[e.kind], e.message)
    settings = _render_settings(state, list(converted.messages), headers)
    if isinstance(settings, JSONResponse):
        return settings
    key, b, m, overrides = settings
    return MessagesRequest(body=body, converted=converted, key=key, budget=b, method=m, overrides=overrides)


async def handle_messages(state: ProxyState, request: Request) -> Response:
    """``POST /v1/messages``: the chat path's steps for the Anthropic Messages API.

    The conversation is stored as OpenAI-format messages (``system`` as the system prompt, each
    ``tool_result`` block a tool message); the render goes upstream as the client's own Messages API
    messages (:func:`~contextrender.service.anthropic_messages.forwarded_messages`: kept messages and
    blocks untouched, ``tool_use``/``tool_result`` pairs kept together), with ``system``, ``tools`` and
    every other field as sent, and the client's query (``?beta=true``) kept. The answer (JSON, or SSE
    relayed as it arrives) is recorded like a chat completion's.
    """
    req = parse_messages_request(state, await request.body(), request.headers)
    if isinstance(req, JSONResponse):
        return req

    def render(budget: int) -> tuple[RenderResult, dict[str, Any]]:
        res = state.service.render(req.key, messages=list(req.converted.messages), budget=budget,
                                   method=req.method, overrides=req.overrides, on_conflict="fork",
                                   offer_expand=_can_expand(MESSAGES_API, req.body))
        return res, {**req.body, "messages": anthropic_messages.forwarded_messages(req.body["messages"],
                                                                                  req.converted, res,
                                                                                  request=req.body)}

    return await _relay_rendered(state, request, req.key, req.budget, render, MESSAGES_API,
                                 state.base_params.merge(request.query_params))


# -- one Responses API request (OpenAI) ---------------------------------------------------


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses API request that passed the proxy's checks: the body, its conversation as the graph
    stores it (:func:`~contextrender.service.responses_api.to_openai`), and where and how to render it."""

    body: dict[str, Any]
    converted: responses_api.Converted
    key: str
    budget: int
    method: str
    overrides: dict[str, Any] | None
    #: Whether ``input`` holds a call after outputs that may be the same model turn's (then the conversion
    #: asks the stored answers, :meth:`ContextService.answered_together`, under the session's lock).
    interleaved: bool = False

    def conversation(self, service: ContextService) -> responses_api.Converted:
        """The conversation as the graph stores it: :attr:`converted`, or, when calls and outputs interleave,
        converted again with what the stored answers of the session say about its model turns."""
        if not self.interleaved:
            return self.converted
        together: dict[str, frozenset[str]] | None = None

        def answered_together(call_id: str) -> frozenset[str]:
            nonlocal together
            if together is None:
                together = service.answered_together(self.key)
            return together.get(call_id, frozenset())

        return responses_api.to_openai(self.body.get("instructions"), self.body["input"], answered_together)


def stateful_refusal(fields: list[str]) -> str:
    """The 400's message for a Responses API request that relies on upstream state (``fields`` say which)."""
    return (f"this request relies on conversation state the upstream keeps ({', '.join(fields)}): the ContextRender "
            "proxy never sees that history, so it cannot hold it under the budget. Send the whole conversation "
            "in 'input' instead, or start the proxy with --stateful-responses passthrough "
            "(create_proxy_app(stateful_responses='passthrough')) to forward such requests unmanaged")


def parse_responses_request(state: ProxyState, raw: bytes,
                            headers: Mapping[str, str]) -> ResponsesRequest | JSONResponse:
    """Check a Responses API request before anything is stored; a refusal is the 400 to answer with.

    A request that relies on upstream state is refused here unless the proxy passes such requests through
    (the caller checks :func:`~contextrender.service.responses_api.stateful_fields` first).
    """
    body = _json_object(raw)
    if isinstance(body, JSONResponse):
        return body
    stateful = responses_api.stateful_fields(body)
    if stateful:
        refusal = error_body(400, stateful_refusal(stateful))
        refusal["error"]["param"] = stateful[0] if stateful[0] in body else "input"
        return JSONResponse(refusal, 400)
    input_ = body.get("input")
    if not input_ or not isinstance(input_, (str, list)):
        return _oai_error(400, "'input' must be a non-empty string or a non-empty list of input items")
    asked: list[str] = []  # the calls whose model turn only the stored answers can tell

    def unknown(call_id: str) -> frozenset[str]:
        asked.append(call_id)
        return frozenset()

    try:
        converted = responses_api.to_openai(body.get("instructions"), input_, unknown)
    except ServiceError as e:
        return _oai_error(STATUS_OF_KIND[e.kind], e.message)
    settings = _render_settings(state, list(converted.messages), headers)
    if isinstance(settings, JSONResponse):
        return settings
    key, b, m, overrides = settings
    return ResponsesRequest(body=body, converted=converted, key=key, budget=b, method=m, overrides=overrides,
                            interleaved=bool(asked))


async def handle_responses(state: ProxyState, request: Request) -> Response:
    """``POST /v1/responses``: the chat path's steps for the OpenAI Responses API.

    The conversation (``instructions`` and ``input``) is stored as OpenAI-format messages
    (:mod:`~contextrender.service.responses_api`); the render goes upstream as the client's own input items
    (:func:`~contextrender.service.responses_api.forwarded_input`: kept items untouched, calls and outputs
    paired), with ``instructions``, ``tools`` and every other field as sent. The answer (JSON, or SSE relayed
    as it arrives) is recorded as one assistant message. A request that relies on upstream state
    (``previous_response_id``, ``conversation``) is refused, or with ``stateful_responses="passthrough"``
    forwarded as it came, unmanaged (:func:`_responses_unmanaged`).
    """
    raw = await request.body()
    if state.stateful_responses == "passthrough":
        body = _json_object(raw)
        if isinstance(body, JSONResponse):
            return body
        stateful = responses_api.stateful_fields(body)
        if stateful:
            return await unless_disconnected(request, _responses_unmanaged(state, request, raw, body, stateful))
    req = parse_responses_request(state, raw, request.headers)
    if isinstance(req, JSONResponse):
        return req

    def render(budget: int) -> tuple[RenderResult, dict[str, Any]]:
        converted = req.conversation(state.service)  # under the session's lock: it may read the stored answers
        res = state.service.render(req.key, messages=list(converted.messages), budget=budget,
                                   method=req.method, overrides=req.overrides, on_conflict="fork",
                                   offer_expand=_can_expand(RESPONSES_API, req.body))
        return res, {**req.body, "input": responses_api.forwarded_input(req.body["input"], converted, res)}

    return await _relay_rendered(state, request, req.key, req.budget, render, RESPONSES_API)


async def _responses_unmanaged(state: ProxyState, request: Request, raw: bytes, body: dict[str, Any],
                               stateful: list[str]) -> Response:
    """A request that relies on upstream state, forwarded as it came (``stateful_responses="passthrough"``):
    nothing is stored or rendered; the answer says so (``X-ContextRender-Managed: false``)."""
    state.warn_once("stateful-responses", "a %s request relies on upstream state (%s): passed through unmanaged, "
                    "its history is not held under B (--stateful-responses passthrough; further ones are passed "
                    "through without this warning)", RESPONSES_PATH, ", ".join(stateful))
    extra = {MANAGED_HEADER: "false"}
    headers = state.upstream_headers(request, anthropic=False)
    headers["content-type"] = "application/json"
    client = state.http
    try:
        up = await client.send(client.build_request("POST", _api_url(state, "responses"), content=raw, headers=headers,
                                                    params=state.base_params), stream=bool(body.get("stream")))
    except httpx.HTTPError as e:
        return _unreachable(e)
    if not body.get("stream") or up.status_code >= 400:
        return await _read_whole(up, extra)
    return _RelayResponse(up.aiter_bytes(), up.aclose, status_code=up.status_code, headers=_relay_headers(up, extra))


__all__ = ["anthropic_error_body", "API_KEY_ENV", "CACHE_HEADER", "cache_header", "ChatRequest", "create_proxy_app",
           "handle_chat_completions", "handle_messages", "handle_responses", "MANAGED_HEADER", "MESSAGES_PATH",
           "MessagesRequest", "parse_chat_request", "parse_messages_request", "parse_responses_request", "ProxyState",
           "RESPONSES_PATH", "ResponsesRequest", "SESSION_HEADER", "stateful_refusal", "STATS_PATH", "STATUS_OF_KIND"]
