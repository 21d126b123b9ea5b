"""8-objective QA end to end: smolagents agent ↔ episode (policy render → model), oracle, runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contextrender import ContextGraph, ExtractiveCompactor, HashingEmbedder, Usage
from contextrender.events import Completion
from contextrender.experiments.benchmarks.base import Benchmark
from contextrender.experiments.benchmarks.qa import MultiObjectiveQA, OfflineMultiObjectiveQA, task_prompt
from contextrender.experiments.benchmarks.qa.agent import CODE_TOOL, call_to_code, parse_action, to_agent_chat
from contextrender.experiments.benchmarks.qa.offline import generate
from contextrender.experiments.benchmarks.qa.retriever import RetrieverServer
from contextrender.experiments.runtime.episode import Episode, Limits, StepLimit
from contextrender.experiments.runtime.oracle import OracleModel
from contextrender.registry import CONF_DIR, build_policy, method_config

METHODS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
BUDGETED_LIMIT = 2000


def _policy(name: str) -> Any:
    return build_policy(method_config(name), embedder=HashingEmbedder(), compactor=ExtractiveCompactor())


@pytest.fixture(scope="module")
def bench():
    b = OfflineMultiObjectiveQA(n_tasks=3, seed=0)
    yield b
    b.close()


@pytest.fixture
def graph():
    g = ContextGraph(":memory:")
    yield g
    g.close()


def _episode(graph, task, policy, model, budget, limits: Limits | None = None) -> Episode:
    session = graph.session(f"{task.id}-{id(policy)}-{budget}")
    bound = model.episode(task, session) if hasattr(model, "episode") else model
    return Episode(session, policy, bound, budget, limits or Limits())


# -- adapter units ------------------------------------------------------------------------


def test_structured_calls_become_code() -> None:
    assert call_to_code("wikipedia_search", '{"query": "Mount X height", "n_results": 3}') == \
        "print(wikipedia_search(query='Mount X height', n_results=3))"
    assert call_to_code("final_answer", {"answers": ["a", "b's", None]}) == 'final_answer("a; b\'s; ")'
    assert call_to_code("final_answer", '{"answer": "x; y"}') == "final_answer('x; y')"
    assert call_to_code(CODE_TOOL, '{"code": "print(1)"}') == "print(1)"


def test_parse_action_applies_stops_and_splits_thought() -> None:
    text = "Thought: look it up.\n<code>\nr = wikipedia_search('q')\nprint(r)\n</code>\nObservation: made up"
    assert parse_action({"content": text}) == ("Thought: look it up.", "r = wikipedia_search('q')\nprint(r)")
    # A provider stop at "</code>" leaves the block open: it is closed, as smolagents does.
    assert parse_action({"content": "Thought: x\n<code>\nprint(2)\n"}) == ("Thought: x", "print(2)")
    assert parse_action({"content": "Thought: x\n```py\nprint(3)\n```"}) == ("Thought: x", "print(3)")
    thought, code = parse_action({"content": "I think the answer is probably Paris, but who knows"})
    assert code is None and thought.startswith("I think")


def test_rendered_history_becomes_code_agent_chat() -> None:
    args = json.dumps({"code": "print(wikipedia_search(query='q'))"})
    rendered = [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
        {"role": "assistant", "content": "Thought: search.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": CODE_TOOL, "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "[result omitted]"},
        {"role": "user", "content": "Error: no code"},
    ]
    chat = to_agent_chat(rendered)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[2]["content"] == "Thought: search.\n<code>\nprint(wikipedia_search(query='q'))\n</code>"
    assert chat[3]["content"] == "Observation:\n[result omitted]\n\nError: no code"


# -- offline set ----------------------------------------------------------------------------


def test_offline_set_is_deterministic_unique_and_sized() -> None:
    from smolagents import CodeAgent

    from contextrender.tokens import TokenCounter

    a, b = generate(3, seed=5), generate(3, seed=5)
    assert a.documents == b.documents and [t.task for t in a.tasks] == [t.task for t in b.tasks]
    assert generate(3, seed=6).documents != a.documents
    counter = TokenCounter()
    sizes = [counter.text(d["contents"]) for d in a.documents]
    assert 140 <= min(sizes) and max(sizes) <= 290
    assert len(a.documents) == 3 * 8 * 3  # target + 2 distractors per question
    system = CodeAgent(tools=[], model=None).system_prompt  # type: ignore[arg-type]
    for t in a.tasks:
        assert t.task.n == 8 and len({e.root for e in t.targets}) == 8
        prompt = task_prompt(t.task)
        for answers, target in zip(t.task.answers, t.targets, strict=True):
            first = answers[0]
            assert len(first) >= 4  # the oracle's visibility rule checks values of ≥ 4 chars
            holders = [d["id"] for d in a.documents if first in d["contents"]]
            assert holders == [target.doc_id]  # only the target document states the answer
            assert first not in prompt and first not in system
        ref = t.task.reference
        assert ref is not None and [c.name for c in ref.turns[0]][-1] == "final_answer"


# -- full episodes with the oracle -------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_oracle_episode_under_each_policy(bench, graph, method) -> None:
    """Every policy in conf/method/ runs the agent; a position is right iff its evidence was visible."""
    oracle = OracleModel()
    for task in bench.tasks()[:2]:
        policy = _policy(method)
        ep = _episode(graph, task, policy, oracle, BUDGETED_LIMIT)
        out = bench.run_episode(task, ep)
        assert out.status == "ok"
        assert ep.exceeded_budget  # 8 observations are well above B = 2000
        assert ep.invocations == 9  # 8 searches + final_answer
        if policy.budgeted:
            assert max(r.tokens for r in ep.renders) <= BUDGETED_LIMIT
        hidden = {v for _, name, values in out.extra.get("oracle_hidden", []) for v in values}
        for pred, answers, f1 in zip(out.extra["predictions"], task.answers, out.extra["f1_per_question"], strict=True):
            if answers[0] in hidden:
                assert pred == "UNKNOWN_VALUE" and f1 == 0.0
            else:
                assert pred == answers[0] and f1 == 1.0
        assert out.score["f1"] == pytest.approx(1 - len(hidden) / 8)
        # The graph holds the code steps as tool calls and observations as their results.
        msgs = ep.session.openai_messages()
        assert [m["role"] for m in msgs[:2]] == ["system", "user"]
        assert sum(1 for m in msgs if m["role"] == "tool") == 9
        assert all(tc["function"]["name"] == CODE_TOOL for m in msgs for tc in m.get("tool_calls") or [])
        assert "[29 steps remaining]" in msgs[3]["content"]


def test_full_history_oracle_scores_one(bench, graph) -> None:
    full = "full" if "full" in METHODS else None
    oracle = OracleModel()
    for task in bench.tasks():
        if full:
            out = bench.run_episode(task, _episode(graph, task, _policy(full), oracle, BUDGETED_LIMIT))
            assert out.score == {"f1": 1.0, "em": 1.0}
        # ContextRender renders the full history whenever it fits (docs/method.md §5 step 2).
        out = bench.run_episode(task, _episode(graph, task, _policy("contextrender"), oracle, 100_000))
        assert out.score == {"f1": 1.0, "em": 1.0}
        assert "oracle_hidden" not in out.extra


def test_budget_hides_evidence(bench, graph) -> None:
    task = bench.tasks()[0]
    ep = _episode(graph, task, _policy("contextrender"), OracleModel(), BUDGETED_LIMIT)
    out = bench.run_episode(task, ep)
    assert out.score["f1"] < 1.0 and out.extra["oracle_hidden"]
    assert out.extra["predictions"].count("UNKNOWN_VALUE") == len(out.extra["oracle_hidden"][0][2])


def test_tfa_sees_answers_flow_into_final_answer(bench, graph) -> None:
    """Identifier-like answers (codes) copied into final_answer(...) credit their search results."""
    from contextrender import extract_values

    credited = 0
    for task in bench.tasks():
        ep = _episode(graph, task, _policy("contextrender"), OracleModel(), 100_000)
        bench.run_episode(task, ep)
        msgs = ep.session.messages
        final_seq = max(i for i, m in enumerate(msgs) if m.role == "assistant")
        edges = ep.session.reuse_edges()
        assert {e.op_seq for e in edges} <= {final_seq}
        expected = {v for answers in task.answers for v in extract_values(answers[0])}
        assert {e.value for e in edges} == expected
        for e in edges:  # each credits the observation of the search that found it
            assert msgs[e.source].role == "tool" and e.value in msgs[e.source].content
        credited += len(edges)
    assert credited > 0


# -- a scripted text model: the real-LLM path ---------------------------------------------------


class ScriptedLLM:
    """Replies like a code agent LLM (text with <code> blocks); records what it was sent."""

    name = "scripted"

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    def episode(self, task: Any, session: Any) -> ScriptedLLM:
        return self

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        self.seen.append(messages)
        text = self.replies.pop(0) if self.replies else "Thought: still thinking."
        return Completion({"role": "assistant", "content": text}, Usage(input=100, output=20, calls=1))


def test_text_model_protocol_errors_and_answer(bench, graph) -> None:
    task = bench.tasks()[0]
    off = generate(3, seed=0).tasks[0]
    answers = [a[0] for a in task.answers]
    replies = [
        f"Thought: first question.\n<code>\nprint(wikipedia_search('{off.queries[0]}'))\n</code>",
        "Thought: I will answer from memory.",  # no code → parse error, user message
        "Thought: oops.\n<code>\nprint(undefined_name)\n</code>",  # execution error → tool result
        "Thought: done.\n<code>\nfinal_answer(" + repr("; ".join(answers[:7])) + ")\n</code>\nObservation: fake",
    ]
    llm = ScriptedLLM(replies)
    ep = _episode(graph, task, _policy("contextrender"), llm, 6000)
    out = bench.run_episode(task, ep)
    assert out.score["f1"] == pytest.approx(7 / 8)
    assert out.extra["parse_errors"] == 1 and out.extra["agent_steps"] == 4
    assert not out.extra["agent_max_steps_reached"]
    assert ep.model is llm  # the adapter is removed after the episode
    # What the model saw: code-agent chat, observations as user messages with the steps left.
    second = llm.seen[1]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"].endswith("</code>") and "wikipedia_search" in second[2]["content"]
    assert second[3]["content"].startswith("Observation:\nExecution logs:\n[1] ")
    assert second[3]["content"].rstrip().endswith("[29 steps remaining]")
    assert "Error" in llm.seen[2][-1]["content"] and "[28 steps remaining]" in llm.seen[2][-1]["content"]
    assert "undefined_name" in llm.seen[3][-1]["content"]
    roles = [m["role"] for m in ep.session.openai_messages()]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool",
                     "assistant", "tool"]


def test_out_of_steps_fallback_goes_through_the_episode(graph) -> None:
    bench = OfflineMultiObjectiveQA(n_tasks=1, seed=0, max_steps=3)
    try:
        task = bench.tasks()[0]
        llm = ScriptedLLM(["Thought: hmm.\n<code>\nx = 1\n</code>"] * 3 + ["Velmora; Kessar"])
        ep = _episode(graph, task, _policy("prune"), llm, 6000)
        out = bench.run_episode(task, ep)
        assert out.extra["agent_max_steps_reached"] and out.extra["answer"] == "Velmora; Kessar"
        assert ep.invocations == 4
        last_user = [m for m in ep.session.openai_messages() if m["role"] == "user"][-1]
        assert "Based on the above" in last_user["content"]
        assert "[0 steps remaining]" in ep.session.openai_messages()[-3]["content"]
    finally:
        bench.close()


def test_harness_limits_propagate(bench, graph) -> None:
    task = bench.tasks()[0]
    llm = ScriptedLLM(["Thought: hmm.\n<code>\nx = 1\n</code>"] * 10)
    ep = _episode(graph, task, _policy("prune"), llm, 6000, Limits(max_steps=2))
    with pytest.raises(StepLimit):
        bench.run_episode(task, ep)
    assert ep.model is llm


# -- moqa8 from a task file and an external retriever URL; the runner ----------------------


def test_moqa8_reads_files_and_talks_to_a_url(tmp_path, graph) -> None:
    data = generate(2, seed=1)
    corpus, tasks_file = data.write(tmp_path)
    with RetrieverServer(corpus) as srv:
        bench = MultiObjectiveQA(str(tasks_file), srv.url)
        assert isinstance(bench, Benchmark)
        assert (bench.name, bench.primary_metric, bench.synthetic) == ("moqa8", "f1", False)
        tasks = bench.tasks()
        assert [t.id for t in tasks] == [t.task.id for t in data.tasks]
        out = bench.run_episode(tasks[1], _episode(graph, tasks[1], _policy("contextrender"), OracleModel(), 50_000))
        assert out.score == {"f1": 1.0, "em": 1.0}
        bench.close()


def test_hydra_config_and_runner(tmp_path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from contextrender.experiments.runtime.runner import run_job

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[
            "benchmark=moqa8_offline", "benchmark.n_tasks=2", "model=oracle", "method=contextrender",
            "embedding=hashing", "compactor=extractive", "budget=2000", f"run_dir={tmp_path}", "progress=false"])
        real = compose("config", overrides=["benchmark=moqa8", "benchmark.tasks_path=/x.jsonl"])
    b = instantiate(real.benchmark)
    assert isinstance(b, MultiObjectiveQA) and b.name == "moqa8" and not b.synthetic and b.max_steps == 30
    summary = run_job(cfg)
    assert summary.ran == 2 and summary.mean_score is not None and 0 < summary.mean_score < 1
    records = [json.loads(line) for line in Path(summary.records).read_text().splitlines()]
    assert all(r["synthetic"] and r["benchmark"] == "moqa8_offline" and r["status"] == "ok" for r in records)
    assert all(r["extra"]["synthetic"] for r in records)
