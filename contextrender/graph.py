"""The persistent context graph (docs/method.md §2, paper §3.1): the only store of history.

One SQLite file (WAL mode) holds many sessions, one per task episode. Each
session stores, in transcript order, its messages, tool calls, complete tool
results (content, invocation index, timestamp, embedding), the qualifying
values TFA extracted, and reuse edges. Every table is append-only — triggers
refuse UPDATE and DELETE — so a render is always a view and an omitted result
can be selected again at any later invocation.

A session is rebuilt on open from the stored values and edges (text is never
re-scanned), so a process that dies and reopens the file renders exactly what
it would have rendered.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from contextrender.billing import PromptUsage
from contextrender.embed import checked_output
from contextrender.events import Message, MessageError, ToolCall, Usage
from contextrender.files import hold_identity_lock, hold_lock, private_dir, private_file
from contextrender.tfa import FlowIndex, ReuseEdge, extract_values
from contextrender.tokens import MESSAGE_OVERHEAD, TokenCounter

SCHEMA_VERSION = 1

_TABLES = {
    "sessions": "id TEXT PRIMARY KEY, encoding TEXT NOT NULL, created_at REAL NOT NULL, meta TEXT NOT NULL",
    "messages": (
        "session_id TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, "
        "tool_calls TEXT, tool_call_id TEXT, name TEXT, invocation INTEGER NOT NULL, ntok INTEGER NOT NULL, "
        "digest TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (session_id, seq)"
    ),
    "tool_results": (
        "session_id TEXT NOT NULL, seq INTEGER NOT NULL, call_id TEXT NOT NULL, call_seq INTEGER, "
        "tool_name TEXT NOT NULL, invocation INTEGER NOT NULL, ntok INTEGER NOT NULL, "
        "marker_ntok INTEGER NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (session_id, seq)"
    ),
    "result_values": "session_id TEXT NOT NULL, seq INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (session_id, seq, value)",
    "reuse_edges": (
        "session_id TEXT NOT NULL, op_seq INTEGER NOT NULL, part INTEGER NOT NULL, value TEXT NOT NULL, "
        "source_seq INTEGER NOT NULL, PRIMARY KEY (session_id, op_seq, part, value)"
    ),
    "embeddings": (
        "session_id TEXT NOT NULL, seq INTEGER NOT NULL, model TEXT NOT NULL, vec BLOB NOT NULL, "
        "PRIMARY KEY (session_id, seq, model)"
    ),
    # Derived texts a policy must not recompute (compactions, summaries): keyed, append-only.
    "artifacts": (
        "id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, kind TEXT NOT NULL, "
        "key TEXT NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL"
    ),
    # Each model request the proxy or wrap got an answer to, as the upstream billed it (RequestUsage): n counts a
    # session's requests from 0; at_seq is the seq its answer goes to; the four counts are NULL when the answer
    # carried no usage (unknown, never 0). Added to older files when they are opened.
    "prompt_usage": (
        "session_id TEXT NOT NULL, n INTEGER NOT NULL, api TEXT NOT NULL, streamed INTEGER NOT NULL, "
        "at_seq INTEGER NOT NULL, prompt INTEGER, cache_read INTEGER, cache_write INTEGER, output INTEGER, "
        "created_at REAL NOT NULL, PRIMARY KEY (session_id, n)"
    ),
}


class GraphError(RuntimeError):
    """The graph cannot take this input (diverged history, wrong encoding...)."""


class GraphWriteError(GraphError):
    """The graph file refused a write (a full disk, a read-only file, an I/O error). The transaction was
    rolled back: nothing of the refused operation is stored and everything committed before it is."""


class GraphCorrupt(GraphError):
    """The file is not a readable graph: SQLite cannot open it, or its ``PRAGMA quick_check`` fails."""


#: Rows of ``PRAGMA quick_check`` quoted in a :class:`GraphCorrupt` message.
_CHECK_ROWS = 3


def check_integrity(db: sqlite3.Connection, path: str) -> None:
    """Run SQLite's ``PRAGMA quick_check`` on ``db`` (the file ``path``); :class:`GraphCorrupt` unless it says ok.

    The check reads every page once (linear in the file's size) and needs no write.
    """
    try:
        rows = [" ".join(str(r[0]).split()) for r in db.execute(f"PRAGMA quick_check({_CHECK_ROWS})").fetchall()]
    except sqlite3.DatabaseError as e:
        raise GraphCorrupt(f"{path}: not a readable graph file: SQLite quick_check failed: "
                           f"{' '.join(str(e).split())}") from None
    if rows != ["ok"]:
        raise GraphCorrupt(f"{path}: damaged graph file: SQLite quick_check says: {'; '.join(rows)}"
                           " (restore it from a copy, or start with a new file)")


#: What an omitted result's tool message says (docs/method.md §5, project choice): a minimal fixed text.
#: The tool call stays in its assistant message (so call/result pairing stays valid for provider
#: APIs) and already names the tool, its arguments and the call id; the marker repeats none of
#: it. It is charged to B like any other text. The same for every policy of the paper and this
#: project; the peer strategies (baselines/peers) keep their frameworks' own placeholders.
OMISSION_MARKER = "[omitted]"

#: The tool through which a model reads back what a render left out (contextrender/expand.py, docs/method.md §16).
#: Its results are copies of earlier results: TFA does not index them as results of their own (a copy would halve
#: the credit of every value it repeats); the expansion is counted as reuse of the result it copied instead.
EXPAND_TOOL = "contextrender_expand"
#: ``part`` of a reuse edge that an expansion made (-1 is an assistant's text, i >= 0 its i-th tool call).
EXPANSION_PART = -2


@dataclass(frozen=True)
class ToolResult:
    """A stored tool result. ``seq`` (its transcript index) is its id everywhere."""

    seq: int
    call_id: str
    call_seq: int | None  # seq of the assistant message that made the call (None if orphan)
    tool_name: str
    invocation: int  # k: the invocation whose tool call produced it (docs/method.md §4, age = t − k)
    ntok: int  # Tok of the tool message with its full content
    marker_ntok: int  # Tok of the tool message carrying OMISSION_MARKER (the session's count)
    created_at: float


@dataclass(frozen=True)
class RequestUsage:
    """One model request of a session that the upstream answered, with the upstream's own figures for it.

    ``n``: the session's requests counted from 0. ``api``: which API it went to (``chat``, ``messages``,
    ``responses``). ``at``: the seq its answer goes to (the session's length when it was rendered), so the
    invocation it answered is the one whose assistant message is at ``at``. ``usage``: as billed
    (:class:`~contextrender.billing.PromptUsage`), None when the answer carried no usage (unknown, not zero).
    """

    n: int
    api: str
    streamed: bool
    at: int
    usage: PromptUsage | None
    created_at: float

    def to_json(self) -> dict[str, Any]:
        """This row as the session API answers it (the counts null when unknown)."""
        u = self.usage
        figures: dict[str, Any] = dict.fromkeys(("prompt", "cache_read", "cache_write", "output")) if u is None \
            else u.to_dict()
        return {"n": self.n, "api": self.api, "streamed": self.streamed, "at": self.at, **figures,
                "cache_hit_share": hit_share(u)}


def hit_share(usage: PromptUsage | None) -> float | None:
    """The cache-hit share of ``usage``: tokens read from the cache over all prompt tokens (None without a prompt)."""
    if usage is None or usage.prompt <= 0:
        return None
    return usage.cache_read / usage.prompt


@dataclass(frozen=True)
class UsageTotals:
    """A sum of requests' :class:`RequestUsage`: how many there were, how many carried usage (``known``), and
    the sum of those figures (``usage``); the unknown ones add nothing but to ``requests``."""

    requests: int = 0
    known: int = 0
    usage: PromptUsage = PromptUsage()

    def add(self, usage: PromptUsage | None) -> UsageTotals:
        """These totals with one more request."""
        if usage is None:
            return UsageTotals(self.requests + 1, self.known, self.usage)
        return UsageTotals(self.requests + 1, self.known + 1, self.usage + usage)

    @property
    def cache_hit_share(self) -> float | None:
        """Tokens read from the cache over all prompt tokens of the requests with usage (None before any)."""
        return hit_share(self.usage) if self.known else None

    def to_json(self) -> dict[str, Any]:
        """These totals as the session API answers them."""
        return {"requests": self.requests, "requests_with_usage": self.known, **self.usage.to_dict(),
                "cache_hit_share": self.cache_hit_share}


#: A stored usage row whose four counts make a PromptUsage (what this code writes; a file from elsewhere may hold
#: anything): any other row reads as unknown, in the totals as in the rows.
_VALID_USAGE = ("(typeof(prompt) = 'integer' AND typeof(cache_read) = 'integer' AND typeof(cache_write) = 'integer' "
                "AND typeof(output) = 'integer' AND cache_read >= 0 AND cache_write >= 0 AND output >= 0 "
                "AND cache_read + cache_write <= prompt)")

#: The API names a :class:`RequestUsage` may carry (letters, digits, ``._-``; short).
_API_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789._-")


@dataclass(frozen=True)
class ResultArrays:
    """Columns of a session's tool results, for vectorised scoring."""

    seqs: np.ndarray
    invocation: np.ndarray
    ntok: np.ndarray
    marker_ntok: np.ndarray


def attempt_of(session_id: str) -> tuple[str, int] | None:
    """``(key, n)`` of a session id ``<key>#<n>`` (the harness names an episode's n-th attempt so), else None."""
    key, sep, n = session_id.rpartition("#")
    return (key, int(n)) if sep and n.isascii() and n.isdigit() else None


def session_of(key: str, attempt: int) -> str:
    """The session id of ``key``'s ``attempt``-th episode, ``<key>#<attempt>``: what :func:`attempt_of` reads."""
    return f"{key}#{attempt}"


def _digest(msg: Message) -> str:
    return hashlib.sha256(json.dumps(msg.to_openai(), sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]


class ContextGraph:
    """A SQLite file of sessions. Thread-safe: one connection guarded by a lock.

    The file (and any folder this creates for it) is readable by the owner
    only: it holds complete transcripts. ``exclusive=True`` takes an advisory
    lock on ``<path>.lock`` for the graph's lifetime and refuses, naming the
    holder, when another process has it — for long-running writers (the
    server, the proxy) that cache sessions in memory and must be the file's
    only writer. Without it, concurrent writers to one *session* are still
    detected: the second one's append fails with a :class:`GraphError`
    instead of corrupting the history.
    """

    def __init__(self, path: str | Path = ":memory:", *, exclusive: bool = False) -> None:
        self.path = str(path)
        #: unique to this object (not its file): what a cache of derived values keys a graph by
        self.uid = uuid.uuid4().hex
        self._lockfile: Any = None
        self._identity: Any = None
        if self.path != ":memory:":
            private_dir(Path(self.path).parent)
            existed = Path(self.path).exists()
            if exclusive:
                self._hold(existed)
            else:
                private_file(Path(self.path))
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            if self.path != ":memory:" and exclusive and existed:
                check_integrity(self._db, self.path)  # a long-running writer refuses a damaged file at start
        except BaseException:
            self._release_locks()
            raise
        self._lock = threading.RLock()
        self._tx_depth = 0
        self._sessions: dict[str, Session] = {}
        self._reuse = _ReuseTally()
        try:
            with self._lock:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._create_schema()
        except BaseException as e:
            self._db.close()
            self._release_locks()
            if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError):
                raise GraphCorrupt(f"{self.path}: not a usable graph file: SQLite says: {e}") from None
            raise

    def _hold(self, existed: bool) -> None:
        """The exclusive locks of a long-running writer: on the file itself (keyed by its device and inode, so
        a hard link or a symlink to a held graph is refused too), and on ``<real path>.lock`` (naming the holder)."""
        p = Path(self.path)
        what = f"graph {self.path}"
        if not existed:
            private_file(p)
        self._identity = hold_identity_lock(p, what=what)
        try:
            self._lockfile = hold_lock(Path(os.path.realpath(self.path) + ".lock"), what=what)
        except BaseException:
            self._release_locks()
            raise

    def _release_locks(self) -> None:
        if self._lockfile is not None:
            self._lockfile.close()
            self._lockfile = None
        if self._identity is not None:
            self._identity.close()
            self._identity = None

    def _create_schema(self) -> None:
        db = self._db
        db.execute("CREATE TABLE IF NOT EXISTS schema_info (version INTEGER NOT NULL)")
        row = db.execute("SELECT version FROM schema_info").fetchone()
        if row is None:
            db.execute("INSERT INTO schema_info VALUES (?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise GraphError(f"{self.path}: graph schema v{row[0]}, this code reads v{SCHEMA_VERSION}")
        for name, cols in _TABLES.items():
            db.execute(f"CREATE TABLE IF NOT EXISTS {name} ({cols})")
            # docs/method.md §2: nothing is ever deleted or rewritten.
            for op in ("UPDATE", "DELETE"):
                db.execute(
                    f"CREATE TRIGGER IF NOT EXISTS {name}_no_{op.lower()} BEFORE {op} ON {name} "
                    f"BEGIN SELECT RAISE(ABORT, 'context graph is append-only: {op} on {name}'); END"
                )
        db.execute("CREATE INDEX IF NOT EXISTS artifacts_key ON artifacts (session_id, kind, key, id)")
        db.execute("CREATE INDEX IF NOT EXISTS prompt_usage_at ON prompt_usage (session_id, at_seq)")
        # The first edge of each source (tool_reuse): a source's edges, in rowid order, by index.
        db.execute("CREATE INDEX IF NOT EXISTS reuse_edges_source ON reuse_edges (session_id, source_seq)")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction; nested uses (a batch of appends) join the outer one."""
        with self._lock:
            if self._tx_depth:
                self._tx_depth += 1
                try:
                    yield self._db
                finally:
                    self._tx_depth -= 1
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except (sqlite3.OperationalError, OSError) as e:
                raise self._write_error(e) from e
            self._tx_depth = 1
            try:
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException as e:
                    # SQLite may have rolled back already (a full disk does): ROLLBACK only what is open.
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    if isinstance(e, (sqlite3.OperationalError, OSError)):
                        raise self._write_error(e) from e
                    raise
            finally:
                self._tx_depth = 0

    def _write_error(self, e: BaseException) -> GraphWriteError:
        full = getattr(e, "errno", None) == errno.ENOSPC or "full" in str(e).lower()
        why = "the disk is full" if full else str(e)
        return GraphWriteError(f"graph {self.path}: cannot write ({why}); nothing of this operation was stored "
                               "and everything stored before it is intact — "
                               + ("free disk space" if full else "fix the file or its folder") + " and retry")

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def session(self, session_id: str, *, counter: TokenCounter | None = None,
                meta: dict[str, Any] | None = None) -> Session:
        """Create the session, or resume it from the file if it exists."""
        with self._lock:
            if session_id in self._sessions:
                return self._sessions[session_id]
            counter = counter or TokenCounter()
            row = self._db.execute("SELECT encoding FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                with self._tx() as db:
                    db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)",
                               (session_id, counter.encoding_name, time.time(), json.dumps(meta or {})))
            elif row[0] != counter.encoding_name:
                raise GraphError(
                    f"session {session_id!r} was stored with encoding {row[0]}, not {counter.encoding_name}")
            s = Session(self, session_id, counter)
            self._sessions[session_id] = s
            return s

    @classmethod
    def snapshot(cls, path: str | Path) -> ContextGraph:
        """An in-memory copy of the graph file at ``path``, opened read-only and never written.

        For readers next to a running writer (``contextrender explain``, ``export``, the viewer):
        whatever they compute (embeddings, compactions) stays in the copy.
        """
        p = Path(path)
        if not p.is_file():
            raise GraphError(f"no graph file {p}")
        src = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        try:
            check_integrity(src, str(p))
            graph = cls(":memory:")
            with graph._lock:
                src.backup(graph._db)
            graph._create_schema()  # checks the copied schema version
        except sqlite3.DatabaseError as e:
            raise GraphCorrupt(f"{p}: not a usable graph file: SQLite says: {e}") from None
        finally:
            src.close()
        return graph

    def embedders(self, session_id: str | None = None) -> list[str]:
        """The embedders (their ``name``) whose vectors the file holds — of ``session_id``, or of any session —
        most used first: what a render of it embedded with (empty when nothing was embedded)."""
        where, args = ("WHERE session_id = ?", (session_id,)) if session_id is not None else ("", ())
        return [r[0] for r in self._query(f"SELECT model, COUNT(*) AS n FROM embeddings {where} GROUP BY model "
                                          "ORDER BY n DESC, model", args)]

    def release(self, session_id: str) -> None:
        """Drop a session's in-memory state (its rows stay in the file; reopen to resume)."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def tool_reuse(self, exclude: Iterable[str] = ()) -> dict[str, ToolReuse]:
        """Per tool name, over the sessions in the file: how many results, and how many a later step reused.

        "Reused": Tool-Flow Analysis credited at least one later operation of the same session to the
        result (docs/method.md §3) — a later tool call (``by_call``), the text of a later assistant message
        (``by_text``), either (``reused``). What a learning policy knows of the user's own tools
        (``contextrender_plus``); nothing here is fitted or shipped. Sessions in ``exclude`` are left
        out (a retried attempt's earlier tries). Incremental: each stored result and edge is read once
        per graph object, so a call costs what was added since the last one.
        """
        with self._lock:
            tally = self._reuse
            tally.refresh(self._db)
            out = {t: ToolReuse(*c) for t, c in tally.by_tool.items()}
            skip = sorted(set(exclude))
            if skip:
                marks = ",".join("?" * len(skip))
                for tool, *c in self._db.execute(
                        "SELECT r.tool_name, COUNT(*), "
                        + ", ".join(f"SUM(EXISTS (SELECT 1 FROM reuse_edges e WHERE e.session_id = r.session_id "
                                    f"AND e.source_seq = r.seq{cond}))" for cond in _EDGE_KINDS)
                        + f" FROM tool_results r WHERE r.session_id IN ({marks}) GROUP BY r.tool_name", skip):
                    have = out.get(tool, ToolReuse())
                    out[tool] = ToolReuse(*(max(a - int(b or 0), 0) for a, b in zip(astuple(have), c, strict=True)))
            return out

    def session_ids(self) -> list[str]:
        return [r[0] for r in self._query("SELECT id FROM sessions ORDER BY created_at, id")]

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._sessions.clear()
            self._release_locks()  # after the connection: the identity lock's descriptor is the file's

    def __enter__(self) -> ContextGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ToolReuse:
    """One tool's results in a graph file, and how many of them a later step reused (and how)."""

    results: int = 0
    reused: int = 0  # by any later operation
    by_call: int = 0  # by a later tool call
    by_text: int = 0  # by the text of a later assistant message


#: SQL conditions on an edge for ToolReuse's reused / by_call / by_text (part -1: an assistant's text; an
#: expansion's edge, EXPANSION_PART, counts as a reuse of neither kind).
_EDGE_KINDS = ("", " AND e.part >= 0", " AND e.part = -1")


class _ReuseTally:
    """:meth:`ContextGraph.tool_reuse`'s running counts: rows read so far (rowids only grow: append-only)."""

    def __init__(self) -> None:
        self.results_upto = 0
        self.edges_upto = 0
        self.by_tool: dict[str, list[int]] = {}

    def refresh(self, db: sqlite3.Connection) -> None:
        for rowid, tool in db.execute("SELECT rowid, tool_name FROM tool_results WHERE rowid > ? ORDER BY rowid",
                                      (self.results_upto,)).fetchall():
            self.by_tool.setdefault(tool, [0, 0, 0, 0])[0] += 1
            self.results_upto = rowid
        # An edge counts its source once per kind: when it is that source's first edge of the kind.
        firsts = ", ".join(f"(SELECT MIN(e.rowid) FROM reuse_edges e WHERE e.session_id = n.session_id AND "
                           f"e.source_seq = n.source_seq{cond})" for cond in _EDGE_KINDS)
        for rowid, tool, *first in db.execute(
                f"SELECT n.rowid, r.tool_name, {firsts} FROM reuse_edges n JOIN tool_results r ON "
                "r.session_id = n.session_id AND r.seq = n.source_seq WHERE n.rowid > ? ORDER BY n.rowid",
                (self.edges_upto,)).fetchall():
            counts = self.by_tool.setdefault(tool, [0, 0, 0, 0])
            for k, f in enumerate(first, start=1):
                if f == rowid:
                    counts[k] += 1
            self.edges_upto = max(self.edges_upto, rowid)


class Session:
    """One task episode's history, with its TFA index. Obtain via :meth:`ContextGraph.session`."""

    def __init__(self, graph: ContextGraph, session_id: str, counter: TokenCounter) -> None:
        self.graph = graph
        self.id = session_id
        self.counter = counter
        #: Tok of a tool message carrying :data:`OMISSION_MARKER` under this session's counter.
        self.marker_ntok = MESSAGE_OVERHEAD + counter.text(OMISSION_MARKER)
        self._messages: list[Message] = []
        self._ntok: list[int] = []
        self._total_ntok = 0
        self._digests: list[str] = []
        self._invocations: list[int] = []  # invocation index of each message
        self._results: list[ToolResult] = []
        self._result_by_seq: dict[int, ToolResult] = {}
        self._calls: dict[str, tuple[int, ToolCall, int]] = {}  # call id -> (assistant seq, call, invocation)
        self._n_assistant = 0
        self.flow = FlowIndex()
        self._emb: dict[str, dict[int, np.ndarray]] = {}
        self._emb_mat: dict[str, tuple[np.ndarray, int]] = {}  # model -> (buffer, rows filled), results order
        self._arrays: ResultArrays | None = None
        self._verbatim: tuple[np.ndarray, np.ndarray, int] | None = None
        self._usage = UsageTotals()
        self._expand_key: bytes | None = None
        self._load()

    # -- loading -----------------------------------------------------------------

    def _load(self) -> None:
        q = self.graph._query
        for _seq, role, content, calls, tcid, name, inv, ntok, digest in q(
            "SELECT seq, role, content, tool_calls, tool_call_id, name, invocation, ntok, digest "
            "FROM messages WHERE session_id = ? ORDER BY seq", (self.id,)):
            tool_calls = tuple(ToolCall(**c) for c in json.loads(calls)) if calls else ()
            msg = Message(role=role, content=content, tool_calls=tool_calls, tool_call_id=tcid, name=name)
            self._remember(msg, ntok, digest, inv)
        for row in q("SELECT seq, call_id, call_seq, tool_name, invocation, ntok, marker_ntok, created_at "
                     "FROM tool_results WHERE session_id = ? ORDER BY seq", (self.id,)):
            # The stored marker count is not trusted: graphs written before the marker became
            # minimal hold the longer marker's count. The marker is fixed, so recount it.
            r = replace(ToolResult(*row), marker_ntok=self.marker_ntok)
            self._results.append(r)
            self._result_by_seq[r.seq] = r
        values: dict[int, list[str]] = {}
        for seq, value in q("SELECT seq, value FROM result_values WHERE session_id = ? ORDER BY seq, value", (self.id,)):
            values.setdefault(seq, []).append(value)
        edges_by_op: dict[int, list[ReuseEdge]] = {}
        for op_seq, part, value, src in q(
            "SELECT op_seq, part, value, source_seq FROM reuse_edges WHERE session_id = ? "
            "ORDER BY op_seq, part, value", (self.id,)):
            edges_by_op.setdefault(op_seq, []).append(ReuseEdge(src, op_seq, part, value))
        self._usage = self._stored_usage_totals()
        # Replay the index updates in transcript order: identical state to the live one.
        for seq in range(len(self._messages)):
            if seq in values:
                self.flow.add_result_values(seq, values[seq])
            if seq in edges_by_op:
                self.flow.add_edges(edges_by_op[seq])
        # An expansion answered inside the service is credited to the seq its answer goes to, which may not be
        # stored yet (record_expansion).
        for op_seq in sorted(s for s in edges_by_op if s >= len(self._messages)):
            self.flow.add_edges(edges_by_op[op_seq])

    def _remember(self, msg: Message, ntok: int, digest: str, invocation: int) -> None:
        seq = len(self._messages)
        self._messages.append(msg)
        self._ntok.append(ntok)
        self._total_ntok += ntok
        self._digests.append(digest)
        self._invocations.append(invocation)
        if msg.role == "assistant":
            self._n_assistant += 1
            for c in msg.tool_calls:
                self._calls[c.id] = (seq, c, invocation)

    # -- appending ---------------------------------------------------------------

    def add(self, message: Message | dict[str, Any]) -> int:
        """Append one OpenAI-format message; return its seq (transcript index).

        Tool results are indexed by TFA; assistant messages are scanned as
        operations (their text, and each tool call) for reuse of earlier values.
        """
        return self.extend([message])[0]

    def extend(self, messages: Iterable[Message | dict[str, Any]]) -> list[int]:
        """Append messages atomically: every one is validated first, then all are stored in one transaction.

        If any message is malformed nothing is stored (:class:`MessageError`
        naming it); if storing fails, the transaction rolls back and the
        in-memory state is rebuilt from the file, so memory and file agree.
        """
        n = len(self._messages)
        parsed = [Message.from_openai(m, f"session {self.id!r} message {n + i}") for i, m in enumerate(messages)]
        if not parsed:
            return []
        try:
            with self.graph._tx() as db:
                seqs = [self._append(db, msg) for msg in parsed]
        except BaseException as exc:
            # Keep memory equal to the file: rebuild the index from what was committed.
            self._reset_and_reload()
            if isinstance(exc, sqlite3.IntegrityError):
                raise GraphError(f"session {self.id!r}: message {len(self._messages)} is already stored — another "
                                 "writer appended to this session (one writer per session; the server and proxy "
                                 "lock their graph file)") from exc
            raise
        return seqs

    def _append(self, db: sqlite3.Connection, msg: Message) -> int:
        """Store one validated message inside the caller's transaction and index it."""
        seq = len(self._messages)
        ntok = self.counter.message(msg)
        digest = _digest(msg)
        now = time.time()
        invocation = self._n_assistant  # an assistant message is invocation k = #assistants before it
        result: ToolResult | None = None
        values: list[str] = []
        edges: list[ReuseEdge] = []
        if msg.role == "tool":
            assert msg.tool_call_id is not None
            call = self._calls.get(msg.tool_call_id)
            if call is not None:
                call_seq, tc, k = call
                tool_name, result_inv = tc.name, k
            else:  # an orphan result: treat it as produced by the latest invocation
                call_seq, tool_name, result_inv = None, msg.name or "tool", self._n_assistant - 1
            result = ToolResult(seq, msg.tool_call_id, call_seq, tool_name, result_inv, ntok,
                                self.marker_ntok, now)
            invocation = result_inv
            # An expansion's result is a copy (EXPAND_TOOL): not indexed, its use is credited by record_expansion.
            values = [] if tool_name == EXPAND_TOOL else self.flow.add_result(seq, msg.content)
        elif msg.role == "assistant":
            if msg.content:
                edges += self.flow.add_operation(seq, -1, msg.content)
            for i, tc in enumerate(msg.tool_calls):
                edges += self.flow.add_operation(seq, i, tc.text())
        calls_json = json.dumps([c.__dict__ for c in msg.tool_calls]) if msg.tool_calls else None
        db.execute("INSERT INTO messages VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   (self.id, seq, msg.role, msg.content, calls_json, msg.tool_call_id, msg.name,
                    invocation, ntok, digest, now))
        if result is not None:
            db.execute("INSERT INTO tool_results VALUES (?,?,?,?,?,?,?,?,?)",
                       (self.id, seq, result.call_id, result.call_seq, result.tool_name,
                        result.invocation, result.ntok, result.marker_ntok, now))
            db.executemany("INSERT INTO result_values VALUES (?,?,?)", [(self.id, seq, v) for v in values])
        db.executemany("INSERT INTO reuse_edges VALUES (?,?,?,?,?)",
                       [(self.id, e.op_seq, e.part, e.value, e.source) for e in edges])
        self._remember(msg, ntok, digest, invocation)
        if result is not None:
            self._results.append(result)
            self._result_by_seq[seq] = result
        return seq

    def _reset_and_reload(self) -> None:
        self.flow = FlowIndex()
        self._messages, self._ntok, self._digests, self._invocations = [], [], [], []
        self._total_ntok, self._arrays, self._emb_mat, self._verbatim = 0, None, {}, None
        self._results, self._result_by_seq, self._calls, self._n_assistant = [], {}, {}, 0
        self._load()

    def sync(self, messages: Sequence[Message | dict[str, Any]], *, verify: str = "full") -> int:
        """Make the session hold ``messages`` (an agent's full, untrimmed list).

        Messages already stored must match (by content digest); the unseen tail
        is appended. Returns how many were added. Raises :class:`GraphError` if
        the agent's history diverged from the stored one, since silently
        accepting an edited past would corrupt TFA. ``verify="full"`` (default)
        checks every stored message; ``verify="ends"`` checks only the first and
        the last, O(1) per call, for loops that sync a growing list every turn
        and can vouch that they never edit the middle.
        """
        n = len(self._messages)
        if len(messages) < n:
            raise GraphError(f"session {self.id!r}: got {len(messages)} messages, graph holds {n}; "
                             "pass the full history, not a trimmed one")
        if verify not in ("ends", "full"):
            raise ValueError(f"verify must be 'ends' or 'full', not {verify!r}")
        for i in (range(n) if verify == "full" else sorted({0, n - 1}) if n else ()):
            m = Message.from_openai(messages[i], f"session {self.id!r} message {i}")
            if _digest(m) != self._digests[i]:
                raise GraphError(f"session {self.id!r}: message {i} differs from the stored one; "
                                 "history is append-only")
        self.extend(messages[n:])
        return len(messages) - n

    # -- reads -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._messages)

    @property
    def messages(self) -> Sequence[Message]:
        return tuple(self._messages)

    def message(self, seq: int) -> Message:
        return self._messages[seq]

    def digest(self, seq: int) -> str:
        """The stored content digest of message ``seq``: with the graph's ``uid`` and the session id, what names
        this message's text for a cache (a session id alone recurs across graph files and in-memory graphs)."""
        return self._digests[seq]

    def ntok(self, seq: int) -> int:
        """Stored token count of message ``seq`` (full content)."""
        return self._ntok[seq]

    def openai_messages(self) -> list[dict[str, Any]]:
        return [m.to_openai() for m in self._messages]

    @property
    def results(self) -> Sequence[ToolResult]:
        """Tool results in transcript order."""
        return tuple(self._results)

    def result(self, seq: int) -> ToolResult:
        return self._result_by_seq[seq]

    def result_arrays(self) -> ResultArrays:
        """Per-result columns as numpy arrays, in transcript order (cached until the next add)."""
        if self._arrays is None or len(self._arrays.seqs) != len(self._results):
            rs = self._results
            self._arrays = ResultArrays(
                seqs=np.fromiter((r.seq for r in rs), dtype=np.int64, count=len(rs)),
                invocation=np.fromiter((r.invocation for r in rs), dtype=np.int64, count=len(rs)),
                ntok=np.fromiter((r.ntok for r in rs), dtype=np.int64, count=len(rs)),
                marker_ntok=np.fromiter((r.marker_ntok for r in rs), dtype=np.int64, count=len(rs)))
        return self._arrays

    def verbatim_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Per message: (Tok with results as their markers, seq of its unit's first message).

        A unit is a user/system message alone, or an assistant message with the
        tool results of its calls — what the verbatim-overflow rule drops together.
        """
        n = len(self._messages)
        cost, unit, have = self._verbatim if self._verbatim is not None else (np.empty(0, np.int64), np.empty(0, np.int64), 0)
        if have < n:
            new_cost = np.empty(n - have, dtype=np.int64)
            new_unit = np.empty(n - have, dtype=np.int64)
            for j, seq in enumerate(range(have, n)):
                r = self._result_by_seq.get(seq)
                new_cost[j] = r.marker_ntok if r is not None else self._ntok[seq]
                new_unit[j] = r.call_seq if (r is not None and r.call_seq is not None) else seq
            cost = np.concatenate([cost[:have], new_cost])
            unit = np.concatenate([unit[:have], new_unit])
            self._verbatim = (cost, unit, n)
        return cost, unit

    def tokens_of(self, seqs: Iterable[int]) -> int:
        """Σ stored Tok of messages ``seqs`` (full content)."""
        ntok = self._ntok
        return sum(ntok[s] for s in seqs)

    @property
    def total_tokens(self) -> int:
        """Σ Tok over every message of the session."""
        return self._total_ntok

    def is_result(self, seq: int) -> bool:
        return seq in self._result_by_seq

    @property
    def next_invocation(self) -> int:
        """t: the index of the next model call (number of assistant messages so far)."""
        return self._n_assistant

    def invocation_of(self, seq: int) -> int:
        return self._invocations[seq]

    def reuse_score(self, seq: int) -> float:
        """c_t(r) (Eq. 1) for the result at ``seq``, with t = the next invocation."""
        return self.flow.reuse_score(seq)

    def reuse_edges(self) -> list[ReuseEdge]:
        rows = self.graph._query("SELECT source_seq, op_seq, part, value FROM reuse_edges WHERE session_id = ? "
                                 "ORDER BY op_seq, part, value", (self.id,))
        return [ReuseEdge(*r) for r in rows]

    def record_expansion(self, text: str, at: int) -> list[ReuseEdge]:
        """Count an expansion (docs/method.md §16) as reuse: each value of ``text`` (what the expand tool returned)
        is used once by operation ``at`` (the seq of the assistant message that called the tool, or, inside the
        service, the seq its answer goes to), credited to its first source like any use (§3). Each value counts
        once per operation, as in §3: a second expansion by the same operation adds only values new to it.
        Returns the edges added (stored with ``part`` :data:`EXPANSION_PART`)."""
        values = sorted(v for v in extract_values(text) if v in self.flow.first_source)
        if not values:
            return []
        have = {r[0] for r in self.graph._query(
            "SELECT value FROM reuse_edges WHERE session_id = ? AND op_seq = ? AND part = ?",
            (self.id, at, EXPANSION_PART))}
        edges = [ReuseEdge(self.flow.first_source[v], at, EXPANSION_PART, v) for v in values if v not in have]
        if edges:
            with self.graph._tx() as db:
                db.executemany("INSERT INTO reuse_edges VALUES (?,?,?,?,?)",
                               [(self.id, e.op_seq, e.part, e.value, e.source) for e in edges])
            self.flow.add_edges(edges)
        return edges

    def expand_key(self, *, create: bool = False) -> bytes | None:
        """This session's secret for expand handles (contextrender/expand.py): random, made once when the expand
        tool is first offered in the session (``create``) and kept in the file, so handles survive a restart.
        None while the tool was never offered here."""
        if self._expand_key is None:
            oldest = ("SELECT payload FROM artifacts WHERE session_id = ? AND kind = 'expand' AND key = 'key' "
                      "ORDER BY id LIMIT 1")
            rows = self.graph._query(oldest, (self.id,))
            if not rows and create:
                self.put_artifact("expand", "key", {"key": secrets.token_hex(32)})
                rows = self.graph._query(oldest, (self.id,))  # the first key written is the session's
            if rows:
                self._expand_key = bytes.fromhex(str(json.loads(rows[0][0])["key"]))
        return self._expand_key

    def result_values(self, seq: int) -> list[str]:
        rows = self.graph._query("SELECT value FROM result_values WHERE session_id = ? AND seq = ? ORDER BY value",
                                 (self.id, seq))
        return [r[0] for r in rows]

    # -- embeddings (docs/method.md §2: computed once per result and stored) ---------------

    def result_embeddings(self, embedder: Any, seqs: Sequence[int]) -> tuple[np.ndarray, Usage]:
        """Unit embeddings of results ``seqs`` (rows in the given order).

        Missing ones are computed once (first ``embedder.max_chars`` characters,
        docs/method.md §4) and stored; the returned usage counts only those newly computed.
        """
        model = embedder.name
        store = self._emb.get(model)
        if store is None:
            store = {}
            for seq, blob in self.graph._query(
                    "SELECT seq, vec FROM embeddings WHERE session_id = ? AND model = ?", (self.id, model)):
                store[seq] = np.frombuffer(blob, dtype=np.float32)
            self._emb[model] = store
        missing = [s for s in seqs if s not in store]
        usage = Usage()
        if missing:
            texts = [self._messages[s].content for s in missing]
            vecs, usage = checked_output(embedder.embed_documents(texts), embedder, "embed_documents", len(texts))
            with self.graph._tx() as db:
                db.executemany("INSERT INTO embeddings VALUES (?,?,?,?)",
                               [(self.id, s, model, v.astype(np.float32).tobytes()) for s, v in zip(missing, vecs, strict=True)])
            for s, v in zip(missing, vecs, strict=True):
                store[s] = v.astype(np.float32)
        if not seqs:
            return np.zeros((0, getattr(embedder, "dim", 0)), dtype=np.float32), usage
        n = len(self._results)
        if len(seqs) == n and np.array_equal(np.asarray(seqs), self.result_arrays().seqs):
            # The common case (every result, in order): one cached matrix grown with doubling
            # capacity, instead of restacking n rows per render.
            buf, have = self._emb_mat.get(model, (None, 0))
            if have < n:
                rows = np.stack([store[r.seq] for r in self._results[have:]])
                if buf is None or buf.shape[0] < n:
                    grown = np.empty((max(n, 2 * (0 if buf is None else buf.shape[0]), 64), rows.shape[1]),
                                     dtype=np.float32)
                    if buf is not None:
                        grown[:have] = buf[:have]
                    buf = grown
                buf[have:n] = rows
                self._emb_mat[model] = (buf, n)
            assert buf is not None
            return buf[:n], usage
        return np.stack([store[s] for s in seqs]), usage

    # -- prompt-cache usage: what each answered request was billed (append-only) --

    def _stored_usage_totals(self) -> UsageTotals:
        ok = _VALID_USAGE
        (requests, known, prompt, read, write, output), = self.graph._query(
            f"SELECT COUNT(*), TOTAL({ok}), TOTAL(CASE WHEN {ok} THEN prompt END), "
            f"TOTAL(CASE WHEN {ok} THEN cache_read END), TOTAL(CASE WHEN {ok} THEN cache_write END), "
            f"TOTAL(CASE WHEN {ok} THEN output END) FROM prompt_usage WHERE session_id = ?", (self.id,))
        return UsageTotals(int(requests), int(known), PromptUsage(int(prompt), int(read), int(write), int(output)))

    def add_prompt_usage(self, api: str, usage: PromptUsage | None, *, streamed: bool, at: int) -> RequestUsage:
        """Store one answered request's usage as the upstream billed it (None: its answer carried none).

        ``at`` is the seq the request's answer goes to (the session's length when it was rendered); ``api`` a
        short name (``chat``, ``messages``, ``responses``). The row is the session's next ``n``; a row another
        writer stored first is a :class:`GraphError`, as for messages.
        """
        if not (isinstance(api, str) and 0 < len(api) <= 32 and set(api) <= _API_NAME_CHARS):
            raise ValueError(f"an API name is 1-32 characters from [a-z0-9._-], got {api!r:.40}")
        if isinstance(at, bool) or not isinstance(at, int) or at < 0:
            raise ValueError(f"'at' must be a seq (an int ≥ 0), got {at!r:.40}")
        if usage is not None and not isinstance(usage, PromptUsage):
            raise TypeError(f"usage must be a PromptUsage or None, got {type(usage).__name__}")
        row = RequestUsage(self._usage.requests, api, bool(streamed), at, usage, time.time())
        figures = (None,) * 4 if usage is None else (usage.prompt, usage.cache_read, usage.cache_write, usage.output)
        try:
            with self.graph._tx() as db:
                db.execute("INSERT INTO prompt_usage (session_id, n, api, streamed, at_seq, prompt, cache_read, "
                           "cache_write, output, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           (self.id, row.n, api, int(row.streamed), at, *figures, row.created_at))
        except sqlite3.IntegrityError as exc:
            self._usage = self._stored_usage_totals()
            raise GraphError(f"session {self.id!r}: request {row.n}'s usage is already stored — another writer "
                             "recorded usage in this session") from exc
        self._usage = self._usage.add(usage)
        return row

    def prompt_usage_totals(self) -> UsageTotals:
        """The session's requests and the sum of their billed figures (kept in memory, so no query)."""
        return self._usage

    def prompt_usage_rows(self, *, last: int | None = None, at_from: int | None = None,
                          at_to: int | None = None) -> list[RequestUsage]:
        """The session's request rows in order: the ``last`` N of them, and/or those whose answer seq ``at`` is
        within ``at_from``..``at_to`` (both inclusive)."""
        where: list[str] = ["session_id = ?"]
        args: list[Any] = [self.id]
        if at_from is not None:
            where.append("at_seq >= ?")
            args.append(at_from)
        if at_to is not None:
            where.append("at_seq <= ?")
            args.append(at_to)
        if last is not None:
            where.append("n >= ?")
            args.append(max(0, self._usage.requests - last))
        rows = self.graph._query(f"SELECT n, api, streamed, at_seq, {_VALID_USAGE}, prompt, cache_read, cache_write, "
                                 f"output, created_at FROM prompt_usage WHERE {' AND '.join(where)} ORDER BY n", args)
        return [RequestUsage(n, str(api), bool(streamed), at, PromptUsage(prompt, read, write, output) if ok else None,
                             created)
                for n, api, streamed, at, ok, prompt, read, write, output, created in rows]

    # -- artifacts (policy-derived texts, append-only) --------------------------

    def put_artifact(self, kind: str, key: str, payload: dict[str, Any]) -> None:
        with self.graph._tx() as db:
            db.execute("INSERT INTO artifacts (session_id, kind, key, payload, created_at) VALUES (?,?,?,?,?)",
                       (self.id, kind, key, json.dumps(payload, ensure_ascii=False), time.time()))

    def latest_artifact(self, kind: str, key: str) -> dict[str, Any] | None:
        rows = self.graph._query("SELECT payload FROM artifacts WHERE session_id = ? AND kind = ? AND key = ? "
                                 "ORDER BY id DESC LIMIT 1", (self.id, kind, key))
        return json.loads(rows[0][0]) if rows else None


__all__ = ["EXPANSION_PART", "EXPAND_TOOL", "ContextGraph", "GraphCorrupt", "GraphError", "GraphWriteError",
           "MessageError", "OMISSION_MARKER",
           "RequestUsage", "Session", "ToolResult", "ToolReuse", "UsageTotals", "attempt_of", "check_integrity",
           "hit_share", "session_of"]
