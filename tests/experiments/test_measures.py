"""The failure-mode measures (experiments/evaluation/measures.py) on hand-made transcripts,
in replay (every method, every trace set we have: pairing never breaks) and in runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from contextrender import ContextGraph, ExtractiveCompactor, HashingEmbedder
from contextrender.experiments.evaluation.measures import (
    MeasureStats,
    MeasureTracker,
    PairingError,
    call_key,
    pairing_errors,
)
from contextrender.experiments.evaluation.recall import recall, reuse_events
from contextrender.experiments.evaluation.replay import replay_traces
from contextrender.experiments.evaluation.traces import read_traces
from contextrender.experiments.records.schema import load_records
from contextrender.experiments.runtime.episode import Episode
from contextrender.registry import CONF_DIR, method_names
from contextrender.render import Rendered, Scope, assemble
from contextrender.tokens import TokenCounter

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
#: every trace set the repository holds, one per format (and a second τ² domain)
TRACE_SETS = [DATA / "react_traces.jsonl", DATA / "parallel_agent_traces.jsonl", DATA / "tau2" / "scripted_retail.json",
              DATA / "tau2" / "scripted_telecom.json", next((DATA / "taubench").glob("*.json")),
              DATA / "bfcl" / "scripted-model-FC" / "multi_turn" / "BFCL_v4_multi_turn_base_result.json"]
COUNTER = TokenCounter()


def call(cid: str, name: str, args: dict | str) -> dict:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def asst(*calls: dict, content: str | None = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)} if calls \
        else {"role": "assistant", "content": content}


def tool(cid: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": cid, "content": content}


def session_of(msgs: list[dict]):
    s = ContextGraph().session("s")
    s.sync(msgs)
    return s


def render(session, *, drop: set[int] = frozenset(), bodies: dict[int, str] | None = None,
           inserts: dict[int, list[dict]] | None = None) -> Rendered:
    """A hand-made render of ``session``: history minus ``drop``, ``bodies`` replacing results, ``inserts``."""
    scope = Scope.of(session)
    shown = [s for s in scope.history if s not in drop]
    bodies = bodies or {}
    msgs, sources = assemble(session, scope, shown, bodies, inserts)
    visible = frozenset(s for s in shown if session.is_result(s) and s not in bodies)
    return Rendered(tuple(msgs), 0, visible, sources=tuple(sources))


# -- identifier survival ------------------------------------------------------------------------

def _order_transcript() -> list[dict]:
    return [{"role": "system", "content": "You are a careful agent."},
            {"role": "user", "content": "Find my latest order and cancel it. My account is ACC_77777."},
            asst(call("c1", "find_orders", {"account": "ACC_77777"})),
            tool("c1", "Pending orders of ACC_77777: ORD_12345 (placed 3 days ago)."),
            asst(content="Found one pending order.")]


def test_a_value_kept_only_by_a_summary_survives_but_is_not_recalled():
    msgs = _order_transcript()
    turn = asst(call("c2", "cancel_order", {"order_id": "ORD_12345", "account": "ACC_77777"}))
    s = session_of(msgs)
    # the result is summarised: its complete text is gone, the identifier is in the summary
    summary = {"role": "user", "content": "[summary] The account has one pending order, ORD_12345."}
    rendered = render(s, bodies={3: "[result summarised]"}, inserts={4: [summary]})
    assert rendered.visible == frozenset()
    t = MeasureTracker(COUNTER)
    t.on_render(s, rendered)
    m = t.on_turn(turn)
    # ORD_12345 (first seen in the result) is one use and it survived; ACC_77777 came from the task: no use
    assert (m.id_uses, m.id_survived) == (1, 1)
    assert t.stats.summary()["identifier_survival"] == 100.0
    assert t.stats.id_uses_by_age == {"le3": 1, "4_10": 0, "11_25": 0, "gt25": 0}
    # recall on the same render: the (turn 2, result 3) event exists and is a miss
    events = reuse_events(msgs + [turn])
    assert [(e.j, e.result_seq) for e in events] == [(2, 3)]
    assert recall(events, {2: rendered.visible}).pct == 0.0


def test_a_value_absent_from_the_render_does_not_survive_and_ages_are_binned():
    msgs = _order_transcript()
    for i in range(5):  # five more invocations push the lookup to age 6
        msgs += [asst(call(f"d{i}", "ping", {"n": i})), tool(f"d{i}", "pong")]
    turn = asst(call("c2", "cancel_order", {"order_id": "ORD_12345"}), content="Cancelling ORD_12345 now.")
    s = session_of(msgs)
    t = MeasureTracker(COUNTER)
    t.on_render(s, render(s, bodies={3: "[Old tool result content cleared]"}))
    m = t.on_turn(turn)
    assert (m.id_uses, m.id_survived) == (1, 0)  # once per (turn, value), though content and call both use it
    assert t.stats.id_uses_by_age["4_10"] == 1 and t.stats.summary()["identifier_survival"] == 0.0
    # the same turn after a render that shows the result: survives
    t2 = MeasureTracker(COUNTER)
    t2.on_render(s, render(s))
    assert t2.on_turn(turn).id_survived == 1


def test_identifier_matching_is_whole_token_under_tfa_rules():
    msgs = _order_transcript()
    s = session_of(msgs)
    t = MeasureTracker(COUNTER)
    # ORD_123456 contains ORD_12345 but is another token: no survival
    t.on_render(s, render(s, bodies={3: "order ORD_123456 and ord_12345"}))
    assert t.on_turn(asst(call("c2", "cancel_order", {"order_id": "ORD_12345"}))).id_survived == 0


# -- redundant re-reads ---------------------------------------------------------------------------

def _reread_transcript() -> list[dict]:
    return [{"role": "user", "content": "Summarise the config."},
            asst(call("r1", "read_file", {"path": "conf/app.yaml", "lines": [1, 40]})),
            tool("r1", "port: 8080\nhost: example"),
            asst(call("r2", "list_dir", {"path": "conf"})),
            tool("r2", "app.yaml\ndb.yaml")]


#: the same call, keys reordered and spaced differently: one normalised key
REREAD = asst(call("r3", "read_file", '{"lines": [1,40],   "path": "conf/app.yaml"}'))


def test_call_key_normalises_json_arguments():
    assert call_key("f", '{"b": 1, "a": [1, 2]}') == call_key("f", '{"a":[1,2],"b":1}') == ("f", '{"a":[1,2],"b":1}')
    assert call_key("f", "  not json ") == ("f", "not json")


def test_a_reread_after_hiding_counts_and_one_after_a_visible_result_does_not():
    s = session_of(_reread_transcript())
    hidden = MeasureTracker(COUNTER)
    hidden.on_render(s, render(s, bodies={2: "[result omitted]"}))
    m = hidden.on_turn(REREAD)
    assert (m.calls, m.repeats, m.rereads) == (1, 1, 1)
    visible = MeasureTracker(COUNTER)
    visible.on_render(s, render(s))
    m = visible.on_turn(REREAD)
    assert (m.calls, m.repeats, m.rereads) == (1, 1, 0)
    # a summary of the result is not the result in full: still a re-read after hiding
    summarised = MeasureTracker(COUNTER)
    summarised.on_render(s, render(s, bodies={2: "[summary] port 8080, host example"}))
    assert summarised.on_turn(REREAD).rereads == 1
    # another call (other arguments) is no repeat at all
    other = MeasureTracker(COUNTER)
    other.on_render(s, render(s, bodies={2: "[result omitted]"}))
    assert other.on_turn(asst(call("r3", "read_file", {"path": "conf/db.yaml", "lines": [1, 40]}))).repeats == 0
    summary = hidden.stats.summary()
    assert summary["rereads"] == 1 and summary["rereads_per_episode"] == 1.0 and summary["rereads_per_100_calls"] == 100.0


def test_rereads_pool_per_episode_and_per_100_calls():
    a, b = MeasureStats(episodes=1, tool_calls=10, rereads=1, repeat_calls=2), MeasureStats(episodes=1, tool_calls=30)
    s = (a + b).summary()
    assert (s["rereads"], s["rereads_per_episode"], s["rereads_per_100_calls"], s["repeat_calls"]) == (1, 0.5, 2.5, 2)
    assert MeasureStats.from_dict((a + b).to_dict()) == a + b


# -- prompt-cache prefix retention ----------------------------------------------------------------

def test_prefix_retention_is_one_for_identical_renders_and_drops_when_an_earlier_body_changes():
    msgs = _reread_transcript()
    s = session_of(msgs)
    t = MeasureTracker(COUNTER)
    first = render(s)
    assert t.on_render(s, first).prefix_tokens is None  # no previous render
    t.on_turn(asst(content="thinking"))
    same = t.on_render(s, render(s))
    assert same.prefix_tokens == same.input_tokens > 0
    t.on_turn(asst(content="thinking"))
    changed = render(s, bodies={2: "[Old tool result content cleared]"})  # message 2 of 5 changes
    m = t.on_render(s, changed)
    lead = sum(COUNTER.message(x) for x in changed.messages[:2])
    assert m.prefix_tokens == lead and m.input_tokens == sum(COUNTER.message(x) for x in changed.messages)
    t.on_turn(asst(content="done"))
    summary = t.stats.summary()
    assert summary["prefix_invocations"] == 2
    assert summary["prefix_retention"] == pytest.approx(100.0 * (1.0 + lead / m.input_tokens) / 2)
    assert summary["prefix_retention_tokens"] == pytest.approx(100.0 * (same.input_tokens + lead)
                                                               / (same.input_tokens + m.input_tokens))


def test_appending_keeps_the_old_prefix():
    msgs = _reread_transcript()
    s = session_of(msgs[:3])
    t = MeasureTracker(COUNTER)
    before = render(s)
    t.on_render(s, before)
    t.on_turn(msgs[3])
    s.sync(msgs)
    m = t.on_render(s, render(s))
    assert m.prefix_tokens == sum(COUNTER.message(x) for x in before.messages) < m.input_tokens


# -- pairing validity ---------------------------------------------------------------------------

def test_pairing_violations_raise():
    s = session_of(_reread_transcript())
    # a rendered call without its result
    with pytest.raises(PairingError, match="r1 have no tool message"):
        MeasureTracker(COUNTER).on_render(s, render(s, drop={2}))
    # a result without its call
    with pytest.raises(PairingError, match="'r1' does not follow"):
        MeasureTracker(COUNTER).on_render(s, render(s, drop={1}))
    # an inserted summary between a call and its result
    note = {"role": "user", "content": "[summary]"}
    with pytest.raises(PairingError):
        MeasureTracker(COUNTER).on_render(s, render(s, inserts={2: [note]}))
    # a valid render, and one that drops a whole unit, are fine
    MeasureTracker(COUNTER).on_render(s, render(s))
    MeasureTracker(COUNTER).on_render(s, render(s, drop={1, 2}))


def test_what_the_transcript_itself_leaves_unpaired_is_exempt():
    msgs = [{"role": "user", "content": "go"}, asst(call("a1", "run", {})), tool("a1", "ok"),
            tool("orphan", "an output without a call (AppWorld text mode)"), asst(call("a2", "run", {"x": 1}))]
    s = session_of(msgs)
    MeasureTracker(COUNTER).on_render(s, render(s))  # the orphan and the unanswered call a2 are not the render's doing
    assert pairing_errors([asst(call("a1", "f", {})), {"role": "user", "content": "x"}, tool("a1", "late")])
    assert not pairing_errors([asst(call("a1", "f", {})), tool("a1", "ok")])


def test_an_episode_refuses_a_render_that_breaks_pairing_before_calling_the_model():
    class DropResults:
        name, budgeted = "drop_results", True

        def render(self, session, budget):
            return render(session, drop={s for s in Scope.of(session).history if session.is_result(s)})

    class Model:
        calls = 0

        def complete(self, messages, tools=None):
            Model.calls += 1
            raise AssertionError("never reached")

    s = session_of(_reread_transcript())
    ep = Episode(s, DropResults(), Model(), 2000)
    with pytest.raises(PairingError, match="drop_results at invocation 2"):
        ep.step()
    assert Model.calls == 0


def test_a_pairing_error_stops_the_job_instead_of_a_retryable_record(tmp_path, monkeypatch):
    from contextrender.experiments.runtime import runner

    class DropResults:
        name, budgeted = "prune", True

        def render(self, session, budget):
            return render(session, drop={s for s in Scope.of(session).history if session.is_result(s)})

    monkeypatch.setattr(runner, "build_policy", lambda *a, **k: DropResults())
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"run_dir={tmp_path}", "embedding=hashing", "progress=false",
                                           "model=oracle", "method=prune", "budget=1500", "benchmark.limit=1"])
    with pytest.raises(PairingError):
        runner.run_job(cfg)
    assert load_records(tmp_path) == []


# -- replay and runs --------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("path", TRACE_SETS, ids=lambda p: p.name)
def test_every_method_keeps_pairing_on_every_trace_set_and_reports_its_measures(path):
    """Every registry method (the peers included) on every trace set we have, at a tight and a loose B:
    replay asserts pairing for every render (a PairingError would fail this test)."""
    methods = method_names()
    turns = sum(len(e.assistant_indices) for e in read_traces(path))
    for budget in (300, 1500):
        res = replay_traces(path, budget, methods, embedder=HashingEmbedder(dim=64), compactor=ExtractiveCompactor())
        out = res.to_json()
        assert list(out["methods"]) == methods
        for name, s in out["methods"].items():
            m = s["measures"]
            assert m["pairing_checked_renders"] == s["renders"] == turns, name
            assert m["episodes"] == res.traces
            assert set(m) >= {"identifier_survival", "identifier_survival_by_age", "rereads", "rereads_per_episode",
                              "rereads_per_100_calls", "prefix_retention", "prefix_retention_tokens"}
            assert list(m["identifier_survival_by_age"]) == ["le3", "4_10", "11_25", "gt25"]
        full = out["methods"]["full"]["measures"]
        # Full shows everything: every identifier survives and no re-read follows a hidden result
        assert full["identifier_survival"] in (None, 100.0) and full["rereads"] == 0
        uses = {s["measures"]["identifier_uses"] for s in out["methods"].values()}
        assert len(uses) == 1  # the recorded uses are the same for every method


def test_replay_measures_match_a_tracker_over_the_same_renders(tmp_path):
    path = DATA / "react_traces.jsonl"
    seen: list[tuple[str, int, int, Rendered]] = []
    from contextrender.experiments.evaluation.replay import build_policies, replay

    policies, shared = build_policies(["prune", "openhands_masking"], embedder=HashingEmbedder(dim=64),
                                      compactor=ExtractiveCompactor())
    eps = list(read_traces(path))
    res = replay(eps, policies, 400, tmp_path / "g.sqlite", shared=shared, progress=False,
                 on_render=lambda name, ep, j, session, rendered: seen.append((name, ep.line, j, rendered)))
    for name in policies:
        pooled = MeasureStats()
        for ep in eps:
            t = MeasureTracker(TokenCounter())
            msgs = list(ep.messages)
            for (n, line, j, rendered) in seen:
                if n == name and line == ep.line:
                    idx = ep.assistant_indices[j]
                    t.on_render(msgs[:idx], rendered)
                    t.on_turn(msgs[idx])
            pooled = pooled + t.stats
        assert res.methods[name].measures.summary() == pooled.summary()


@pytest.mark.slow
def test_runs_record_the_measures_for_every_peers_method(tmp_path):
    """Every method of the peers group, oracle on one BFCL and one τ²-retail task: pairing is asserted for
    every render of the runs, and each record carries its measures (schema 4)."""
    from contextrender.experiments import catalogue
    from contextrender.experiments.runtime.runner import run_job

    methods = catalogue.group("peers")
    assert {"full", "prune", "contextrender", "contextrender_plus"} <= set(methods) and len(methods) == 14
    for bench in ("bfcl_multi_turn", "tau2_retail"):
        for method in methods:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=[f"run_dir={tmp_path}", "embedding=hashing", "progress=false",
                                                   "model=oracle", f"method={method}", f"benchmark={bench}",
                                                   "budget=2000", "benchmark.limit=1"])
            run_job(cfg)
    recs = load_records(tmp_path)
    assert len(recs) == 2 * len(methods)
    for r in recs:
        m = MeasureStats.from_dict(r["measures"])
        assert m.episodes == 1 and m.renders == r["invocations"] == len(r["renders"])
        assert m.tool_calls == sum(x["calls"] for x in r["renders"])
        assert m.id_uses == sum(x["id_uses"] for x in r["renders"])
        assert m.prefix_invocations == r["invocations"] - 1
