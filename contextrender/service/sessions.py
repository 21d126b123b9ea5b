"""Sessions over one graph file, as a library: sync, fork, render, score, view, export (docs/method.md §9).

:class:`ContextService` is what the server (:mod:`contextrender.service.server`), the OpenAI proxy
(:mod:`contextrender.service.proxy`), the wrapper (:func:`contextrender.wrap`) and
:class:`~contextrender.adapters.http_client.InProcessClient` share. It knows no HTTP: its methods
return the typed records of :mod:`contextrender.service.results` (each ``to_json()`` is the session
API's body) and raise the errors of :mod:`contextrender.service.errors`, whose ``kind`` each front
end maps to its own answer.

Sync semantics: a sync sends the agent's *full* list; stored messages must match it (the graph is
append-only, docs/method.md §2; tool-call arguments may differ in JSON formatting only), the unseen tail is
appended. A mismatch is a :class:`~contextrender.service.errors.Conflict`, unless
``on_conflict="fork"``: then the history continues in the variant ``id~N`` whose stored history is
the longest prefix of the list, or in a new variant (logged) if none is. The proxy and the wrapper
always fork, so a client that edits its past gets a fresh session instead of an error.

A render's ``layout`` gives, per rendered message, the seq of the stored message it renders (None
for inserted messages such as summaries), so a caller can return its agent's own message objects
and change only bodies. It is the render's own record (:attr:`~contextrender.render.Rendered.sources`,
written by :func:`~contextrender.render.assemble`), not a reconstruction.

Concurrency: one :class:`ContextService` per graph file (it holds the file's lock). Every operation
on a session holds that session's lock (the graph's own lock only guards the SQLite connection),
forking decisions hold a per-key lock, and policies are built once per (method, overrides) and
share one embedder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from contextrender import expand as expand_tool
from contextrender.adapters._common import valid_session_id
from contextrender.billing import PromptUsage
from contextrender.compaction import make_compactor
from contextrender.embed import make_embedder
from contextrender.events import Message, MessageError
from contextrender.graph import ContextGraph, GraphError, GraphWriteError, RequestUsage, Session, UsageTotals
from contextrender.readiness import ReadinessTracker, RenderedText
from contextrender.registry import OverrideError, build_policy, method_config, validate_overrides
from contextrender.render import BudgetExceeded, Scope
from contextrender.service.errors import (
    BadRequest,
    Conflict,
    InternalError,
    InvalidMessages,
    NotFound,
    ServiceError,
    StorageError,
    TooLarge,
)
from contextrender.service.results import (
    AppendResult,
    CallReadiness,
    CreateResult,
    EdgesResult,
    ExportResult,
    ReadinessReport,
    ReadinessSummary,
    RenderResult,
    ScoresResult,
    SessionInfo,
    SyncResult,
    Transcript,
    UsageReport,
)
from contextrender.tokens import SHIPPED_ENCODINGS, TokenCounter

log = logging.getLogger(__name__)

_METHOD_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: A session that may fork becomes ``key~N``; the key leaves room for the suffix within MAX_KEY_LEN.
MAX_FORKING_KEY = 192
#: Most request rows one usage report holds (the totals always cover every request).
MAX_USAGE_ROWS = 1000

_T = TypeVar("_T")


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
        self.last: tuple[CallReadiness, ...] = ()

    def settle(self, session: Session) -> None:
        """Score the answer to the latest render, once the session holds it."""
        at = self.answer_at
        if self.shown is None or at < len(self.tracker.index) or at >= len(session):
            return
        answer = session.message(at)
        if answer.role == "assistant":
            scored = self.tracker.on_turn(_Prefix(session, at), self.shown, answer)
            self.last = tuple(CallReadiness(c.name, c.call_id, tuple(n.value for n in c.needs), tuple(miss))
                              for c, miss in scored if c.needs)
        self.shown = None

    def rendered(self, session: Session, messages: Sequence[Mapping[str, Any]]) -> None:
        self.settle(session)
        self.shown = RenderedText.of(messages)
        self.answer_at = len(session)

    def summary(self) -> ReadinessSummary:
        s = self.tracker.stats
        return ReadinessSummary(previous_answer=self.last, calls=s.calls, needing_calls=s.needing,
                                ready_calls=s.ready, call_readiness=s.call_pct)


@dataclass(frozen=True)
class _Synced:
    """Where a call's messages went: the session (or fork), whether it was created, how many were new."""

    session: str
    created: bool
    added: int
    forked: bool


class ContextService:
    """Sessions, policies and renders over one graph; used by the server, the proxy, the wrapper
    and :class:`~contextrender.adapters.http_client.InProcessClient`.

    Every public method returns a record of :mod:`contextrender.service.results` (``to_json()``:
    the session API's body) and raises :class:`~contextrender.service.errors.ServiceError`
    subclasses, whose ``kind`` says why.

    ``graph``: a graph file path (created or resumed), ``":memory:"``, or an open
    :class:`~contextrender.graph.ContextGraph` the caller owns: the service then uses it as it is
    (no file lock taken), must be its only writer, and leaves closing it to the caller.
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

    def __init__(self, graph: str | ContextGraph = ":memory:", *, default_method: str = "contextrender",
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
        self._owns_graph = not isinstance(graph, ContextGraph)
        if isinstance(graph, ContextGraph):
            self._start(overrides, warm)
            self.graph = graph
        else:
            self.graph = self._open(graph, overrides, warm)
        self._known: set[str] = set(self.graph.session_ids())

    def _start(self, overrides: dict[str, Any] | None, warm: bool) -> None:
        """Refuse a bad default method or overrides now, not at the first request; then warm up."""
        try:
            self.policy(self.default_method, overrides)
        except ServiceError as e:
            raise ValueError(e.message) from None
        #: Seconds the start-up warm-up took (None when ``warm=False``).
        self.warm_seconds: float | None = warm_up(self.embedder) if warm else None

    def _open(self, path: str, overrides: dict[str, Any] | None, warm: bool) -> ContextGraph:
        # An existing graph file is opened (and locked) first, so a file another service holds fails at
        # once; a new one only once the configuration has passed: a refused method or an embedder that
        # cannot run leaves no new (empty) graph file behind.
        existing = path != ":memory:" and Path(path).exists()
        graph = ContextGraph(path, exclusive=True) if existing else None
        try:
            self._start(overrides, warm)
        except BaseException:
            if graph is not None:
                graph.close()
            raise
        return graph if graph is not None else ContextGraph(path, exclusive=True)

    def close(self) -> None:
        """Release the graph file and its lock; a graph passed in stays open (it is the caller's)."""
        if self._owns_graph:
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

    def _budget(self, budget: Any) -> int:
        b = self.default_budget if budget is None else budget
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            shown = repr(budget)
            shown = shown if len(shown) <= 40 else shown[:40] + "…"
            raise BadRequest(f"'budget' must be a positive integer number of tokens (a JSON number, not a string "
                             f"or a boolean), got {shown}")
        return b

    def _register(self, sid: str) -> None:
        with self._guard:
            self._known.add(sid)
            self._variants.pop(sid, None)
            m = re.match(r"^(.*)~(\d+)$", sid)
            if m:
                self._variants.pop(m.group(1), None)

    def exists(self, sid: str) -> bool:
        """Whether ``sid`` is stored (in memory or only in the file)."""
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
            except GraphWriteError as e:
                raise StorageError(str(e)) from None
            except GraphError as e:
                raise Conflict(str(e)) from None
            if not existed:
                self._register(sid)
            with self._guard:
                self._loaded[sid] = None
                self._loaded.move_to_end(sid)
            try:
                yield session, not existed
            except GraphWriteError as e:  # a write inside the operation (embeddings, artifacts) refused
                raise StorageError(str(e)) from None
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
        except GraphWriteError as e:  # rolled back: memory and file still hold what was acknowledged
            raise StorageError(str(e)) from None
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

    def _with_synced(self, sid: str, messages: Any, on_conflict: str,
                     fn: Callable[[Session, _Synced], _T]) -> _T:
        """Sync ``messages`` into ``sid`` (or its fork), then run ``fn(session, synced)`` under the same lock."""
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

    def _sync_and_run(self, sid: str, parsed: Sequence[Message], fn: Callable[[Session, _Synced], _T], *,
                      forked: bool) -> _T:
        with self._session(sid) as (session, created):
            added = self._sync_exact(session, parsed)
            return fn(session, _Synced(sid, created, added, forked))

    def create(self, sid: str, meta: dict[str, Any] | None = None, encoding: str | None = None) -> CreateResult:
        """Create ``sid`` (with ``meta`` and a token ``encoding``), or resume it as stored."""
        with self._session(sid, meta=meta, encoding=encoding) as (session, created):
            return CreateResult(self._info(session), created)

    def append(self, sid: str, messages: Any) -> AppendResult:
        """Append messages: the whole batch is validated first and stored in one transaction."""
        self._check_sid(sid)
        parsed = _parse(messages)
        with self._session(sid) as (session, created):
            seqs = self._store(session, parsed)
            return AppendResult(session=sid, created=created, added=len(seqs), seqs=tuple(seqs),
                                messages=len(session))

    def sync(self, sid: str, messages: Any, on_conflict: str = "error") -> SyncResult:
        """Sync the full history ``messages`` into ``sid`` (or, with ``on_conflict="fork"``, a fork of it)."""
        return self._with_synced(sid, messages, on_conflict, lambda s, synced: SyncResult(
            session=synced.session, created=synced.created, added=synced.added, forked=synced.forked,
            messages=len(s)))

    # -- reads -----------------------------------------------------------------------

    def answered_together(self, key: str) -> dict[str, frozenset[str]]:
        """The tool calls stored answers made together, in ``key`` and its forks: for each call of a stored
        assistant message with more than one call, the ids of all that message's calls (empty for a new key).

        What tells a model turn's calls sent back interleaved with their outputs from calls of consecutive
        turns (:func:`~contextrender.service.responses_api.to_openai`). Reads at most ``max_variants`` sessions.
        """
        self._check_sid(key)
        out: dict[str, frozenset[str]] = {}
        for sid in self._variants_of(key)[-self.max_variants:]:
            with self._session(sid, create=False) as (session, _):
                for msg in session.messages:
                    if len(msg.tool_calls) > 1:
                        ids = frozenset(c.id for c in msg.tool_calls)
                        for c in ids:
                            out.setdefault(c, ids)
        return out

    @staticmethod
    def _info(session: Session) -> SessionInfo:
        return SessionInfo(id=session.id, messages=len(session), results=len(session.results),
                           next_invocation=session.next_invocation,
                           full_tokens=Scope.of(session).full_tokens(session), usage=session.prompt_usage_totals())

    def sessions(self) -> list[str]:
        """Every stored session id, sorted."""
        with self._guard:
            return sorted(self._known)

    def info(self, sid: str) -> SessionInfo:
        """One session's counts."""
        with self._session(sid, create=False) as (session, _):
            return self._info(session)

    def transcript(self, sid: str) -> Transcript:
        """The stored messages of ``sid``."""
        with self._session(sid, create=False) as (session, _):
            return Transcript(sid, tuple(session.openai_messages()))

    def _tally(self, sid: str) -> _SessionReadiness:
        with self._guard:
            return self._readiness.setdefault(sid, _SessionReadiness())

    def _render(self, session: Session, policy: Any, budget: int, synced: _Synced, offer_expand: bool = False
                ) -> RenderResult:
        handles = offer_expand and expand_tool.gives_handles(policy)
        if handles:  # docs/service.md, "The expand tool": markers carry handles from this render on
            expand_tool.offer(session)
        try:
            # A request without the tool renders as if it was never offered, even in a session where it was.
            with contextlib.nullcontext() if handles else expand_tool.withheld():
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
        ready = self._tally(session.id)
        ready.rendered(session, msgs)  # the session's lock is held: one render of it at a time
        return RenderResult(messages=tuple(msgs), layout=tuple(rendered.sources), tokens=rendered.tokens,
                            readiness=ready.summary(), budget=budget, method=getattr(policy, "name", None),
                            visible=tuple(sorted(rendered.visible)), usage=rendered.usage, shortcut=shortcut,
                            full_tokens=Scope.of(session).full_tokens(session), stored=len(session),
                            next_invocation=session.next_invocation, session=synced.session,
                            created=synced.created, added=synced.added, forked=synced.forked,
                            prompt_usage=session.prompt_usage_totals(), expand=handles)

    def render(self, sid: str, *, messages: Any = None, budget: int | None = None, method: str | None = None,
               overrides: dict[str, Any] | None = None, on_conflict: str = "error",
               offer_expand: bool = False) -> RenderResult:
        """Render ``sid`` under ``budget``; with ``messages``, sync them first (same lock).

        ``offer_expand``: the caller answers the expand tool (the proxy does): a method whose markers can carry
        handles (:func:`~contextrender.expand.gives_handles`) gives them from this render on (:attr:`RenderResult.expand`).
        """
        b = self._budget(budget)
        policy = self.policy(method, overrides)
        if messages is None:
            with self._session(sid, create=False) as (session, _):
                return self._render(session, policy, b, _Synced(sid, created=False, added=0, forked=False),
                                    offer_expand)
        return self._with_synced(sid, messages, on_conflict,
                                 lambda s, synced: self._render(s, policy, b, synced, offer_expand))

    # -- the expand tool (docs/service.md, "The expand tool") -------------------------

    def expand(self, sid: str, arguments: Any, *, max_tokens: int, at: int) -> expand_tool.Expansion:
        """Answer one ``contextrender_expand`` call in ``sid`` within ``max_tokens`` and record it (reuse for
        Tool-Flow Analysis, and the event ``explain`` and ``view`` list); ``at`` is the seq the answer goes to.
        Raises :class:`~contextrender.expand.ExpandError` (its text is the tool's error result) for a handle this
        session did not issue, bad arguments or no room."""
        with self._session(sid, create=False) as (session, _):
            got = expand_tool.expand(session, arguments, max_tokens=max_tokens)
            expand_tool.record(session, got, at)
            return got

    def count_messages(self, sid: str, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tok of OpenAI-format ``messages`` under ``sid``'s tokenizer (what a render's ``tokens`` count)."""
        with self._session(sid, create=False) as (session, _):
            return session.counter.messages([dict(m) for m in messages])

    def expansions(self, sid: str) -> list[dict[str, Any]]:
        """The expansions answered in ``sid``, oldest first (:func:`contextrender.expand.expansions`)."""
        with self._session(sid, create=False) as (session, _):
            return expand_tool.expansions(session)

    # -- prompt-cache usage (docs/service.md, "Prompt-cache usage") ------------------

    def record_usage(self, sid: str, api: str, usage: PromptUsage | None, *, streamed: bool, at: int) -> RequestUsage:
        """Store one answered request's usage as the upstream billed it (None: the answer carried none, recorded
        as unknown), in ``sid`` — the session (or fork) the request was rendered from; ``at`` is the seq its answer
        goes to (:attr:`RenderResult.stored`)."""
        with self._session(sid, create=False) as (session, _):
            try:
                return session.add_prompt_usage(api, usage, streamed=streamed, at=at)
            except GraphWriteError:
                raise  # StorageError, by _session
            except GraphError as e:
                raise Conflict(str(e)) from None
            except (TypeError, ValueError) as e:
                raise BadRequest(str(e)) from None

    def usage(self, sid: str, *, last: int | None = None) -> UsageReport:
        """The session's answered requests as billed: totals over all of them and the rows of the latest ``last``
        (default and at most :data:`MAX_USAGE_ROWS`)."""
        n = MAX_USAGE_ROWS if last is None else last
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_USAGE_ROWS:
            raise BadRequest(f"'last' must be an integer from 1 to {MAX_USAGE_ROWS}, got {last!r:.40}")
        with self._session(sid, create=False) as (session, _):
            return UsageReport(sid, session.prompt_usage_totals(), tuple(session.prompt_usage_rows(last=n)))

    def usage_totals(self, sid: str) -> UsageTotals:
        """The session's answered requests and the sum of their billed figures (no rows)."""
        with self._session(sid, create=False) as (session, _):
            return session.prompt_usage_totals()

    def readiness(self, sid: str) -> ReadinessReport:
        """Call readiness of the answers this session's renders got, since the session was last loaded: the
        tally, and per call of the latest scored answer what it needed and what the render hid."""
        with self._session(sid, create=False) as (session, _):
            ready = self._tally(sid)
            ready.settle(session)
            return ReadinessReport(sid, ready.summary())

    def scores(self, sid: str, *, budget: int | None = None, method: str | None = None,
               overrides: dict[str, Any] | None = None) -> ScoresResult:
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
            return ScoresResult(session=sid, method=getattr(policy, "name", None), budget=b,
                                shortcut=sel.shortcut, tokens=sel.rendered.tokens,
                                next_invocation=session.next_invocation, scores=tuple(sel.scores))

    def edges(self, sid: str) -> EdgesResult:
        """The session's TFA reuse edges and c_t(r)."""
        with self._session(sid, create=False) as (session, _):
            return EdgesResult(sid, tuple(session.reuse_edges()), dict(sorted(session.flow.reuse_scores().items())))

    def view(self, sid: str, *, budget: int | None = None, methods: Sequence[str] | None = None,
             start: int | None = None, end: int | None = None, last: int | None = None) -> str:
        """The session's HTML view (:mod:`contextrender.view`) under one or two methods (fresh policies).

        It draws invocations ``start``..``end`` or the ``last`` N (default: the latest
        :data:`~contextrender.view.DEFAULT_VIEW_INVOCATIONS`): a window over
        :data:`~contextrender.view.MAX_VIEW_INVOCATIONS` is refused (:class:`BadRequest`), and so is a page
        over :data:`~contextrender.view.MAX_VIEW_BYTES` (:class:`TooLarge`), each naming how to narrow it.
        """
        from contextrender.view import (
            MAX_VIEW_BYTES,
            MAX_VIEW_INVOCATIONS,
            ViewLimitError,
            ViewWindow,
            method_view,
            render_html,
        )

        b = self._budget(budget)
        names = [self._method(m) for m in (methods or [self.default_method])]
        if not 1 <= len(names) <= 2:
            raise BadRequest("a view compares one or two methods, e.g. methods=contextrender,prune")
        from contextrender.registry import method_names

        unknown = [m for m in names if m not in method_names()]
        if unknown:
            raise BadRequest(f"unknown method {unknown[0]!r}; known: {', '.join(method_names())}")
        window = ViewWindow(start, end, last)
        with self._session(sid, create=False) as (session, _):
            messages = session.openai_messages()
        try:  # replayed on fresh in-memory graphs: the stored session is never written (its usage rows only read)
            data = method_view(messages, names, b, session_id=sid, embedder=self.embedder, compactor=self.compactor,
                               window=window, max_invocations=MAX_VIEW_INVOCATIONS, max_bytes=MAX_VIEW_BYTES,
                               usage=session)
        except ViewLimitError as e:
            raise (TooLarge if e.too_large else BadRequest)(str(e)) from None
        except BudgetExceeded as e:
            raise InternalError(f"render failed the budget check: {e}") from None
        page = render_html(data)
        size = len(page.encode("utf-8"))
        if size > MAX_VIEW_BYTES:
            w = data.window or {}
            raise TooLarge(f"the view of invocations {w.get('from')}..{w.get('to')} is {size} bytes, over the "
                           f"{MAX_VIEW_BYTES}-byte limit: draw fewer invocations (from/to or last)")
        return page

    def export(self, sid: str) -> ExportResult:
        """The session as one replay-trace episode ``{"task_id", "messages"}`` (experiments/evaluation/traces.py)."""
        with self._session(sid, create=False) as (session, _):
            return ExportResult(sid, tuple(session.openai_messages()))


__all__ = ["ContextService", "MAX_FORKING_KEY", "MAX_USAGE_ROWS", "SerialEmbedder", "WARM_UP_TEXT", "same_message",
           "warm_up"]
