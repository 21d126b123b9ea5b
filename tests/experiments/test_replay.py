"""Trace files, replay through policies, and the ``contextrender.experiments.evaluation.replay`` Hydra CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contextrender import ExtractiveCompactor, HashingEmbedder
from contextrender.events import Message
from contextrender.experiments.evaluation.recall import count_events, reuse_events
from contextrender.experiments.evaluation.replay import (
    ReplayError,
    SharedEmbeddings,
    build_policies,
    history_tokens,
    likely_embedded_texts,
    markdown_table,
    replay,
)
from contextrender.experiments.evaluation.traces import Episode, TraceError, count_lines, read_traces, write_trace
from contextrender.experiments.paper import paper_results, paper_value
from contextrender.registry import CONF_DIR
from contextrender.render import Rendered, Scope, assemble, marker_text

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
FIXTURES = [DATA / "react_traces.jsonl", DATA / "parallel_agent_traces.jsonl"]
CR_METHODS = ["contextrender", "cr_recency", "cr_relevance", "cr_recency_relevance"]


def episodes(*paths: Path) -> list[Episode]:
    return [e for p in paths for e in read_traces(p)]


def call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


# -- traces -----------------------------------------------------------------------------

def test_write_and_read_roundtrip(tmp_path):
    path = tmp_path / "t.jsonl"
    msgs = [{"role": "user", "content": "héllo"},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "f", {"a": 1})]},
            {"role": "tool", "tool_call_id": "c1", "content": "line1\nline2"}]
    write_trace(path, "t1", msgs)
    write_trace(path, "t2", msgs[:1])
    eps = list(read_traces(path))
    assert [(e.task_id, e.line) for e in eps] == [("t1", 1), ("t2", 2)]
    assert list(eps[0].messages) == msgs and eps[0].assistant_indices == (1,)
    assert count_lines(path) == 2


def test_write_trace_validates(tmp_path):
    with pytest.raises(TraceError, match="message 1: tool result for call id 'zz'"):
        write_trace(tmp_path / "t.jsonl", "bad", [{"role": "user", "content": "x"},
                                                  {"role": "tool", "tool_call_id": "zz", "content": "y"}])
    assert not (tmp_path / "t.jsonl").exists()


def test_strict_reading_names_the_line():
    with pytest.raises(TraceError, match=r"malformed_traces\.jsonl:2: invalid JSON"):
        list(read_traces(DATA / "malformed_traces.jsonl"))


@pytest.mark.parametrize("line, problem", [
    ('{"task_id": 7, "messages": []}', "'task_id' must be a non-empty string"),
    ('{"task_id": "a", "messages": []}', "'messages' is empty"),
    ('[1, 2]', "expected a JSON object"),
    ('{"task_id": "a", "messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}',
     "message 0: tool_calls[0] needs function.name"),
    ('{"task_id": "a", "messages": [{"role": "user", "content": 5}]}', "message 0: 'content' must be"),
])
def test_problems_are_named(tmp_path, line, problem):
    path = tmp_path / "t.jsonl"
    path.write_text('{"task_id": "ok", "messages": [{"role": "user", "content": "x"}]}\n\n' + line + "\n")
    with pytest.raises(TraceError) as err:
        list(read_traces(path))
    assert f"t.jsonl:3: {problem}" in str(err.value)


def test_invalid_utf8_is_a_line_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"task_id": "\xff", "messages": []}\n')
    with pytest.raises(TraceError, match=r"t\.jsonl:1: not valid UTF-8"):
        list(read_traces(path))


def test_lenient_reading_skips_and_counts():
    reader = read_traces(DATA / "malformed_traces.jsonl", strict=False)
    assert [e.task_id for e in reader] == ["ok_1", "ok_2"]
    assert reader.skipped == 5
    assert [e.split(": ", 1)[0].rsplit(":", 1)[1] for e in reader.errors] == ["2", "3", "4", "5", "8"]


# -- replay -----------------------------------------------------------------------------

@pytest.fixture
def embedder():
    return HashingEmbedder(dim=256)


def run_replay(tmp_path, eps, methods, budget, embedder, on_render=None, compactor=None):
    policies, shared = build_policies(methods, embedder=embedder, compactor=compactor or ExtractiveCompactor())
    return replay(eps, policies, budget, tmp_path / "graph.sqlite", shared=shared, progress=False,
                  on_render=on_render)


def test_session_holds_exactly_the_messages_before_each_turn(tmp_path, embedder):
    eps = episodes(*FIXTURES)
    seen: list[tuple[str, int, int, int]] = []

    def hook(name, ep, j, session, rendered):
        idx = ep.assistant_indices[j]
        assert session.openai_messages() == [Message.from_openai(m).to_openai() for m in ep.messages[:idx]]
        assert session.next_invocation == j
        seen.append((name, ep.line, j, len(session)))

    run_replay(tmp_path, eps, ["contextrender", "cr_recency"], 300, embedder, hook)
    n_turns = sum(len(e.assistant_indices) for e in eps)
    assert len(seen) == 2 * n_turns


def test_budget_large_enough_gives_recall_100(tmp_path, embedder):
    eps = episodes(*FIXTURES)
    res = run_replay(tmp_path, eps, ["contextrender"], 10**6, embedder).to_json()
    m = res["methods"]["contextrender"]
    assert res["events"] == 27 and m["recall"] == 100.0
    assert all(v in (100.0, None) for v in m["recall_by_age"].values())


def test_full_history_has_recall_100(tmp_path, embedder):
    if not (CONF_DIR / "method" / "full.yaml").is_file():
        pytest.skip("conf/method/full.yaml not written yet")
    eps = episodes(*FIXTURES)
    res = run_replay(tmp_path, eps, ["full"], 200, embedder).to_json()
    assert res["methods"]["full"]["recall"] == 100.0
    assert res["methods"]["full"]["max_rendered_tokens"] > 200  # Full history may exceed B


@pytest.mark.parametrize("budget", [150, 300, 600])
def test_budgeted_policies_stay_within_budget(tmp_path, embedder, budget):
    eps = episodes(*FIXTURES)
    methods = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))  # whatever exists now
    res = run_replay(tmp_path, eps, methods, budget, embedder)
    n_turns = sum(len(e.assistant_indices) for e in eps)
    for name, tally in res.methods.items():
        s = tally.summary()
        assert s["renders"] == n_turns
        if tally.budgeted:
            assert s["over_budget_renders"] == 0, name
            assert s["max_rendered_tokens"] <= budget, name
        assert s["recall"] is not None and 0.0 <= s["recall"] <= 100.0


def test_recall_drops_with_budget(tmp_path, embedder):
    eps = episodes(*FIXTURES)
    r = {b: run_replay(tmp_path, eps, ["contextrender"], b, embedder).methods["contextrender"].stats.pct
         for b in (150, 10**6)}
    assert r[150] < r[10**6] == 100.0


class ScriptedPolicy:
    """Shows in full exactly the results scheduled for each turn; the rest as omission markers."""

    budgeted = True

    def __init__(self, schedule, claim_extra=()):
        self.name = "scripted"
        self.schedule = schedule
        self.claim_extra = set(claim_extra)

    def render(self, session, budget):
        scope = Scope.of(session)
        show = set(self.schedule.get(session.next_invocation, ()))
        results = scope.history_results(session)
        bodies = {s: marker_text(session, s) for s in results if s not in show}
        msgs = tuple(assemble(session, scope, scope.history, bodies).messages)
        draft = Rendered(msgs, 0, frozenset())
        visible = frozenset(s for s in results if s in show) | (self.claim_extra & set(results))
        return Rendered(msgs, history_tokens(session, draft), visible)


def _chain_episode() -> Episode:
    """Result at seq 2 (invocation 0) holds KEY_ALPHA; turns 1, 2, 3 and 5 use it."""
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call("c0", "f", {})]},
            {"role": "tool", "tool_call_id": "c0", "content": "KEY_ALPHA"}]
    for j in range(1, 6):
        msgs.append({"role": "assistant", "content": "KEY_ALPHA" if j in (1, 2, 3, 5) else "hmm",
                     "tool_calls": [call(f"c{j}", "f", {})]})
        msgs.append({"role": "tool", "tool_call_id": f"c{j}", "content": "nothing"})
    return Episode("chain", tuple(msgs), 1)


def test_result_reselected_after_omission(tmp_path):
    ep = _chain_episode()
    assert [(e.j, e.age) for e in reuse_events(list(ep.messages))] == [(1, 1), (2, 2), (3, 3), (5, 5)]
    policy = ScriptedPolicy({1: {2}, 2: set(), 3: {2}, 5: {2}})  # shown, omitted, shown again
    res = replay([ep], {"scripted": policy}, 10**6, tmp_path / "g.sqlite", progress=False)
    stats = res.methods["scripted"].stats
    assert (stats.events, stats.hits) == (4, 3)
    assert stats.pct_by_age == {"le3": pytest.approx(200 / 3), "4_10": 100.0, "11_25": None, "gt25": None}


def test_claiming_an_omitted_result_visible_is_an_error(tmp_path):
    policy = ScriptedPolicy({}, claim_extra={2})
    with pytest.raises(ReplayError, match="claimed visible"):
        replay([_chain_episode()], {"scripted": policy}, 10**6, tmp_path / "g.sqlite", progress=False)


def test_compacted_result_counts_as_not_visible(tmp_path, embedder):
    filler = "\n".join("plain filler words that say nothing much at all here" for _ in range(150))
    big = filler + "\nthe secret is SECRET_KEY_ZX9\n" + filler
    msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "Find the secret."},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "read_file", {"path": "a.txt"})]},
            {"role": "tool", "tool_call_id": "c1", "content": big},
            {"role": "assistant", "content": "Reading more.", "tool_calls": [call("c2", "noop", {})]},
            {"role": "tool", "tool_call_id": "c2", "content": "ok"},
            {"role": "assistant", "content": "The secret is SECRET_KEY_ZX9."}]
    ep = Episode("compact", tuple(msgs), 1)
    shown: dict[int, str] = {}

    def hook(name, ep, j, session, rendered):
        tool_msgs = [m for m in rendered.messages if m.get("tool_call_id") == "c1"]
        shown[j] = tool_msgs[0]["content"] if tool_msgs else ""
        if j == 2:
            assert 3 not in rendered.visible

    res = run_replay(tmp_path, [ep], ["contextrender"], 400, embedder, hook)
    assert "SECRET_KEY_ZX9" in shown[2] and shown[2] != big  # the compacted form carries the token...
    assert res.methods["contextrender"].stats.pct == 0.0  # ...but only the complete original text counts
    assert res.methods["contextrender"].over_budget == 0


def test_shared_embeddings_are_computed_once(tmp_path):
    from contextrender import CachedEmbedder

    inner = CachedEmbedder(HashingEmbedder(dim=64), tmp_path / "emb.sqlite")
    eps = episodes(DATA / "react_traces.jsonl")
    policies, shared = build_policies(CR_METHODS, embedder=inner, compactor=ExtractiveCompactor())
    assert isinstance(shared.embedder, SharedEmbeddings)
    replay(eps, policies, 300, tmp_path / "g.sqlite", shared=shared, progress=False)
    distinct = {t[: inner.max_chars] for e in eps for t in likely_embedded_texts(e, budget=300)}
    assert inner.misses >= len(distinct)
    # Four policies, yet the model saw each text about once (queries not guessed may add a few).
    assert inner.misses <= len(distinct) + 5


def test_markdown_table_puts_paper_values_beside_ours(tmp_path, embedder):
    eps = episodes(*FIXTURES)
    res = run_replay(tmp_path, eps, ["contextrender", "cr_recency"], 6000, embedder)
    paper = {"table": "table2", "model": "gpt-4.1", "benchmark": "appworld_test_normal"}
    md = markdown_table(res, paper)
    assert "| contextrender | 100.0 (87.2) |" in md and "(99.3)" in md
    md_other_budget = markdown_table(run_replay(tmp_path, eps, ["contextrender"], 3000, embedder), paper)
    assert "(87.2)" not in md_other_budget  # Table 2 is at B = 6000 only


def test_paper_values():
    assert paper_value("table2", "gpt-4.1", "appworld_test_normal", "contextrender", "later_used_recall") == 87.2
    assert paper_value("table2", "gpt-4.1", "moqa8", "cr_recency", "later_used_recall", budget=6000) == 86.0
    assert paper_value("table2", "gpt-4.1", "moqa8", "cr_recency", "later_used_recall", budget=3000) is None
    assert paper_value("table4", "gpt-4.1", "appworld_test_normal", "full", "reuse_events_total") == 3174
    assert paper_value("table2", "gpt-4.1", "moqa8", "no_such_method", "f1") is None
    df = paper_results()
    assert set(df.columns) == {"table", "model", "benchmark", "method", "budget", "metric", "value"}
    t4 = df[(df.table == "table4") & df.metric.str.startswith("reuse_events_age")]
    assert t4.value.sum() == 3174  # the age bins add up to the total


# -- CLI --------------------------------------------------------------------------------

def cli(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTEXTRENDER_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "contextrender.experiments.evaluation.replay", "embedding=hashing", "progress=false",
         f"hydra.run.dir={tmp_path / 'hydra'}", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_end_to_end(tmp_path):
    traces = tmp_path / "all.jsonl"
    traces.write_text("".join(p.read_text() for p in FIXTURES))
    out = tmp_path / "out" / "recall.json"
    proc = cli(tmp_path, f"traces={traces}", "budget=300", "methods=[contextrender,cr_recency]", f"output={out}")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert list(res) == ["budget", "traces", "events", "events_by_age", "skipped_lines", "methods", "trace_ids",
                         "trace_where", "billing", "expand", "ceiling", "gap_covered", "sources", "benchmark",
                         "method_settings"]
    assert (res["budget"], res["traces"], res["skipped_lines"]) == (300, 3, 0)
    # docs/method.md §14: each method's renders billed per profile over T (the traces whose history exceeded B)
    bill = res["billing"]
    assert 0 < bill["traces_T"] <= res["traces"]
    for m in ("contextrender", "cr_recency"):
        rows = bill["methods"][m]
        assert set(rows) == {"anthropic", "openai", "none"}
        for p in ("anthropic", "openai", "none"):
            u = rows[p]["usage"]
            assert u["cache_read"] + u["cache_write"] <= u["prompt"] and rows[p]["vs_full"] is None  # no Full here
        assert rows["none"]["usage"]["cache_read"] == 0 and rows["openai"]["usage"]["cache_write"] == 0
    assert res["trace_ids"] == [e.task_id for e in read_traces(traces)]
    assert [w.rsplit(":", 1)[1] for w in res["trace_where"]] == ["1", "2", "3"]
    assert all(Path(w.rsplit(":", 1)[0]).resolve() == traces.resolve() for w in res["trace_where"])
    assert res["sources"] == {"files": [{"path": str(traces.resolve()), "format": "contextrender", "episodes": 3,
                                         "skipped": 0}], "ignored": []}
    assert res["method_settings"] == {}  # no method here depends on the benchmark
    eps = episodes(*FIXTURES)
    counts = sum((count_events(reuse_events(list(e.messages))) for e in eps), count_events([]))
    assert res["events"] == counts.events == sum(res["events_by_age"].values())
    assert list(res["events_by_age"]) == ["le3", "4_10", "11_25", "gt25"]
    assert list(res["methods"]) == ["contextrender", "cr_recency"]
    for m in res["methods"].values():
        assert list(m) == ["call_readiness", "trace_readiness", "readiness", "recall", "recall_by_age",
                           "mean_rendered_tokens", "max_rendered_tokens", "over_budget_renders", "renders", "measures",
                           "hits_per_trace", "expansions_billed"]
        assert m["expansions_billed"] == 0  # no method was offered the expand tool
        assert m["readiness"]["traces"] == 3 and m["readiness"] == m["measures"]["readiness"]
        assert m["measures"]["pairing_checked_renders"] == m["renders"]
        assert len(m["hits_per_trace"]) == 3 and sum(m["hits_per_trace"]) == round(m["recall"] * res["events"] / 100)
        assert list(m["recall_by_age"]) == ["le3", "4_10", "11_25", "gt25"]
        assert m["over_budget_renders"] == 0 and m["max_rendered_tokens"] <= 300
        assert m["renders"] == sum(len(e.assistant_indices) for e in eps)
    assert "| method | recall |" in proc.stdout and "| contextrender |" in proc.stdout
    assert "Billed cost (docs/method.md §14)" in proc.stdout  # the printed summary carries the bill too
    # the hindsight ceiling, beside the methods: never above B, never below a selector with its scope
    ceil = res["ceiling"]
    assert ceil["over_budget_renders"] == 0 and ceil["renders"] == res["methods"]["contextrender"]["renders"]
    assert all(ceil["recall"] >= m["recall"] for m in res["methods"].values())
    assert "hindsight ceiling* (not a policy) |" in proc.stdout
    # how much of contextrender's gap to the ceiling the other methods cover, in the file and printed
    cr, rec, top = (x["recall"] for x in (res["methods"]["contextrender"], res["methods"]["cr_recency"], ceil))
    gap = res["gap_covered"]
    assert gap["reference"] == "contextrender" and list(gap["methods"]) == ["cr_recency"]
    from contextrender.experiments.evaluation.ceiling import gap_covered

    assert gap["methods"]["cr_recency"] == gap_covered(rec, cr, top)  # the formula itself: the test below
    assert "Gap to the ceiling covered, from contextrender" in proc.stdout


@pytest.mark.slow
def test_cli_lenient_and_strict(tmp_path):
    bad = DATA / "malformed_traces.jsonl"
    out = tmp_path / "r.json"
    proc = cli(tmp_path, f"traces={bad}", "strict=false", "methods=[cr_recency]", f"output={out}")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(out.read_text())
    assert (res["traces"], res["skipped_lines"], res["events"]) == (2, 5, 1)
    assert res["sources"]["files"][0]["skipped"] == 5
    proc = cli(tmp_path, f"traces={bad}", "methods=[cr_recency]", f"output={tmp_path / 's.json'}")
    assert proc.returncode != 0 and "malformed_traces.jsonl:2: invalid JSON" in proc.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow
def test_cli_unknown_method_fails(tmp_path):
    proc = cli(tmp_path, f"traces={FIXTURES[0]}", "methods=[no_such_method]", f"output={tmp_path / 'x.json'}")
    assert proc.returncode != 0 and "unknown method 'no_such_method'" in proc.stderr


def test_the_hindsight_ceiling_bounds_the_selectors_and_reaches_what_they_miss(tmp_path):
    """replay_traces reports the ceiling apart from the methods; on traces where ContextRender misses
    reuse events at a tight budget, the ceiling covers at least as many, and a 'ceiling' method name
    cannot be smuggled in as a policy."""
    from contextrender.experiments.evaluation.ceiling import HindsightCeiling
    from contextrender.experiments.evaluation.replay import CEILING_NAME, replay_traces

    res = replay_traces(FIXTURES, 150, ["prune", "contextrender", "cr_recency"], embedder=HashingEmbedder(dim=64),
                        compactor=ExtractiveCompactor())
    assert CEILING_NAME not in res.methods and res.ceiling is not None
    assert res.ceiling.over_budget == 0
    hits = {name: t.stats.hits for name, t in res.methods.items()}
    assert min(hits.values()) < res.events.events  # the budget is tight enough to miss some
    assert all(res.ceiling.stats.hits >= h for h in hits.values()), (res.ceiling.stats.hits, hits)
    assert res.to_json()["ceiling"]["recall"] == res.ceiling.summary()["recall"]
    # gap covered, from contextrender: at B=400 the ceiling covers more than contextrender, and prune
    # fewer (a negative share); at B=300 contextrender is at the ceiling (no gap to cover)
    wide = replay_traces(FIXTURES, 400, ["prune", "contextrender"], embedder=HashingEmbedder(dim=64),
                         compactor=ExtractiveCompactor())
    cr, pr, top = (t.stats.pct for t in (wide.methods["contextrender"], wide.methods["prune"], wide.ceiling))
    assert pr < cr < top
    gaps = wide.gap_covered()
    assert list(gaps) == ["prune"] and gaps["prune"] == pytest.approx(100 * (pr - cr) / (top - cr)) and gaps["prune"] < 0
    jg = wide.to_json()["gap_covered"]
    assert (jg["reference"], jg["methods"]) == ("contextrender", gaps)
    assert jg["interval"]["methods"] == {"prune": None}  # too few traces for an interval (gap_interval)
    assert f"prune {gaps['prune']:.0f} %" in markdown_table(wide)
    assert wide.gap_covered("prune") == {"contextrender": pytest.approx(100 * (cr - pr) / (top - pr))}
    with_full = replay_traces(FIXTURES, 400, ["prune", "contextrender", "full"], embedder=HashingEmbedder(dim=64),
                              compactor=ExtractiveCompactor())
    assert list(with_full.gap_covered()) == ["prune"]  # full ignores B: no ceiling under B bounds it
    assert "No share for full: it ignores B" in markdown_table(with_full)
    level = replay_traces(FIXTURES, 300, ["prune", "contextrender"], embedder=HashingEmbedder(dim=64),
                          compactor=ExtractiveCompactor())
    assert level.methods["contextrender"].stats.pct == level.ceiling.stats.pct
    assert level.gap_covered() == {"prune": None} and "prune no gap" in markdown_table(level)
    off = replay_traces(FIXTURES, 150, ["contextrender"], embedder=HashingEmbedder(dim=64), ceiling=False)
    assert off.ceiling is None and "ceiling" not in off.to_json() and off.gap_covered() is None
    quiet = tmp_path / "no_reuse.jsonl"  # no tool result at all: no reuse event, recall undefined
    write_trace(quiet, "chat", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    none = replay_traces(quiet, 150, ["prune", "contextrender"], embedder=HashingEmbedder(dim=64))
    assert none.events.events == 0 and none.gap_covered() is None and "gap_covered" not in none.to_json()
    assert "Gap to the ceiling" not in markdown_table(none)
    alone = replay_traces(FIXTURES, 150, ["prune"], embedder=HashingEmbedder(dim=64))
    assert alone.gap_covered() is None and "gap_covered" not in alone.to_json()  # no contextrender to start from
    with pytest.raises(ValueError, match="hindsight ceiling"):
        replay(episodes(*FIXTURES), {CEILING_NAME: object()}, 150, tmp_path / "g.sqlite",
               ceiling=HindsightCeiling(embedder=HashingEmbedder(dim=64)))


def test_a_replay_names_the_benchmark_its_traces_record(tmp_path):
    """Even when no method depends on it (no ACON): tables match a replay to its benchmark's runs by it."""
    from contextrender.experiments.evaluation.replay import replay_traces

    ep = read_traces(FIXTURES[0])
    path = tmp_path / "runner.jsonl"
    with open(path, "w", encoding="utf-8") as f:  # what the runner writes: the record key names the benchmark
        for e in ep:
            f.write(json.dumps({"task_id": e.task_id, "key": f"oracle|tau2_retail|{e.task_id}|full|2000|abc",
                                "messages": list(e.messages)}) + "\n")
    res = replay_traces(path, 300, ["prune"], embedder=HashingEmbedder(dim=64), ceiling=False)
    assert res.benchmark == {"name": "tau2_retail", "from": "traces"}
    plain = replay_traces(FIXTURES[0], 300, ["prune"], embedder=HashingEmbedder(dim=64), ceiling=False)
    assert plain.benchmark["name"] is None and plain.benchmark["from"] == "traces record none"


def test_a_task_read_twice_from_one_file_is_counted_and_said(tmp_path, caplog):
    from contextrender.experiments.evaluation.replay import replay_traces

    lines = FIXTURES[0].read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path / "twice.jsonl"
    path.write_text("".join(lines + lines[:1]), encoding="utf-8")  # the first task again, as a 2nd run appends
    with caplog.at_level("WARNING"):
        res = replay_traces(path, 300, ["prune"], embedder=HashingEmbedder(dim=64), ceiling=False)
    assert res.traces == len(lines) + 1 and res.sources["repeated_tasks"] == 1
    assert "repeat a task id" in caplog.text and f"{path}:1" in caplog.text
    once = replay_traces(FIXTURES[0], 300, ["prune"], embedder=HashingEmbedder(dim=64), ceiling=False)
    assert "repeated_tasks" not in once.sources


def _prose_dialogue(path: Path, n: int = 3) -> None:
    """Dialogues whose first lookup is reused at the end, after more assistant prose than B holds."""
    for k in range(n):
        msgs: list[dict] = [{"role": "user", "content": f"Change booking {k}."},
                            {"role": "assistant", "content": None,
                             "tool_calls": [call(f"c{k}", "get_user_details", {"user_id": f"user_{k}_77"})]},
                            {"role": "tool", "tool_call_id": f"c{k}",
                             "content": f"user_{k}_77 reservations RES_AB{k}2CD RES_ZZ{k}9QQ " + "detail " * 40}]
        for i in range(12):
            msgs += [{"role": "assistant", "content": " ".join(f"recap{i}word" for _ in range(25))},
                     {"role": "user", "content": " ".join(f"answer{i}word" for _ in range(6))}]
        msgs += [{"role": "assistant", "content": None,
                  "tool_calls": [call(f"d{k}", "update_reservation", {"reservation_id": f"RES_AB{k}2CD"})]},
                 {"role": "tool", "tool_call_id": f"d{k}", "content": "ok"}]
        write_trace(path, f"dialogue_{k}", msgs)


def test_a_prose_first_method_gets_the_ceiling_under_its_own_trim(tmp_path):
    """contextrender_plus trims verbatim overflow prose-first; replay then also reports the ceiling under that
    trim (it bounds plus; the selectors' ceiling does not) and plus's gap share against it."""
    from contextrender.experiments.evaluation.replay import TRIM_CEILING_NAME, replay_traces

    path = tmp_path / "dialogues.jsonl"
    _prose_dialogue(path)
    res = replay_traces(path, 900, ["contextrender", "contextrender_plus"], embedder=HashingEmbedder(dim=64),
                        compactor=ExtractiveCompactor())
    cr, pl = res.methods["contextrender"].stats, res.methods["contextrender_plus"].stats
    assert res.prose_first == ("contextrender_plus",) and res.trim_ceiling is not None
    assert TRIM_CEILING_NAME not in res.methods
    # The project trim drops the old lookup with the oldest turns; the prose-first trim keeps it.
    assert cr.pct < pl.pct <= res.trim_ceiling.stats.pct
    assert res.ceiling.stats.pct < res.trim_ceiling.stats.pct
    j = res.to_json()
    assert j["ceiling_prose_first_trim"]["recall"] == res.trim_ceiling.stats.pct
    own = res.own_trim_gap_covered()
    assert own is not None and (j["gap_covered_own_trim"]["reference"], j["gap_covered_own_trim"]["methods"]) == (
        "contextrender", own)
    assert own["contextrender_plus"] == pytest.approx(
        100 * (pl.pct - cr.pct) / (res.trim_ceiling.stats.pct - cr.pct))
    table = markdown_table(res)
    assert f"*{TRIM_CEILING_NAME}* (not a policy)" in table and "Gap covered against the ceiling with the same trim" in table
    # three dialogues hold the gap: too few for an interval, and the text says so
    assert res.own_trim_gap_intervals() == {"contextrender_plus": None} and res.gap_trace_count(own_trim=True) == 3
    assert "The gap lies in 3 traces: too few for an interval" in table
    many = tmp_path / "many.jsonl"
    _prose_dialogue(many, n=12)
    wide = replay_traces(many, 900, ["contextrender", "contextrender_plus"], embedder=HashingEmbedder(dim=64),
                         compactor=ExtractiveCompactor())
    ci = wide.own_trim_gap_intervals()["contextrender_plus"]
    share = wide.own_trim_gap_covered()["contextrender_plus"]
    assert ci is not None and ci[0] <= share <= ci[1] and wide.gap_trace_count(own_trim=True) == 12
    assert wide.to_json()["gap_covered_own_trim"]["interval"]["methods"]["contextrender_plus"] == list(ci)
    plain = replay_traces(path, 900, ["contextrender", "prune"], embedder=HashingEmbedder(dim=64))
    assert plain.trim_ceiling is None and "ceiling_prose_first_trim" not in plain.to_json()
    assert TRIM_CEILING_NAME not in markdown_table(plain)


def test_the_progress_bar_ends_at_the_traces_replayed_not_the_lines_counted(tmp_path, capsys):
    """The total is a hint (non-blank lines): bad, superseded or excluded lines are never replayed, so the
    bar's total is set to what was replayed when it closes, and it ends full."""
    eps = episodes(*FIXTURES)
    emb = HashingEmbedder(dim=64)
    policies, shared = build_policies(["prune"], embedder=emb, compactor=ExtractiveCompactor())
    replay(eps, policies, 300, tmp_path / "g.sqlite", shared=shared, total=len(eps) + 4, progress=True)
    frames = [f for f in capsys.readouterr().err.replace("\n", "\r").split("\r") if "replay B=300" in f]
    assert f"/{len(eps) + 4}" in frames[0]  # the bar started from the hint ...
    assert f" {len(eps)}/{len(eps)} " in frames[-1] and "100%" in frames[-1], frames  # ... and ends full


def test_billing_lines_show_each_method_as_billed_against_full():
    from contextrender.experiments.evaluation.replay import billing_lines

    bill = {"traces_T": 2, "models": {"anthropic": "claude-sonnet-4-5", "openai": "gpt-4.1", "none": "gpt-4.1"},
            "methods": {"full": {"anthropic": {"vs_full": 1.0, "cache_hit_share": 0.9},
                                 "openai": {"vs_full": 1.0, "cache_hit_share": 0.8}},
                        "prune": {"anthropic": {"vs_full": 1.391, "cache_hit_share": 0.31},
                                  "openai": {"vs_full": None, "cache_hit_share": None}}}}
    text = "\n".join(billing_lines(bill))
    assert "over the 2 traces whose history exceeded B" in text and "anthropic: claude-sonnet-4-5" in text
    assert "| full | 1.000× (90 %) | 1.000× (80 %) |" in text
    assert "| prune | 1.391× (31 %) | – |" in text
    assert billing_lines({"methods": {}}) == []
    # without Full replayed: each method's US$, and how to get the ratio
    alone = {"traces_T": 1, "models": {"anthropic": "claude-sonnet-4-5"},
             "methods": {"prune": {"anthropic": {"vs_full": None, "usd": 0.01234, "cache_hit_share": 0.0}}}}
    text = "\n".join(billing_lines(alone))
    assert "| prune | $0.0123 (0 %) |" in text and "add full to the methods" in text


def test_replay_says_when_the_budget_rarely_bound():
    from contextrender.experiments.evaluation.replay import _binding_lines, replay_traces

    res = replay_traces(FIXTURES, 10**6, ["contextrender"], embedder=HashingEmbedder(dim=64),
                        compactor=ExtractiveCompactor(), ceiling=False)
    said = "\n".join(_binding_lines(res))
    assert f"bound in only 0 of the {res.traces} traces" in said and "smaller --budget" in said
    tight = replay_traces(FIXTURES, 150, ["contextrender"], embedder=HashingEmbedder(dim=64),
                          compactor=ExtractiveCompactor(), ceiling=False)
    assert sum(tight.exceeded_per_trace) * 2 > tight.traces and _binding_lines(tight) == []


class HandlePolicy(ScriptedPolicy):
    """As ScriptedPolicy, with the ``expand`` option: an omitted result in ``handled`` carries its handle where the
    tool is offered; the others keep the bare marker."""

    expand = True

    def __init__(self, schedule, handled):
        super().__init__(schedule)
        self.handled = set(handled)

    def render(self, session, budget):
        from contextrender import expand

        scope = Scope.of(session)
        show = set(self.schedule.get(session.next_invocation, ()))
        results = scope.history_results(session)
        bodies = {s: (expand.marker(session, s) if expand.offered(session) and s in self.handled
                      else marker_text(session, s)) for s in results if s not in show}
        msgs = tuple(assemble(session, scope, scope.history, bodies).messages)
        visible = frozenset(s for s in results if s in show)
        return Rendered(msgs, history_tokens(session, Rendered(msgs, 0, frozenset())), visible)


def _needs_episode() -> Episode:
    """KEY_ALPHA first appears in result seq 2, KEY_BETA in result seq 4; calls at turns 2 and 3 need them."""
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call("c0", "f", {})]},
            {"role": "tool", "tool_call_id": "c0", "content": "the order is KEY_ALPHA"},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "f", {})]},
            {"role": "tool", "tool_call_id": "c1", "content": "the user is KEY_BETA"},
            {"role": "assistant", "content": None, "tool_calls": [call("c2", "g", {"id": "KEY_ALPHA"})]},
            {"role": "tool", "tool_call_id": "c2", "content": "done"},
            {"role": "assistant", "content": None, "tool_calls": [call("c3", "g", {"id": "KEY_BETA"})]},
            {"role": "tool", "tool_call_id": "c3", "content": "done"}]
    return Episode("needs", tuple(msgs), 1)


def test_replay_with_expand_counts_the_hidden_values_one_expansion_away(tmp_path):
    """Offered the tool, a method's hidden needed value is one expansion away only where its render marks the
    result holding it with a handle; the paper-style bare marker leaves it lost. Without ``expand`` nothing is
    offered, so nothing is one expansion away, and the requests are billed without the tool."""
    from contextrender.experiments.evaluation.replay import expansion_lines

    policy = HandlePolicy({}, handled={2})  # shows nothing; only seq 2's marker can carry a handle
    on = replay([_needs_episode()], {"handles": policy}, 10**6, tmp_path / "on.sqlite", progress=False, expand=True)
    off = replay([_needs_episode()], {"handles": policy}, 10**6, tmp_path / "off.sqlite", progress=False)
    m_on, m_off = on.methods["handles"].measures, off.methods["handles"].measures
    assert m_on.readiness.needing == 2 and m_on.readiness.ready == 0
    assert (m_on.hidden_values, m_on.expandable_values, m_on.expandable_calls) == (2, 1, 1)
    assert (m_off.hidden_values, m_off.expandable_values, m_off.expandable_calls) == (2, 0, 0)
    assert on.expand == ("handles",) and off.expand == ()
    summary = on.methods["handles"].summary()["measures"]
    assert summary["one_expansion_away"] == 1 and summary["one_expansion_away_pct"] == 50.0
    assert "| handles | 2 | 1 | 50.0 | 1 | 1 |" in "\n".join(expansion_lines(on)) and expansion_lines(off) == []
    # every offered request carries the tool's schema, and the turn waiting on an expansion is billed as the
    # request that calls the tool plus its own request with the round (the answer read back) appended
    assert on.methods["handles"].expansions == 1 and off.methods["handles"].expansions == 0
    billed_on = on.methods["handles"].billed_per_trace["none"][0]
    billed_off = off.methods["handles"].billed_per_trace["none"][0]
    assert billed_on.prompt > billed_off.prompt + 2 * 100
    assert billed_on.output > billed_off.output  # the expand call's tokens
    # pooled counts survive a record's round trip
    from contextrender.experiments.evaluation.measures import MeasureStats

    back = MeasureStats.from_dict(m_on.to_dict())
    assert (back + back).expandable_values == 2 and back.hidden_values == 2


def test_a_method_without_handles_is_not_offered_the_tool(tmp_path):
    policy = ScriptedPolicy({})  # no expand option
    res = replay([_needs_episode()], {"plain": policy}, 10**6, tmp_path / "g.sqlite", progress=False, expand=True)
    assert res.expand == () and res.methods["plain"].measures.expandable_values == 0
    assert res.methods["plain"].measures.hidden_values == 2


def test_a_trace_lines_tool_definitions_are_read_back_and_bad_ones_named(tmp_path):
    from contextrender.trace_line import trace_line_text

    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "lookup", "description": "find a row",
                                               "parameters": {"type": "object", "properties": {}}}}]
    path = tmp_path / "t.jsonl"
    path.write_text(trace_line_text("a", msgs, tools=tools) + "\n" + trace_line_text("b", msgs) + "\n")
    got = list(read_traces(path))
    assert [list(e.tools) for e in got] == [tools, []]
    assert "tools" not in json.loads(trace_line_text("c", msgs, tools=[]))  # no key for none
    path.write_text(json.dumps({"task_id": "a", "messages": msgs, "tools": {"name": "lookup"}}) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:1: 'tools' must be a list of tool definitions"):
        list(read_traces(path))


def test_replay_bills_each_request_with_the_tool_definitions_its_trace_carries(tmp_path):
    """The definitions are part of every prompt, read from the cache after the first request: a trace that carries
    them is billed with them (each request's prompt grows by their tokens, and its cached prefix with it), and the
    report says when the traces replayed lack them."""
    from contextrender.experiments.evaluation.replay import billing_lines, replay_traces
    from contextrender.tokens import TokenCounter
    from contextrender.trace_line import trace_line_text

    tools = [{"type": "function", "function": {"name": f"tool_{k}", "description": "look a record up " * 100,
                                               "parameters": {"type": "object", "properties": {
                                                   "id": {"type": "string"}}}}} for k in range(4)]
    lines = [json.loads(x) for x in FIXTURES[0].read_text().splitlines() if x.strip()][:3]
    bare, tooled = tmp_path / "bare.jsonl", tmp_path / "tooled.jsonl"
    bare.write_text("".join(trace_line_text(d["task_id"], d["messages"]) + "\n" for d in lines))
    tooled.write_text("".join(trace_line_text(d["task_id"], d["messages"], tools=tools) + "\n" for d in lines))
    kw = dict(embedder=HashingEmbedder(dim=64), compactor=ExtractiveCompactor(), ceiling=False)
    without, with_ = replay_traces(bare, 150, ["full", "prune"], **kw), replay_traces(tooled, 150, ["full", "prune"], **kw)
    T = without.billing()["traces_T"]
    assert T == without.traces >= 2  # every trace exceeds B: the bill covers every request
    assert with_.billing()["traces_T_with_tools"] == T and without.billing()["traces_T_with_tools"] == 0
    per_tool = TokenCounter().text(json.dumps(tools))
    for name in ("full", "prune"):
        a = without.billing()["methods"][name]["anthropic"]["usage"]
        b = with_.billing()["methods"][name]["anthropic"]["usage"]
        assert b["prompt"] - a["prompt"] == per_tool * without.methods[name].renders  # one request per render
        assert b["cache_read"] > a["cache_read"]  # the definitions are read from the cache after the first request
    assert "billed without them" in "\n".join(billing_lines(without.billing()))
    assert "billed without them" not in "\n".join(billing_lines(with_.billing()))
