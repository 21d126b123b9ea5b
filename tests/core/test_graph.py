"""Persistent context graph (docs/method.md §2): append-only SQLite, sessions, sync, validation, restart-resume."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from contextrender import ContextGraph, ContextRender, GraphError, HashingEmbedder, MessageError, TokenCounter
from contextrender.billing import PromptUsage
from contextrender.graph import _TABLES

from ._helpers import Transcript, filler, result_seq

ROOT = Path(__file__).resolve().parents[2]


def _agent_transcript(turns=14):
    t = Transcript(task="Reconcile the invoices of vendor_acme_9 against the ledger.")
    for k in range(turns):
        if k % 5 == 4:
            t.user(f"Status update {k}: also check vendor_beta_{k}.")
        body = f"invoice inv_{k:03d} vendor_acme_9 amount {100 + k}.00 ref_{k * 7:04d}\n" + filler(f"page_{k}", 60 + 10 * k)
        args = {"vendor": "vendor_acme_9", "page": k, "prev": f"ref_{(k - 1) * 7:04d}" if k else None}
        t.turn(("fetch_invoices", args, body), *([("lookup", {"ref": f"inv_{k - 1:03d}"}, filler(f"lk_{k}", 30))] if k % 3 == 1 else []),
               content=f"Checked inv_{k - 1:03d}." if k % 2 else None)
    return t.messages


# ---------------------------------------------------------------------------------------------
# Append-only, WAL, sessions
# ---------------------------------------------------------------------------------------------


def _populated(graph, hashing_embedder):
    t = Transcript()
    t.call("a", {}, "value_one_1 and more")
    t.call("b", {"x": "value_one_1"}, filler("second", 200))
    s = t.into(graph, "task-1")
    ContextRender(embedder=hashing_embedder).render(s, 60)  # stores embeddings
    s.put_artifact("compaction", "k", {"text": "x"})
    s.add_prompt_usage("chat", PromptUsage(100, 40, 0, 5), streamed=False, at=len(s))
    return s


def test_every_table_refuses_update_and_delete(graph, hashing_embedder):
    _populated(graph, hashing_embedder)
    raw = sqlite3.connect(graph.path, isolation_level=None)
    try:
        for table, cols in _TABLES.items():
            col = cols.split()[0]
            before = raw.execute(f"SELECT * FROM {table}").fetchall()
            assert before, f"{table} has no rows to attack"
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                raw.execute(f"UPDATE {table} SET {col} = {col}")
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                raw.execute(f"DELETE FROM {table}")
            assert raw.execute(f"SELECT * FROM {table}").fetchall() == before
    finally:
        raw.close()


def test_wal_mode_is_on(graph):
    graph.session("s")
    raw = sqlite3.connect(graph.path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    finally:
        raw.close()


def test_many_sessions_per_file_are_isolated(tmp_path):
    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        ta = Transcript(task="A")
        ra = ta.call("get", {}, "shared_val_1")
        ta.call("use", {"v": "shared_val_1"}, "ok")
        tb = Transcript(task="B")
        tb.call("use", {"v": "shared_val_1"}, "ok")  # the value exists only in session A's result
        sa, sb = ta.into(g, "a"), tb.into(g, "b")
        assert len(sb.reuse_edges()) == 0 and len(sa.reuse_edges()) == 1
    with ContextGraph(path) as g:
        assert g.session_ids() == ["a", "b"]
        sa, sb = g.session("a"), g.session("b")
        assert sa.openai_messages() == ta.messages and sb.openai_messages() == tb.messages
        assert sa.reuse_score(result_seq(sa, ra)) == 1.0 and sb.reuse_edges() == []
        assert len(sa) == len(ta.messages) and len(sb) == len(tb.messages)
        assert sb.message(1).content == "B"


def test_session_encoding_is_fixed(tmp_path):
    path = tmp_path / "g.sqlite"
    with ContextGraph(path) as g:
        g.session("s")
    with ContextGraph(path) as g, pytest.raises(GraphError, match="encoding"):
        g.session("s", counter=TokenCounter("cl100k_base"))


def test_render_is_a_view_and_omitted_results_can_return(graph, hashing_embedder):
    t = Transcript()
    for k in range(5):
        t.call("get", {"k": k}, filler(f"res_{k}_val", 150))
    s = t.into(graph)
    n_rows = graph._query("SELECT COUNT(*) FROM messages")[0][0]
    small = ContextRender(embedder=hashing_embedder).render(s, 250)
    omitted = {r.seq for r in s.results} - small.visible
    assert omitted
    assert graph._query("SELECT COUNT(*) FROM messages")[0][0] == n_rows
    assert all(s.message(q).content.startswith("res_") for q in omitted)
    big = ContextRender(embedder=hashing_embedder).render(s, 10_000)
    assert omitted <= big.visible


# ---------------------------------------------------------------------------------------------
# sync and validation
# ---------------------------------------------------------------------------------------------


def test_sync_appends_only_the_unseen_tail(graph):
    msgs = _agent_transcript(6)
    s = graph.session("s")
    assert s.sync(msgs[:5]) == 5
    assert s.sync(msgs[:5]) == 0
    assert s.sync(msgs) == len(msgs) - 5
    assert graph._query("SELECT COUNT(*) FROM messages WHERE session_id = 's'")[0][0] == len(msgs)
    assert s.openai_messages() == [json.loads(json.dumps(m)) for m in msgs]


def test_sync_rejects_diverged_or_trimmed_history(graph):
    msgs = _agent_transcript(6)
    s = graph.session("s")
    s.sync(msgs)
    edited = json.loads(json.dumps(msgs))
    edited[3]["content"] = edited[3]["content"] + " (edited)"
    with pytest.raises(GraphError, match="message 3"):
        s.sync(edited + [{"role": "user", "content": "more"}])
    with pytest.raises(GraphError):
        s.sync(msgs[:-2])
    assert len(s) == len(msgs)
    assert graph._query("SELECT COUNT(*) FROM messages")[0][0] == len(msgs)


@pytest.mark.parametrize("bad", [
    {"role": "robot", "content": "hi"},
    {"role": "tool", "content": "no id"},
    {"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}]},
    {"role": "user", "content": 42},
    {"role": "user", "content": [{"text": "no type"}]},
    "not a dict",
])
def test_malformed_message_raises_message_error_naming_it(graph, bad):
    s = graph.session("sess-x")
    s.sync([{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
            {"role": "assistant", "content": "ok"}])
    with pytest.raises(MessageError) as exc:
        s.sync(list(s.openai_messages()) + [bad])
    assert "message 3" in str(exc.value) and "sess-x" in str(exc.value)
    assert len(s) == 3


# ---------------------------------------------------------------------------------------------
# Restart-resume: a killed writer, a reopened file, identical renders
# ---------------------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, sys, time
    from contextrender import ContextGraph, ContextRender, HashingEmbedder
    path, msgs_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    msgs = json.load(open(msgs_path))
    g = ContextGraph(path)
    s = g.session("episode")
    policy = ContextRender(embedder=HashingEmbedder(dim=256))
    for i in range(1, n + 1):  # an agent loop: sync, render before each model call
        s.sync(msgs[:i])
        if msgs[i - 1]["role"] != "assistant":
            policy.render(s, 500)
    print("READY", flush=True)
    time.sleep(600)
""")


def _compare(a, b, budgets):
    assert a.openai_messages() == b.openai_messages()
    assert a.reuse_edges() == b.reuse_edges()
    assert (a.flow.first_source, a.flow.n_results, a.flow.uses, a.flow.used_by_source) == (
        b.flow.first_source, b.flow.n_results, b.flow.uses, b.flow.used_by_source)
    strip = lambda rs: [{k: v for k, v in r.__dict__.items() if k != "created_at"} for r in rs]  # noqa: E731
    assert strip(a.results) == strip(b.results)
    selected = 0
    for budget in budgets:
        sa = ContextRender(embedder=HashingEmbedder(dim=256)).select(a, budget)
        sb = ContextRender(embedder=HashingEmbedder(dim=256)).select(b, budget)
        assert sa.scores == sb.scores
        assert sa.rendered.messages == sb.rendered.messages
        assert sa.rendered.visible == sb.rendered.visible
        assert sa.rendered.tokens == sb.rendered.tokens
        selected += (not sa.shortcut) and bool(sa.scores)
    assert selected >= 2  # the comparison exercised real selections, not only the shortcut


def test_restart_resume_after_sigkill_equals_uninterrupted_build(tmp_path):
    msgs = _agent_transcript(14)
    n = len(msgs) - 9
    msgs_path = tmp_path / "msgs.json"
    msgs_path.write_text(json.dumps(msgs))
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    path = tmp_path / "graph.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(script), str(path), str(msgs_path), str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    try:
        line = proc.stdout.readline()
        assert line.strip() == "READY", proc.stderr.read()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    budgets = (150, 400, 900, 2000, 100_000)
    with ContextGraph(path) as g:
        resumed = g.session("episode")
        assert len(resumed) == n
        assert g._query("SELECT COUNT(*) FROM embeddings")[0][0] > 0  # the child rendered before dying
        reference = ContextGraph().session("episode")
        reference.sync(msgs[:n])
        _compare(resumed, reference, budgets)
        # Resume the episode: both continue identically.
        resumed.sync(msgs)
        reference.sync(msgs)
        _compare(resumed, reference, budgets)


def test_marker_cost_is_recounted_when_an_older_graph_is_opened(tmp_path, hashing_embedder):
    """Graphs written before the marker became minimal (docs/method.md §5) store the old marker's count;
    it is recounted on load, so an old file renders exactly like a new one."""
    from contextrender.graph import OMISSION_MARKER
    from contextrender.tokens import MESSAGE_OVERHEAD

    t = Transcript()
    for k in range(6):
        t.call("get", {"k": k}, filler(f"res_{k}_val", 120))
    path = tmp_path / "old.sqlite"
    with ContextGraph(path) as g:
        t.into(g, "s")
    raw = sqlite3.connect(path, isolation_level=None)
    try:  # what an older version wrote: ~20–44 tokens for "[result of NAME (call ID) omitted ...]"
        for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            raw.execute(f"DROP TRIGGER {name}")
        raw.execute("UPDATE tool_results SET marker_ntok = 40")
    finally:
        raw.close()
    with ContextGraph(path) as g, ContextGraph() as fresh:
        old, new = g.session("s"), t.into(fresh, "s")
        want = MESSAGE_OVERHEAD + old.counter.text(OMISSION_MARKER)
        assert {r.marker_ntok for r in old.results} == {want}
        a = ContextRender(embedder=hashing_embedder).render(old, 300)
        b = ContextRender(embedder=hashing_embedder).render(new, 300)
        assert a.messages == b.messages and a.tokens == b.tokens <= 300
        assert any(m["role"] == "tool" and m["content"] == OMISSION_MARKER for m in a.messages)
