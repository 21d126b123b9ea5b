"""An OpenAI-compatible proxy that renders ``messages`` before forwarding (spec §9).

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
   omitted result's body (its marker) or a clipped task message changes;
4. everything else in the body (tools, tool_choice, stream, stream_options,
   temperature, …) goes upstream unchanged, with the client's Authorization
   header or, if it sent none (or sent the proxy's own access token there),
   ``Bearer $CONTEXTRENDER_UPSTREAM_API_KEY``;
5. the answer is recorded: non-streaming, the assistant message; streaming,
   SSE chunks are relayed unchanged as they arrive while content and
   tool-call fragments are assembled (:class:`StreamAssembler`), and the
   assembled assistant message is added to the graph *before* the final
   ``[DONE]`` is relayed, so the client's next request — which carries that
   message — syncs cleanly. Recording is best effort: a failure to assemble
   or store is logged and never breaks the relay.

Access (:mod:`contextrender.guard`): only loopback ``Host`` names (plus
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
``X-ContextRender-Budget`` and ``X-ContextRender-Method`` request headers
override the defaults per request (a method named there gets no CLI
overrides). The session API of server.py is mounted too (``/sessions/...``),
so recorded sessions can be inspected and exported, unless
``session_api=False`` (``--no-session-api``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from contextrender import __version__
from contextrender.adapters._common import derive_session_key, valid_session_id
from contextrender.events import Message
from contextrender.redact import redact
from contextrender.service.guard import AUTH_STATE_KEY, TOKEN_HEADER, AccessPolicy, Guard, error_body
from contextrender.service.server import (
    DEFAULT_MAX_BODY,
    BodyLimitMiddleware,
    ContextService,
    ServiceError,
    install_error_handlers,
    session_router,
)

log = logging.getLogger(__name__)

API_KEY_ENV = "CONTEXTRENDER_UPSTREAM_API_KEY"
SESSION_HEADER = "x-contextrender-session"
BUDGET_HEADER = "x-contextrender-budget"
METHOD_HEADER = "x-contextrender-method"

# Request headers not forwarded upstream (hop-by-hop, recomputed, or ours).
_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                 "te", "trailer", "transfer-encoding", "upgrade", "accept-encoding", "cookie"}
# Response headers not relayed (httpx decodes the body, so length/encoding change).
_DROP_RESPONSE = {"content-length", "content-encoding", "transfer-encoding", "connection", "keep-alive"}


def _oai_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message), status, headers=headers)


class StreamAssembler:
    """Rebuilds choice 0's assistant message from OpenAI SSE chunks.

    Content deltas are concatenated. Tool-call fragments follow OpenAI's
    chunk semantics: a fragment's ``index`` names its call; a fragment with
    an ``id`` the call at that index (or, without an index, the latest call)
    does not have starts a new call; a fragment with neither index nor id
    continues the latest call. The id and name come from the first fragment
    that has them; argument strings are concatenated in arrival order.
    Malformed events (not JSON, a non-object delta or fragment) are counted
    in ``bad_events`` and skipped: assembling never raises on upstream data.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._content: list[str] = []
        self._calls: list[dict[str, Any]] = []  # in order of first appearance
        self._by_index: dict[int, int] = {}  # fragment index -> position in _calls
        self.finish_reason: str | None = None
        self.done = False  # saw ``data: [DONE]``
        self.bad_events = 0

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                return
            line, self._buf = self._buf[:i].rstrip(b"\r"), self._buf[i + 1:]
            self._line(line.decode("utf-8", "replace"))

    def close(self) -> None:
        if self._buf:
            self._line(self._buf.rstrip(b"\r").decode("utf-8", "replace"))
            self._buf = b""
        self._dispatch()

    def _line(self, line: str) -> None:
        if not line:
            self._dispatch()
            return
        if line.startswith(":"):
            return  # SSE comment / keep-alive
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)

    def _dispatch(self) -> None:
        if not self._data:
            return
        data, self._data = "\n".join(self._data), []
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            self.bad_events += 1
            return
        choices = obj.get("choices") if isinstance(obj, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                continue
            delta = choice.get("delta")
            if delta is None:
                delta = {}
            if not isinstance(delta, dict):
                self.bad_events += 1
                delta = {}
            if isinstance(delta.get("content"), str):
                self._content.append(delta["content"])
            frags = delta.get("tool_calls")
            for frag in frags if isinstance(frags, list) else []:
                if isinstance(frag, dict):
                    self._fragment(frag)
                else:
                    self._bad()
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def _bad(self) -> None:
        self.bad_events += 1

    def _new_call(self, index: int | None) -> dict[str, Any]:
        call: dict[str, Any] = {"id": None, "name": "", "arguments": ""}
        self._calls.append(call)
        if index is not None:
            self._by_index[index] = len(self._calls) - 1
        return call

    def _fragment(self, frag: dict[str, Any]) -> None:
        raw_index = frag.get("index")
        index = raw_index if isinstance(raw_index, int) and not isinstance(raw_index, bool) else None
        fid = frag.get("id") if isinstance(frag.get("id"), str) and frag.get("id") else None
        if index is not None and index in self._by_index:
            cur = self._calls[self._by_index[index]]
            if fid and cur["id"] and fid != cur["id"]:
                cur = self._new_call(index)
        elif index is not None:
            cur = self._new_call(index)
        elif not self._calls or (fid and self._calls[-1]["id"] and fid != self._calls[-1]["id"]):
            cur = self._new_call(None)
        else:
            cur = self._calls[-1]
        if fid and not cur["id"]:
            cur["id"] = fid
        fn = frag.get("function")
        if fn is None:
            return
        if not isinstance(fn, dict):
            self._bad()
            return
        name = fn.get("name")
        if isinstance(name, str) and name and name != cur["name"]:
            # Some servers split the name across fragments; most send it whole, once.
            cur["name"] = name if not cur["name"] else cur["name"] + name
        args = fn.get("arguments")
        if isinstance(args, str):
            cur["arguments"] += args
        elif isinstance(args, dict):  # a few servers send the object itself
            cur["arguments"] += json.dumps(args, ensure_ascii=False)

    @property
    def complete(self) -> bool:
        return self.done or self.finish_reason is not None

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        # A fragment that carried nothing usable (junk at a fresh index) leaves an empty shell: not a call.
        calls = [c for c in self._calls if c["id"] or c["name"] or c["arguments"]]
        if calls:
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for c in calls]
        return msg


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


def _forward_messages(original: list[Any], rendered: dict[str, Any]) -> list[Any]:
    """The rendered history in the client's own message dicts; only changed bodies are replaced.

    After a sync, stored seq i is the client's message i, so ``layout`` (the
    render's ``Rendered.sources``) indexes ``original`` directly.
    """
    out: list[Any] = []
    for msg, seq in zip(rendered["messages"], rendered["layout"], strict=True):
        if seq is None:
            out.append(msg)
            continue
        orig = original[seq]
        body = msg.get("content") or ""
        if Message.from_openai(orig).content == body:
            out.append(orig)
        else:
            out.append({**orig, "content": msg.get("content")})
    return out


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
    # Chat completions and the session API take JSON only; other OpenAI endpoints also take uploads.
    if path.startswith("/v1/") and path != "/v1/chat/completions":
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
    if "\\" in path or "%" in path or any(s in (".", "..") for s in segments) or "" in segments[:-1]:
        return None
    url = base.copy_with(path=base.path.rstrip("/") + "/" + path)
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


def create_proxy_app(upstream: str, graph_path: str = ":memory:", *, budget: int = 6000,
                     method: str = "contextrender", overrides: dict[str, Any] | None = None,
                     embedding: str = "local", compactor: Any = "extractive", api_key_env: str = API_KEY_ENV,
                     force_env_key: bool = False, max_body_bytes: int = DEFAULT_MAX_BODY, timeout: float = 600.0,
                     connect_timeout: float = 10.0, service: ContextService | None = None,
                     session_api: bool = True, access: AccessPolicy | None = None, warm: bool = True) -> FastAPI:
    """The proxy app. ``upstream`` is the provider's OpenAI base URL, e.g. ``https://api.openai.com/v1``.

    ``force_env_key``: send the env key even when the client sent its own
    Authorization (for SDKs that insist on a placeholder key).
    ``session_api``: also mount the session API (``/sessions/...``: full
    transcripts); turn it off when only the proxy is needed.
    ``access``: accepted hosts, browser origins and token
    (:mod:`contextrender.guard`); by default loopback host names only, no
    browser origin, no token. A client that authenticates with
    ``Authorization: Bearer <token>`` gets the env key sent upstream in its
    place; one that uses ``X-ContextRender-Token`` keeps its own
    Authorization.
    ``warm``: load the embedding model at start-up, before the first request
    (:class:`~contextrender.service.server.ContextService`); ignored when ``service`` is given.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    base_url, basic_auth = _split_upstream(upstream)
    # A query in --upstream (Azure's ?api-version=...) goes on every upstream request.
    base_params = httpx.QueryParams(base_url.params)
    base_url = base_url.copy_with(query=None)
    access = access or AccessPolicy.for_bind("127.0.0.1")
    owned = service is None
    svc = service or ContextService(graph_path, default_method=method, default_budget=budget,
                                    embedding=embedding, compactor=compactor, warm=warm, overrides=overrides)
    try:
        svc.policy(method, overrides)  # fail at start-up on a bad method or override
    except ServiceError as e:
        if owned:
            svc.close()
        raise ValueError(e.message) from None
    env_key = os.environ.get(api_key_env) or None
    state: dict[str, Any] = {}
    key_locks = _KeyLocks()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        state["client"] = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=connect_timeout))
        try:
            yield
        finally:
            await state["client"].aclose()
            if owned:
                svc.close()

    # No /docs or /openapi.json: the Swagger page loads scripts from a CDN into this origin.
    app = FastAPI(title="ContextRender proxy", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.service = svc
    app.state.key_locks = key_locks
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(Guard, policy=access, body_types=_proxy_body_types)
    install_error_handlers(app)
    if session_api:
        app.include_router(session_router(svc))

    token_values = _token_forms(access.token)

    def upstream_headers(request: Request) -> dict[str, str]:
        token_in_auth = bool(request.scope.get("state", {}).get(AUTH_STATE_KEY))
        # The access token never goes upstream, in whichever header a client put it.
        h = {k: v for k, v in request.headers.items()
             if k.lower() not in _DROP_REQUEST and not k.lower().startswith("x-contextrender-")
             and k.lower() != TOKEN_HEADER and not (token_in_auth and k.lower() == "authorization")
             and v.strip().lower() not in token_values}
        has_auth = any(k.lower() == "authorization" for k in h)
        if env_key and (force_env_key or not has_auth):
            h = {k: v for k, v in h.items() if k.lower() != "authorization"}
            h["authorization"] = f"Bearer {env_key}"
        elif basic_auth is not None and not has_auth:  # credentials given in --upstream, used only when nothing else
            h["authorization"] = basic_auth
        return h

    def relay_headers(resp: httpx.Response, extra: dict[str, str]) -> dict[str, str]:
        h = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
        h.update(extra)
        return h

    def unreachable(exc: Exception) -> JSONResponse:
        # The exception text may carry the URL (and any credentials in it): name the type only.
        if isinstance(exc, httpx.TimeoutException):
            return _oai_error(504, f"upstream timed out ({type(exc).__name__})")
        return _oai_error(502, f"upstream unreachable ({type(exc).__name__})")

    def record(sid: str, message: Any) -> None:
        """Best effort: recording never breaks relaying (the next request carries the message anyway)."""
        try:
            svc.append(sid, [message])
        except Exception as e:  # noqa: BLE001 - any failure is logged, the client still gets its answer
            log.warning("session %s: response not recorded: %s", sid, redact(str(getattr(e, "message", e))))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        raw = await request.body()
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
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _oai_error(400, "'messages' must be a non-empty list of chat messages")
        key = request.headers.get(SESSION_HEADER)
        if key is not None and not valid_session_id(key):
            return _oai_error(400, f"invalid {SESSION_HEADER} header: 1-200 characters from [A-Za-z0-9._:~@+=-]")
        if key is None:
            try:
                key = derive_session_key(messages)
            except Exception:  # noqa: BLE001 - malformed entries are reported by the sync below
                key = derive_session_key([])
        b = budget
        if request.headers.get(BUDGET_HEADER):
            raw_b = request.headers[BUDGET_HEADER].strip()
            if not raw_b.isascii() or not raw_b.isdigit():
                return _oai_error(400, f"{BUDGET_HEADER} must be a positive integer")
            b = int(raw_b)
        m = request.headers.get(METHOD_HEADER) or method
        ov = overrides if m == method else None

        release = await key_locks.acquire(key)
        handed_off = False
        try:
            t0 = time.perf_counter()
            try:
                res = await run_in_threadpool(svc.render, key, messages=messages, budget=b, method=m, overrides=ov,
                                              on_conflict="fork")
            except ServiceError as e:
                return _oai_error(400 if e.status == 422 else e.status, e.message)
            sid = res["session"]
            fwd = dict(body)
            fwd["messages"] = _forward_messages(messages, res)
            extra = {"x-contextrender-session": sid, "x-contextrender-tokens": str(res["tokens"]),
                     "x-contextrender-budget": str(b)}
            ready = res.get("readiness") or {}
            if ready.get("needing_calls"):  # the session's answers so far: calls ready / calls that needed a value
                extra["x-contextrender-ready"] = f"{ready['ready_calls']}/{ready['needing_calls']}"
            hidden = [f"{c['call']} ({', '.join(c['missing'])})" for c in ready.get("previous_answer") or ()
                      if c["missing"]]
            log.info("session %s: %d messages (+%d) -> %d history tokens (B=%d, %s) in %.1f ms%s%s", sid,
                     res["stored"], res["added"], res["tokens"], b, res["method"], 1e3 * (time.perf_counter() - t0),
                     " [forked]" if res["forked"] else "",
                     f"; the previous answer's calls lacked values the render hid: {'; '.join(hidden)}" if hidden
                     else "")
            payload = json.dumps(fwd, ensure_ascii=False).encode()
            headers = upstream_headers(request)
            headers["content-type"] = "application/json"
            client: httpx.AsyncClient = state["client"]
            url = _below(base_url, "chat/completions")
            assert url is not None

            if not body.get("stream"):
                try:
                    up = await client.post(url, content=payload, headers=headers, params=base_params)
                except httpx.HTTPError as e:
                    return unreachable(e)
                if up.status_code < 400:
                    try:
                        data = up.json()
                        msg = dict(data["choices"][0]["message"])
                        msg.setdefault("role", "assistant")
                    except (ValueError, KeyError, IndexError, TypeError) as e:
                        log.warning("session %s: upstream answer has no choices[0].message (%s); not recorded",
                                    sid, type(e).__name__)
                    else:
                        await run_in_threadpool(record, sid, msg)
                return Response(up.content, status_code=up.status_code, headers=relay_headers(up, extra))

            try:
                up = await client.send(client.build_request("POST", url, content=payload, headers=headers,
                                                            params=base_params),
                                       stream=True)
            except httpx.HTTPError as e:
                return unreachable(e)
            if up.status_code >= 400:
                data = await up.aread()
                await up.aclose()
                return Response(data, status_code=up.status_code, headers=relay_headers(up, extra))

            async def relay() -> AsyncIterator[bytes]:
                # Relay first: a chunk reaches the client whatever assembling or recording it does.
                asm: StreamAssembler | None = StreamAssembler()
                recorded = False
                async for chunk in up.aiter_bytes():
                    if asm is not None:
                        try:
                            asm.feed(chunk)
                        except Exception as e:  # noqa: BLE001 - never let recording break the stream
                            log.warning("session %s: cannot assemble the stream (%s); not recorded", sid,
                                        type(e).__name__)
                            asm = None
                    if asm is not None and asm.done and not recorded:
                        # Record before the client sees [DONE]: its next request carries this message.
                        await run_in_threadpool(record, sid, asm.message())
                        recorded = True
                    yield chunk
                if asm is None or recorded:
                    return
                try:
                    asm.close()
                except Exception as e:  # noqa: BLE001
                    log.warning("session %s: cannot assemble the stream (%s); not recorded", sid, type(e).__name__)
                    return
                if asm.complete:
                    await run_in_threadpool(record, sid, asm.message())
                else:
                    log.warning("session %s: upstream stream ended without finish_reason; not recorded", sid)

            closed = False

            async def on_close() -> None:
                nonlocal closed
                if not closed:
                    closed = True
                    try:
                        await up.aclose()
                    finally:
                        release()

            handed_off = True
            return _RelayResponse(relay(), on_close, status_code=up.status_code, headers=relay_headers(up, extra))
        finally:
            if not handed_off:
                release()

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> Response:
        try:
            up = await state["client"].get(str(base_url.join(base_url.path.rstrip("/") + "/models")),
                                           headers=upstream_headers(request), params=base_params)
        except httpx.HTTPError as e:
            return unreachable(e)
        return Response(up.content, status_code=up.status_code, headers=relay_headers(up, {}))

    @app.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], response_model=None)
    async def passthrough(path: str, request: Request) -> Response:
        """Other OpenAI endpoints (embeddings, …) go upstream untouched — under the upstream's base path only."""
        url = _below(base_url, path)
        if url is None:
            return _oai_error(400, "path must stay below the upstream base URL (no '.', '..', '%', backslashes or "
                                   "empty segments)")
        headers = upstream_headers(request)
        try:
            up = await state["client"].request(request.method, url,
                                               params=base_params.merge(request.query_params),
                                               content=await request.body(), headers=headers)
        except httpx.HTTPError as e:
            return unreachable(e)
        return Response(up.content, status_code=up.status_code, headers=relay_headers(up, {}))

    return app


__all__ = ["API_KEY_ENV", "SESSION_HEADER", "StreamAssembler", "create_proxy_app"]
