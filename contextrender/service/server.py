"""ContextRender as a separate server (spec §9, paper §3.4 and §D).

An agent runtime keeps its own, untrimmed history; before each model call an
adapter sends the new messages (or the whole list) and gets back the history
rendered under the budget B. The graph (one SQLite file, many sessions) is
the only store; every render is a view.

    contextrender serve --port 8765 --graph run.sqlite

Endpoints (JSON; errors are ``{"detail": "..."}`` with a 4xx status: 400 for messages that are not
valid chat messages — none of the batch is stored —, 422 for a parameter outside its domain:
method, overrides, budget, session id):

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
GET      ``/sessions/{id}/export``         the session as a replay-trace line
GET      ``/sessions/{id}/view``           ``?budget=&methods=a,b`` → the session's HTML view (contextrender/view.py)
GET      ``/health``
=======  ===============================  =============================================

Sync semantics: a sync sends the agent's *full* list; stored messages must
match it (the graph is append-only, spec §2; tool-call arguments may differ
in JSON formatting only), the unseen tail is appended. A mismatch is 409, unless ``on_conflict: "fork"``: then the
history continues in the variant ``id~N`` whose stored history is the
longest prefix of the list, or in a new variant (logged) if none is. The
OpenAI proxy (proxy.py) always forks, so a client that edits its past gets a
fresh session instead of an error.

``layout`` in a render gives, per rendered message, the seq of the stored
message it renders (None for inserted messages such as summaries), so an
adapter can return its agent's own message objects and change only bodies.
It is the render's own record (:attr:`~contextrender.render.Rendered.sources`,
written by :func:`~contextrender.render.assemble`), not a reconstruction.

Access: :mod:`contextrender.guard` checks Host, Origin, Content-Type and
the optional token before any route runs. Overrides are data: only the
method's tunable keys with plain values (:func:`contextrender.config.validate_overrides`).

Concurrency: one :class:`ContextService` per graph file (it holds the file's lock). Every operation on a
session holds that session's lock (the graph's own lock only guards the
SQLite connection), forking decisions hold a per-key lock, and policies are
built once per (method, overrides) and share one embedder.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from contextrender import __version__
from contextrender.adapters._common import valid_session_id
from contextrender.compaction import make_compactor
from contextrender.embed import make_embedder
from contextrender.events import Message, MessageError
from contextrender.graph import ContextGraph, GraphError, Session
from contextrender.readiness import ReadinessTracker, RenderedText
from contextrender.registry import OverrideError, build_policy, method_config, validate_overrides
from contextrender.render import BudgetExceeded, Scope
from contextrender.service.guard import AccessPolicy, Guard, error_body
from contextrender.tokens import SHIPPED_ENCODINGS, TokenCounter

log = logging.getLogger(__name__)

#: Default request-body limit (bytes) for the server and the proxy.
DEFAULT_MAX_BODY = 20 * 1024 * 1024
_METHOD_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: A session that may fork becomes ``key~N``; the key leaves room for the suffix within MAX_KEY_LEN.
MAX_FORKING_KEY = 192


# -- errors --------------------------------------------------------------------


class ServiceError(Exception):
    """An error with an HTTP status and a message meant for the client."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(ServiceError):
    """A parameter outside its domain (method, overrides, budget, session id): 422."""

    status = 422


class InvalidMessages(ServiceError):
    """The messages are not valid OpenAI chat messages: 400, and none of the batch is stored."""

    status = 400


class NotFound(ServiceError):
    status = 404


class Conflict(ServiceError):
    status = 409


class InternalError(ServiceError):
    status = 500


# -- the service core (no HTTP) -----------------------------------------------------


class SerialEmbedder:
    """The one embedder every policy and session shares, with calls serialised.

    Hugging Face tokenizers are not re-entrant ("Already borrowed") and a
    CPU model gains nothing from concurrent calls, so one lock is simplest.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.max_chars = getattr(inner, "max_chars", 8000)
        self._lock = threading.Lock()

    def embed_documents(self, texts: list[str]) -> Any:
        with self._lock:
            return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> Any:
        with self._lock:
            return self.inner.embed_query(text)


#: What the start-up warm-up embeds (short: the point is loading the model, not the text).
WARM_UP_TEXT = "contextrender warm-up"


def warm_up(embedder: Any) -> float:
    """Load the embedding model now by embedding :data:`WARM_UP_TEXT`; returns the seconds it took.

    The call goes past wrappers that would answer without the model (the
    :class:`SerialEmbedder` lock, the on-disk :class:`~contextrender.embed.CachedEmbedder`,
    where the text may already be cached) to the embedder they wrap (their
    ``inner``); its vector is discarded, so nothing is stored or counted.
    """
    target = embedder
    while getattr(target, "inner", None) is not None:
        target = target.inner
    start = time.perf_counter()
    target.embed_query(WARM_UP_TEXT)
    return time.perf_counter() - start


def _parse(messages: Any, where: str = "messages") -> list[Message]:
    """Validate a whole batch (format and encodability) before any of it is stored."""
    if not isinstance(messages, list):
        raise InvalidMessages(f"'{where}' must be a list of OpenAI chat messages")
    try:
        return [Message.from_openai(m, f"{where}[{i}]") for i, m in enumerate(messages)]
    except MessageError as e:
        raise InvalidMessages(str(e)) from None


def _json_equal(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except (json.JSONDecodeError, TypeError):
        return False


def same_message(a: Message, b: Message) -> bool:
    """Equal as stored (the graph's digest), or equal up to the JSON formatting of tool-call arguments.

    Some clients (LangChain, for one) parse the arguments the proxy recorded
    and send them back re-serialised; that is the same call, not an edited past.
    """
    if a == b:
        return True
    if (a.role, a.content, a.tool_call_id, a.name) != (b.role, b.content, b.tool_call_id, b.name):
        return False
    if len(a.tool_calls) != len(b.tool_calls):
        return False
    return all(x.id == y.id and x.name == y.name and (x.arguments == y.arguments or _json_equal(x.arguments, y.arguments))
               for x, y in zip(a.tool_calls, b.tool_calls, strict=True))


def _is_prefix(session: Session, parsed: Sequence[Message]) -> bool:
    n = len(session)
    return n <= len(parsed) and all(same_message(parsed[i], session.message(i)) for i in range(n))


class _Prefix:
    """The first ``n`` messages of a session, as the readiness tracker reads a history."""

    def __init__(self, session: Session, n: int) -> None:
        self.session, self.n = session, n

    def __len__(self) -> int:
        return self.n

    def message(self, seq: int) -> Message:
        return self.session.message(seq)


class _SessionReadiness:
    """Call readiness of the answers a session's renders got (docs/method.md, "Call readiness").

    After each render: what it showed and where its answer goes. When the session holds that answer (the
    client's next request carries it, or the wrapper records it), its tool calls are scored against that
    render: each value a call needed that only earlier tool results held, and whether the render showed it.
    In memory while the session is (dropped when it is evicted; a reloaded session starts a new tally).
    """

    def __init__(self) -> None:
        self.tracker = ReadinessTracker()
        self.shown: RenderedText | None = None
        self.answer_at = -1
        self.last: list[dict[str, Any]] = []

    def settle(self, session: Session) -> None:
        """Score the answer to the latest render, once the session holds it."""
        at = self.answer_at
        if self.shown is None or at < len(self.tracker.index) or at >= len(session):
            return
        answer = session.message(at)
        if answer.role == "assistant":
            scored = self.tracker.on_turn(_Prefix(session, at), self.shown, answer)
            self.last = [{"call": c.name, "call_id": c.call_id, "needed": [n.value for n in c.needs],
                          "missing": list(miss)} for c, miss in scored if c.needs]
        self.shown = None

    def rendered(self, session: Session, messages: Sequence[Mapping[str, Any]]) -> None:
        self.settle(session)
        self.shown = RenderedText.of(messages)
        self.answer_at = len(session)

    def summary(self) -> dict[str, Any]:
        s = self.tracker.stats
        return {"previous_answer": self.last, "calls": s.calls, "needing_calls": s.needing, "ready_calls": s.ready,
                "call_readiness": s.call_pct}


class ContextService:
    """Sessions, policies and renders over one graph file; used by the server, the proxy
    and :class:`~contextrender.adapters.http_client.InProcessClient`.

    Every public method returns JSON-ready dicts (the HTTP bodies) and raises
    :class:`ServiceError` subclasses carrying the status to answer with.

    ``warm`` (default on): embed one short text at construction, so the
    first over-budget render after start-up does not wait for the embedding
    model to load (MiniLM: seconds; :class:`~contextrender.embed.HashingEmbedder`:
    microseconds). Off for callers that never score relevance.
    ``overrides``: checked against ``default_method`` at construction, like the
    method itself (the proxy's ``--override``); renders still take their own.

    The service is the graph file's only writer (it takes the graph's
    exclusive lock) and keeps at most ``max_sessions`` sessions in memory,
    least recently used evicted first (an evicted session is reloaded from
    the file on its next use, with identical state).
    """

    def __init__(self, graph_path: str = ":memory:", *, default_method: str = "contextrender",
                 default_budget: int = 6000, embedding: str = "local", embedder: Any = None,
                 compactor: Any = "extractive", max_variants: int = 64, max_sessions: int = 256,
                 max_policies: int = 32, warm: bool = True, overrides: dict[str, Any] | None = None) -> None:
        if isinstance(default_budget, bool) or not isinstance(default_budget, int) or default_budget <= 0:
            raise ValueError(f"budget must be a positive integer, got {default_budget!r}")
        if max_sessions < 1 or max_policies < 1:
            raise ValueError("max_sessions and max_policies must be ≥ 1")
        self.default_method = default_method
        self.default_budget = default_budget
        self.embedder = SerialEmbedder(embedder if embedder is not None else make_embedder(embedding))
        self.compactor = make_compactor(compactor) if isinstance(compactor, str) else compactor
        self.max_variants = max_variants
        self.max_sessions = max_sessions
        self.max_policies = max_policies
        self._guard = threading.Lock()
        self._locks: dict[str, threading.RLock] = {}
        self._loaded: OrderedDict[str, None] = OrderedDict()  # sessions in memory, least recently used first
        self._readiness: dict[str, _SessionReadiness] = {}  # per loaded session: its answers' call readiness
        self._policies: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._policy_lock = threading.Lock()
        self._variants: dict[str, list[str]] = {}
        # An existing graph file is opened (and locked) first, so a file another service holds fails at
        # once; a new one only once the configuration has passed: a refused method or an embedder that
        # cannot run leaves no new (empty) graph file behind.
        existing = graph_path != ":memory:" and Path(graph_path).exists()
        graph = ContextGraph(graph_path, exclusive=True) if existing else None
        try:
            try:
                self.policy(default_method, overrides)  # fail at start-up, not at the first request
            except ServiceError as e:
                raise ValueError(e.message) from None
            #: Seconds the start-up warm-up took (None when ``warm=False``).
            self.warm_seconds: float | None = None
            if warm:
                self.warm_seconds = warm_up(self.embedder)
        except BaseException:
            if graph is not None:
                graph.close()
            raise
        self.graph = graph if graph is not None else ContextGraph(graph_path, exclusive=True)
        self._known: set[str] = set(self.graph.session_ids())

    def close(self) -> None:
        self.graph.close()

    # -- locks, policies, sessions -------------------------------------------------

    def _lock(self, name: str) -> threading.RLock:
        with self._guard:
            lock = self._locks.get(name)
            if lock is None:
                lock = self._locks[name] = threading.RLock()
            return lock

    def _method(self, method: str | None) -> str:
        method = method or self.default_method
        if not isinstance(method, str) or not _METHOD_RE.match(method):
            raise BadRequest(f"invalid method name {method!r}")
        return method

    def _overrides(self, method: str, overrides: Any) -> dict[str, Any]:
        """Request overrides, validated against the method's tunable keys before anything is built."""
        try:
            return validate_overrides(method, overrides)
        except OverrideError as e:
            raise BadRequest(str(e)) from None
        except ValueError as e:  # unknown method: the message lists the known ones
            raise BadRequest(str(e)) from None

    def policy(self, method: str | None = None, overrides: dict[str, Any] | None = None) -> Any:
        """The policy for (method, overrides), built once and cached (least recently used evicted)."""
        method = self._method(method)
        ov = self._overrides(method, overrides)
        key = (method, json.dumps(ov, sort_keys=True))
        with self._policy_lock:
            pol = self._policies.get(key)
            if pol is not None:
                self._policies.move_to_end(key)
                return pol
            try:
                pol = build_policy(method_config(method, ov), embedder=self.embedder, compactor=self.compactor)
            except Exception as e:  # noqa: BLE001 - a constructor refusing a value's range
                reason = e.__cause__ if e.__cause__ is not None else e
                raise BadRequest(f"method {method!r} refuses overrides {ov}: {reason}") from None
            self._policies[key] = pol
            while len(self._policies) > self.max_policies:
                self._policies.popitem(last=False)
            return pol

    def _budget(self, budget: int | None) -> int:
        b = self.default_budget if budget is None else budget
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise BadRequest(f"budget must be a positive integer, got {budget!r}")
        return b

    def _register(self, sid: str) -> None:
        with self._guard:
            self._known.add(sid)
            self._variants.pop(sid, None)
            m = re.match(r"^(.*)~(\d+)$", sid)
            if m:
                self._variants.pop(m.group(1), None)

    def exists(self, sid: str) -> bool:
        with self._guard:
            return sid in self._known

    @staticmethod
    def _check_sid(sid: Any) -> str:
        if not isinstance(sid, str) or not valid_session_id(sid):
            raise BadRequest(f"invalid session id {sid!r}: 1-200 characters from [A-Za-z0-9._:~@+=-]")
        return sid

    @contextmanager
    def _session(self, sid: str, *, create: bool = True, meta: dict[str, Any] | None = None,
                 encoding: str | None = None) -> Iterator[tuple[Session, bool]]:
        """The session ``sid`` (loaded or created) and whether this call created it, under its lock.

        Loading happens under the session's lock, and eviction takes that lock
        too, so a session is never in memory twice.
        """
        self._check_sid(sid)
        with self._lock(sid):
            existed = self.exists(sid)
            if not existed and not create:
                raise NotFound(f"unknown session {sid!r}; create it with PUT /sessions/{sid}")
            if encoding and encoding not in SHIPPED_ENCODINGS:
                # Any other name would make tiktoken download it, from a request, under this lock.
                raise BadRequest(f"encoding {encoding!r} is not available; use one of {', '.join(SHIPPED_ENCODINGS)}")
            counter = TokenCounter(encoding) if encoding else None
            try:
                session = self.graph.session(sid, counter=counter, meta=meta)
            except GraphError as e:
                raise Conflict(str(e)) from None
            if not existed:
                self._register(sid)
            with self._guard:
                self._loaded[sid] = None
                self._loaded.move_to_end(sid)
            yield session, not existed
        self._evict()

    def _evict(self) -> None:
        """Release least recently used sessions beyond ``max_sessions`` (skipping ones in use)."""
        with self._guard:
            excess = len(self._loaded) - self.max_sessions
            candidates = list(self._loaded)[:max(excess, 0)] if excess > 0 else []
        for sid in candidates:
            lock = self._lock(sid)
            if not lock.acquire(blocking=False):
                continue  # in use: try again after a later request
            try:
                with self._guard:
                    if sid not in self._loaded or len(self._loaded) <= self.max_sessions:
                        continue
                    del self._loaded[sid]
                    self._readiness.pop(sid, None)
                self.graph.release(sid)
            finally:
                lock.release()

    def loaded_sessions(self) -> int:
        """How many sessions are in memory now (at most ``max_sessions`` between requests)."""
        with self._guard:
            return len(self._loaded)

    def _variants_of(self, key: str) -> list[str]:
        with self._guard:
            v = self._variants.get(key)
            if v is None:
                pat = re.compile(re.escape(key) + r"~(\d+)$")
                nums = sorted(int(m.group(1)) for s in self._known if (m := pat.match(s)))
                v = ([key] if key in self._known else []) + [f"{key}~{n}" for n in nums]
                self._variants[key] = v
            return list(v)

    # -- writes ----------------------------------------------------------------------

    @staticmethod
    def _store(session: Session, parsed: Sequence[Message]) -> list[int]:
        try:
            return session.extend(parsed)
        except GraphError as e:
            raise Conflict(str(e)) from None

    @classmethod
    def _sync_exact(cls, session: Session, parsed: Sequence[Message]) -> int:
        n = len(session)
        if len(parsed) < n:
            raise Conflict(f"session {session.id!r}: got {len(parsed)} messages, the graph holds {n}; "
                           "sync takes the full history (use mode=append for new messages only)")
        for i in range(n):
            if not same_message(parsed[i], session.message(i)):
                raise Conflict(f"session {session.id!r}: message {i} differs from the stored one; the history "
                               "is append-only (on_conflict=fork continues in a new session instead)")
        cls._store(session, parsed[n:])
        return len(parsed) - n

    def _fork_target(self, key: str, parsed: Sequence[Message]) -> tuple[str, bool]:
        """The variant of ``key`` to continue: the longest stored prefix of ``parsed``, else a new one.

        Caller holds the key lock.
        """
        variants = self._variants_of(key)
        best, best_len = None, -1
        for sid in variants[-self.max_variants:]:
            with self._session(sid) as (session, _):
                if len(session) > best_len and _is_prefix(session, parsed):
                    best, best_len = sid, len(session)
        if best is not None:
            return best, False
        if not variants:
            return key, False
        nums = [int(s.rsplit("~", 1)[1]) for s in variants if s != key]
        new = f"{key}~{max(nums, default=0) + 1}"
        log.warning("session %s: history differs from every stored variant; continuing as %s", key, new)
        return new, True

    def _with_synced(self, sid: str, messages: Any, on_conflict: str, fn: Any) -> dict[str, Any]:
        """Sync ``messages`` into ``sid`` (or its fork), then run ``fn(session)`` under the same lock."""
        if on_conflict not in ("error", "fork"):
            raise BadRequest(f"on_conflict must be 'error' or 'fork', got {on_conflict!r}")
        self._check_sid(sid)
        if on_conflict == "fork" and len(sid) > MAX_FORKING_KEY:
            raise BadRequest(f"session id {sid[:40]!r}… is {len(sid)} characters; ids that may fork (key~N) "
                             f"can have at most {MAX_FORKING_KEY}")
        parsed = _parse(messages)
        if on_conflict == "error":
            return self._sync_and_run(sid, parsed, fn, forked=False)
        with self._lock("\0key:" + sid):  # choosing the fork and writing to it are one step
            target, forked = self._fork_target(sid, parsed)
            return self._sync_and_run(target, parsed, fn, forked=forked)

    def _sync_and_run(self, sid: str, parsed: Sequence[Message], fn: Any, *, forked: bool) -> dict[str, Any]:
        with self._session(sid) as (session, created):
            added = self._sync_exact(session, parsed)
            out = fn(session)
        out.update(session=sid, created=created, added=added, forked=forked)
        return out

    def create(self, sid: str, meta: dict[str, Any] | None = None, encoding: str | None = None) -> dict[str, Any]:
        with self._session(sid, meta=meta, encoding=encoding) as (session, created):
            return {**self._info(session), "created": created}

    def append(self, sid: str, messages: Any) -> dict[str, Any]:
        """Append messages: the whole batch is validated first and stored in one transaction."""
        self._check_sid(sid)
        parsed = _parse(messages)
        with self._session(sid) as (session, created):
            seqs = self._store(session, parsed)
            return {"session": sid, "created": created, "added": len(seqs), "seqs": seqs, "forked": False,
                    "messages": len(session)}

    def sync(self, sid: str, messages: Any, on_conflict: str = "error") -> dict[str, Any]:
        return self._with_synced(sid, messages, on_conflict, lambda s: {"messages": len(s)})

    # -- reads -----------------------------------------------------------------------

    @staticmethod
    def _info(session: Session) -> dict[str, Any]:
        return {"id": session.id, "messages": len(session), "results": len(session.results),
                "next_invocation": session.next_invocation,
                "full_tokens": Scope.of(session).full_tokens(session)}

    def sessions(self) -> list[str]:
        with self._guard:
            return sorted(self._known)

    def info(self, sid: str) -> dict[str, Any]:
        with self._session(sid, create=False) as (session, _):
            return self._info(session)

    def transcript(self, sid: str) -> dict[str, Any]:
        with self._session(sid, create=False) as (session, _):
            return {"session": sid, "messages": session.openai_messages()}

    def _render(self, session: Session, policy: Any, budget: int) -> dict[str, Any]:
        try:
            if callable(getattr(policy, "select", None)):
                sel = policy.select(session, budget)
                rendered, shortcut = sel.rendered, sel.shortcut
            else:
                rendered, shortcut = policy.render(session, budget), None
        except BudgetExceeded as e:  # a policy bug, never a client error
            raise InternalError(f"render failed the budget check: {e}") from None
        msgs = [dict(m) for m in rendered.messages]
        if len(rendered.sources) != len(msgs):  # every policy records them (render.assemble)
            raise InternalError(f"method {getattr(policy, 'name', None)!r} returned a render without sources")
        with self._guard:
            ready = self._readiness.setdefault(session.id, _SessionReadiness())
        ready.rendered(session, msgs)  # the session's lock is held: one render of it at a time
        return {"messages": msgs, "layout": list(rendered.sources), "tokens": rendered.tokens,
                "readiness": ready.summary(),
                "budget": budget, "method": getattr(policy, "name", None), "visible": sorted(rendered.visible),
                "usage": rendered.usage.to_dict(), "shortcut": shortcut,
                "full_tokens": Scope.of(session).full_tokens(session), "stored": len(session),
                "next_invocation": session.next_invocation}

    def render(self, sid: str, *, messages: Any = None, budget: int | None = None, method: str | None = None,
               overrides: dict[str, Any] | None = None, on_conflict: str = "error") -> dict[str, Any]:
        """Render ``sid`` under ``budget``; with ``messages``, sync them first (same lock)."""
        b = self._budget(budget)
        policy = self.policy(method, overrides)
        if messages is None:
            with self._session(sid, create=False) as (session, _):
                out = self._render(session, policy, b)
            out.update(session=sid, created=False, added=0, forked=False)
            return out
        return self._with_synced(sid, messages, on_conflict, lambda s: self._render(s, policy, b))

    def readiness(self, sid: str) -> dict[str, Any]:
        """Call readiness of the answers this session's renders got, since the session was last loaded: the
        tally, and per call of the latest scored answer what it needed and what the render hid."""
        with self._session(sid, create=False) as (session, _):
            with self._guard:
                ready = self._readiness.setdefault(sid, _SessionReadiness())
            ready.settle(session)
            return {"session": sid, **ready.summary()}

    def scores(self, sid: str, *, budget: int | None = None, method: str | None = None,
               overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """Per-result scores (ResultScore rows) behind a ContextRender-family render."""
        b = self._budget(budget)
        name = self._method(method)
        ov = self._overrides(name, overrides)
        if not self.exists(self._check_sid(sid)):
            raise NotFound(f"unknown session {sid!r}; create it with PUT /sessions/{sid}")
        policy = self.policy(name, ov)
        if not callable(getattr(policy, "select", None)):
            raise BadRequest(f"method {name!r} has no per-result scores; "
                             "scores exist for ContextRender-family methods")
        with self._session(sid, create=False) as (session, _):
            try:
                sel = policy.select(session, b)
            except BudgetExceeded as e:
                raise InternalError(f"render failed the budget check: {e}") from None
            return {"session": sid, "method": getattr(policy, "name", None), "budget": b,
                    "shortcut": sel.shortcut, "tokens": sel.rendered.tokens,
                    "next_invocation": session.next_invocation, "scores": [asdict(r) for r in sel.scores]}

    def edges(self, sid: str) -> dict[str, Any]:
        with self._session(sid, create=False) as (session, _):
            edges = [{"source": e.source, "op_seq": e.op_seq, "part": e.part, "value": e.value}
                     for e in session.reuse_edges()]
            reuse = {str(k): v for k, v in sorted(session.flow.reuse_scores().items())}
            return {"session": sid, "edges": edges, "reuse": reuse}

    def view(self, sid: str, *, budget: int | None = None, methods: Sequence[str] | None = None) -> str:
        """The session's HTML view (:mod:`contextrender.view`) under one or two methods (fresh policies)."""
        from contextrender.view import method_view, render_html

        b = self._budget(budget)
        names = [self._method(m) for m in (methods or [self.default_method])]
        if not 1 <= len(names) <= 2:
            raise BadRequest("a view compares one or two methods, e.g. methods=contextrender,prune")
        from contextrender.registry import method_names

        unknown = [m for m in names if m not in method_names()]
        if unknown:
            raise BadRequest(f"unknown method {unknown[0]!r}; known: {', '.join(method_names())}")
        with self._session(sid, create=False) as (session, _):
            messages = session.openai_messages()
        try:  # replayed on fresh in-memory graphs: the stored session is never written
            data = method_view(messages, names, b, session_id=sid, embedder=self.embedder, compactor=self.compactor)
        except BudgetExceeded as e:
            raise InternalError(f"render failed the budget check: {e}") from None
        return render_html(data)

    def export(self, sid: str) -> dict[str, Any]:
        """The session as one replay-trace episode ``{"task_id", "messages"}`` (experiments/evaluation/traces.py)."""
        from contextrender.trace_line import trace_line

        with self._session(sid, create=False) as (session, _):
            return trace_line(sid, session.openai_messages())


# -- HTTP ------------------------------------------------------------------------------


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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message), exc.status)

    @app.exception_handler(_TooLarge)
    async def _too_large(request: Request, exc: _TooLarge) -> JSONResponse:
        return JSONResponse(error_body(413, str(exc.detail)), 413)


class SessionBody(BaseModel):
    meta: dict[str, Any] = Field(default_factory=dict)
    encoding: str | None = None


class MessagesBody(BaseModel):
    messages: list[Any]
    mode: Literal["append", "sync"] = "append"
    on_conflict: Literal["error", "fork"] = "error"


class RenderBody(BaseModel):
    budget: int | None = Field(default=None, gt=0)
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
        return JSONResponse(out, status_code=201 if out["created"] else 200)

    @r.put("/sessions/{sid}")
    def put_session(sid: str, body: Annotated[SessionBody | None, Body()] = None) -> JSONResponse:
        return _create(sid, body)

    @r.post("/sessions/{sid}")
    def post_session(sid: str, body: Annotated[SessionBody | None, Body()] = None) -> JSONResponse:
        return _create(sid, body)

    @r.get("/sessions/{sid}")
    def get_session(sid: str) -> dict[str, Any]:
        return service.info(sid)

    @r.get("/sessions/{sid}/messages")
    def get_messages(sid: str) -> dict[str, Any]:
        return service.transcript(sid)

    @r.post("/sessions/{sid}/messages")
    def post_messages(sid: str, body: Annotated[Any, Body()]) -> dict[str, Any]:
        # A bare list appends; an object chooses the mode.
        if isinstance(body, list):
            return service.append(sid, body)
        try:
            req = MessagesBody.model_validate(body)
        except ValidationError as e:
            raise BadRequest("body must be a list of messages or {\"messages\": [...], \"mode\": "
                             f"\"append\"|\"sync\", \"on_conflict\": \"error\"|\"fork\"}}: {e.errors()[0]['msg']}"
                             ) from None
        if req.mode == "append":
            return service.append(sid, req.messages)
        return service.sync(sid, req.messages, req.on_conflict)

    @r.post("/sessions/{sid}/render")
    def render(sid: str, body: Annotated[RenderBody | None, Body()] = None) -> dict[str, Any]:
        b = body or RenderBody()
        return service.render(sid, messages=b.messages, budget=b.budget, method=b.method, overrides=b.overrides,
                              on_conflict=b.on_conflict)

    @r.get("/sessions/{sid}/scores")
    def scores(sid: str, budget: int | None = Query(default=None, gt=0), method: str | None = None,
               overrides: str | None = Query(default=None, description="JSON object of dotted keys")
               ) -> dict[str, Any]:
        return service.scores(sid, budget=budget, method=method, overrides=_overrides_query(overrides))

    @r.get("/sessions/{sid}/edges")
    def edges(sid: str) -> dict[str, Any]:
        return service.edges(sid)

    @r.get("/sessions/{sid}/readiness")
    def readiness(sid: str) -> dict[str, Any]:
        return service.readiness(sid)

    @r.get("/sessions/{sid}/view", response_model=None)
    def view(sid: str, budget: int | None = Query(default=None, gt=0),
             methods: str | None = Query(default=None, description="one or two methods, comma-separated")) -> Any:
        names = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
        return HTMLResponse(service.view(sid, budget=budget, methods=names))

    @r.get("/sessions/{sid}/export", response_model=None)
    def export(sid: str, format: Literal["json", "jsonl"] = "json") -> Any:
        ep = service.export(sid)
        if format == "jsonl":
            return PlainTextResponse(json.dumps(ep, ensure_ascii=False) + "\n", media_type="application/x-ndjson")
        return ep

    return r


def create_app(graph_path: str = ":memory:", default_method: str = "contextrender", default_budget: int = 6000,
               embedding: str = "local", *, compactor: Any = "extractive", max_body_bytes: int = DEFAULT_MAX_BODY,
               service: ContextService | None = None, access: AccessPolicy | None = None,
               warm: bool = True) -> FastAPI:
    """The ContextRender server.

    ``access`` says which hosts, browser origins and token are accepted
    (:mod:`contextrender.guard`); the default accepts loopback host names
    only, no browser origin and no token. Bind it to 127.0.0.1 (the CLI's
    default). ``warm``: load the embedding model at start-up
    (:class:`ContextService`); ignored when ``service`` is given.
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


__all__ = ["BadRequest", "BodyLimitMiddleware", "Conflict", "ContextService", "DEFAULT_MAX_BODY", "InvalidMessages",
           "NotFound", "SerialEmbedder", "ServiceError", "WARM_UP_TEXT", "create_app", "install_error_handlers",
           "same_message", "session_router", "warm_up"]
