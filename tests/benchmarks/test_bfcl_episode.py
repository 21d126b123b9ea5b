"""BFCL multi-turn episodes end to end: the benchmark loop, the oracle, policies, the live path."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import pytest

pytest.importorskip("bfcl_eval", reason="install with: pip install --no-deps bfcl-eval==2026.3.23")

import litellm  # noqa: E402
from litellm import CustomLLM  # noqa: E402
from litellm.types.utils import ModelResponse  # noqa: E402

from contextrender import ContextGraph, HashingEmbedder, Rendered, Scope, Session  # noqa: E402
from contextrender.events import Completion, Usage  # noqa: E402
from contextrender.experiments.benchmarks.base import Benchmark  # noqa: E402
from contextrender.experiments.benchmarks.bfcl import (  # noqa: E402
    BFCLChecker,
    BFCLEnvironment,
    BFCLMultiTurn,
    load_tasks,
    parse_call_string,
)
from contextrender.experiments.runtime.episode import Episode, Limits  # noqa: E402
from contextrender.experiments.runtime.models import LiteLLMModel  # noqa: E402
from contextrender.experiments.runtime.oracle import WRONG_STRING, OracleModel, Reference, ScriptedCall  # noqa: E402
from contextrender.registry import CONF_DIR, build_policy, method_config  # noqa: E402
from contextrender.render import assemble, marker_text  # noqa: E402

HUGE = 10**9
LOOSE = Limits(max_steps=200)  # BFCL has no per-episode cap; the oracle needs at most 37 steps
#: The oracle emits one call per invocation; these two tasks have a 34-call turn, more
#: than BFCL's 20 tool-calling steps per turn, so they pass only once ``Reference``
#: supports parallel call groups (``BFCLTask.reference`` then passes ``groups``).
NEEDS_PARALLEL_CALLS = frozenset({"multi_turn_long_context_38", "multi_turn_long_context_46"})
ORACLE_HAS_GROUPS = "groups" in {f.name for f in dataclasses.fields(Reference)}
#: long_context_7: turn 1's find() result is the only place 'goals.txt' appears before
#: turn 2 cats it — a policy that hides tool results must fail exactly turn 2.
HIDDEN_VALUE_TASK = "multi_turn_long_context_7"


def _policies() -> list[str]:
    # ContextRender with a huge B renders the full history unchanged (docs/method.md §5 step 2);
    # the Full-history baseline joins once conf/method/full.yaml exists.
    return ["contextrender"] + (["full"] if (CONF_DIR / "method" / "full.yaml").is_file() else [])


def _policy(name: str) -> Any:
    return build_policy(method_config(name), embedder=HashingEmbedder(dim=256))


def _run(bench: BFCLMultiTurn, task: Any, policy: Any, budget: int, graph: ContextGraph, model: Any = None,
         limits: Limits = LOOSE):
    session = graph.session(f"{task.id}-{policy.name}-{budget}-{len(graph.session_ids())}")
    model = model or OracleModel()
    episode = Episode(session, policy, model.episode(task, session), budget, limits)
    return bench.run_episode(task, episode), episode


@pytest.fixture
def mem_graph():
    g = ContextGraph(":memory:")
    yield g
    g.close()


# -- the benchmark object -------------------------------------------------------------


def test_benchmark_protocol_and_tasks() -> None:
    bench = BFCLMultiTurn(limit=3)
    assert isinstance(bench, Benchmark)
    assert bench.name == "bfcl_multi_turn_long_context" and bench.primary_metric == "task_acc"
    assert bench.synthetic is False
    tasks = bench.tasks()
    assert [t.id for t in tasks] == [f"multi_turn_long_context_{i}" for i in range(3)]
    assert BFCLMultiTurn(category="multi_turn_base", ids=["multi_turn_base_9"]).tasks()[0].id == "multi_turn_base_9"
    assert BFCLMultiTurn(category="multi_turn_base").name == "bfcl_multi_turn_base"
    with pytest.raises(ValueError):
        BFCLMultiTurn(category="multi_turn_miss_func")
    with pytest.raises(ValueError):
        BFCLMultiTurn(bad_arguments="ignore")


def test_hydra_configs_instantiate() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        bench = instantiate(compose("config", overrides=["benchmark=bfcl_multi_turn"]).benchmark)
        assert isinstance(bench, BFCLMultiTurn) and bench.name == "bfcl_multi_turn_long_context"
        assert bench.per_turn_step_limit == 20 and bench.system_prompt is None
        cfg = compose("config", overrides=["benchmark=bfcl_multi_turn_base",
                                           "benchmark.ids=[multi_turn_base_3,multi_turn_base_5]"])
        base = instantiate(cfg.benchmark)
        assert base.name == "bfcl_multi_turn_base"
        assert [t.id for t in base.tasks()] == ["multi_turn_base_3", "multi_turn_base_5"]


def test_reference_is_the_parsed_ground_truth() -> None:
    task = load_tasks("multi_turn_base", limit=1)[0]
    ref = task.reference
    assert isinstance(ref, Reference) and ref is task.reference  # cached
    assert [len(t) for t in ref.turns] == [len(t) for t in task.ground_truth]
    assert ref.turns[0][0] == ScriptedCall("cd", {"folder": "document"})
    # positional arguments get their keyword names
    positional = next(t for t in load_tasks("multi_turn_base") if any("sort('" in c for g in t.ground_truth for c in g))
    calls = [c for turn in positional.reference.turns for c in turn if c.name == "sort"]
    assert calls and all("file_name" in c.arguments for c in calls)


def test_parallel_groups_only_for_turns_over_the_step_limit() -> None:
    task = load_tasks("multi_turn_long_context", ids=["multi_turn_long_context_38"])[0]
    groups = task.parallel_groups()
    assert sum(groups[0]) == len(task.ground_truth[0]) == 34 and len(groups[0]) <= 20
    assert all(g == () for g in groups[1:])
    assert all(g == () for g in load_tasks("multi_turn_base", limit=1)[0].parallel_groups())


# -- the oracle under full history ----------------------------------------------------

FAST_IDS = ["multi_turn_base_0", "multi_turn_base_55", "multi_turn_long_context_0", HIDDEN_VALUE_TASK,
            "multi_turn_long_context_135"]


@pytest.mark.parametrize("method", _policies())
@pytest.mark.parametrize("task_id", FAST_IDS)
def test_oracle_full_history_passes(task_id: str, method: str, mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(category=task_id.rsplit("_", 1)[0], ids=[task_id])
    task = bench.tasks()[0]
    outcome, episode = _run(bench, task, _policy(method), HUGE, mem_graph)
    assert outcome.status == "ok", outcome.extra
    assert outcome.score == {"task_acc": 1.0, "turn_acc": 1.0, "turns_passed": outcome.score["turns"],
                             "turns": float(sum(1 for g in task.ground_truth if g))}
    assert outcome.extra["first_failing_turn"] is None and "oracle_hidden" not in outcome.extra
    # one invocation per reference call plus a closing message per turn; no system prompt
    assert episode.invocations == sum(len(g) for g in task.ground_truth) + len(task.turns)
    assert episode.session.messages[0].role == "user"


def _oracle_failures(category: str, method: str) -> set[str]:
    bench = BFCLMultiTurn(category=category)
    graph = ContextGraph(":memory:")
    failed = set()
    for task in bench.tasks():
        outcome, _ = _run(bench, task, _policy(method), HUGE, graph)
        if outcome.score["task_acc"] != 1.0:
            failed.add(task.id)
    graph.close()
    return failed


@pytest.mark.slow
@pytest.mark.parametrize("method", _policies())
@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_long_context"])
def test_oracle_full_history_passes_every_task(category: str, method: str) -> None:
    expected = set() if ORACLE_HAS_GROUPS or category == "multi_turn_base" else set(NEEDS_PARALLEL_CALLS)
    assert _oracle_failures(category, method) == expected


# -- hiding values ------------------------------------------------------------------------


class OmitResults:
    """Every tool result rendered as its omission marker; messages verbatim (test policy)."""

    name = "omit_results"
    budgeted = False

    def render(self, session: Session, budget: int) -> Rendered:
        scope = Scope.of(session)
        bodies = {s: marker_text(session, s) for s in scope.history_results(session)}
        messages = assemble(session, scope, scope.history, bodies).messages
        tokens = sum(session.counter.message(m) for m in messages) - (
            session.ntok(scope.current) if scope.current is not None else 0)
        return Rendered(tuple(messages), tokens, frozenset())


def test_hidden_value_fails_on_the_right_turn(mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(ids=[HIDDEN_VALUE_TASK])
    task = bench.tasks()[0]
    # the premise: 'goals.txt' first appears in turn 1's result, and turn 2 needs it
    assert "goals.txt" not in json.dumps(task.turns)
    assert parse_call_string(task.ground_truth[2][0]) == ("cat", {"file_name": "goals.txt"})

    outcome, episode = _run(bench, task, OmitResults(), HUGE, mem_graph)
    assert outcome.status == "ok" and outcome.score["task_acc"] == 0.0
    assert outcome.extra["first_failing_turn"] == 2
    per_turn = outcome.extra["per_turn"]
    assert [t["passed"] for t in per_turn] == [True, True, False]
    assert outcome.score["turns_passed"] == 2.0 and outcome.score["turns"] == 3.0
    assert outcome.extra["oracle_hidden"] == [[episode.invocations - 2, "cat", ["goals.txt"]]]
    # cat('UNKNOWN_VALUE') changes no state but misses the file content ground truth returns
    assert per_turn[2]["state_ok"] is True and per_turn[2]["response_ok"] is False
    assert any("ground-truth result not produced" in d for d in per_turn[2]["diffs"])
    cat_call = episode.session.messages[-3].tool_calls[0]
    assert json.loads(cat_call.arguments) == {"file_name": WRONG_STRING}


class CurrentTurnOnly(OmitResults):
    """Only the tool results of the current user turn in full (test policy): earlier turns' values are hidden."""

    name = "current_turn_only"

    def render(self, session: Session, budget: int) -> Rendered:
        scope = Scope.of(session)
        start = scope.current if scope.current is not None else 0
        old = [s for s in scope.history_results(session) if s < start]
        bodies = {s: marker_text(session, s) for s in old}
        messages = assemble(session, scope, scope.history, bodies).messages
        tokens = sum(session.counter.message(m) for m in messages) - (
            session.ntok(scope.current) if scope.current is not None else 0)
        return Rendered(tuple(messages), tokens, frozenset(s for s in scope.history_results(session) if s > start))


def test_reread_mode_reads_the_hidden_file_name_again(mem_graph: ContextGraph) -> None:
    """Strict fails turn 2 (the file name from turn 1's find() is hidden); reread re-issues that find() — a
    read-only call by BFCL's own state check — as its own step, sees the name in the newest result and
    passes."""
    bench = BFCLMultiTurn(ids=[HIDDEN_VALUE_TASK])
    task = bench.tasks()[0]
    strict, _ = _run(bench, task, CurrentTurnOnly(), HUGE, mem_graph)
    out, episode = _run(bench, task, CurrentTurnOnly(), HUGE, mem_graph, model=OracleModel(mode="reread"))
    assert strict.score["task_acc"] == 0.0 and strict.extra["oracle_rereads"] == 0
    assert out.score["task_acc"] == 1.0 and "oracle_hidden" not in out.extra
    assert out.extra["oracle_rereads"] >= 1
    rereads = [name for _t, name, values in out.extra["oracle_reread_log"] if "goals.txt" in values]
    assert rereads and set(rereads) <= {"find", "ls"}
    assert OracleModel(mode="reread").name == "oracle_reread" and OracleModel().name == "oracle"


def test_read_only_is_bfcls_state_check_on_a_copy() -> None:
    from contextrender.experiments.benchmarks.bfcl.backend import BFCLEnvironment

    env = BFCLEnvironment(BFCLMultiTurn(ids=[HIDDEN_VALUE_TASK]).tasks()[0])
    before = env.execute("pwd", {})
    assert env.read_only("ls", {}) and env.read_only("pwd", {})
    assert not env.read_only("cd", {"folder": "academic_venture"})  # moves the current directory
    assert not env.read_only("mkdir", {"dir_name": "x"}) and not env.read_only("no_such_function", {})
    assert env.execute("pwd", {}) == before  # the trials ran on copies: nothing moved


def test_tiny_budget_fails_where_full_history_passes(mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(ids=[HIDDEN_VALUE_TASK, "multi_turn_long_context_135", "multi_turn_long_context_0"])
    passed = {}
    for budget in (HUGE, 150):
        passed[budget] = sum(_run(bench, t, _policy("contextrender"), budget, mem_graph)[0].score["task_acc"]
                             for t in bench.tasks())
    assert passed[HUGE] == 3 and passed[150] < passed[HUGE]


@pytest.mark.slow
def test_budget_lowers_accuracy_on_long_context() -> None:
    bench = BFCLMultiTurn()
    graph = ContextGraph(":memory:")
    acc, exceeded = 0.0, 0
    for task in bench.tasks():
        outcome, episode = _run(bench, task, _policy("contextrender"), 2000, graph)
        acc += outcome.score["task_acc"]
        exceeded += episode.exceeded_budget
        assert all(r.tokens <= 2000 for r in episode.renders)
    graph.close()
    assert exceeded > 50 and acc < len(bench.tasks()) - 10


# -- the checker through the benchmark -------------------------------------------------


def test_state_checker_on_a_hand_made_mismatch() -> None:
    task = load_tasks("multi_turn_base", ids=["multi_turn_base_0"])[0]
    env, checker = BFCLEnvironment(task), BFCLChecker(task)
    env.begin_turn(0)
    for call in task.ground_truth[0]:
        env.execute_call_string(call.replace("'temp'", "'tmp'"))  # mkdir(dir_name='temp') -> 'tmp'
    check = checker.check_turn(env, 0)
    assert not check.passed and not check.state_ok
    assert any("'tmp'" in d and "unexpected" in d for d in check.diffs)
    assert any("'temp'" in d and "missing" in d for d in check.diffs)


class _Replay:
    """A model that replays fixed assistant messages (bound per episode like the oracle)."""

    name = "replay"

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = list(messages)

    def episode(self, task: Any, session: Any) -> _Replay:
        return self

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Completion:
        return Completion(self.messages.pop(0), Usage(calls=1))


def _call(i: int, name: str, args: Any) -> dict[str, Any]:
    raw = args if isinstance(args, str) else json.dumps(args)
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": raw}}


def test_wrong_call_fails_turn_with_diffs_in_extra(mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(category="multi_turn_base", ids=["multi_turn_base_0"])
    task = bench.tasks()[0]
    script = [{"role": "assistant", "content": None, "tool_calls": [
        _call(0, "cd", {"folder": "document"}), _call(1, "mkdir", {"dir_name": "tmp"})]},
        {"role": "assistant", "content": "ok"}] + [{"role": "assistant", "content": "no"}] * (len(task.turns) - 1)
    outcome, _ = _run(bench, task, _policy("contextrender"), HUGE, mem_graph, _Replay(script))
    assert outcome.score["task_acc"] == 0.0 and outcome.extra["first_failing_turn"] == 0
    turn0 = outcome.extra["per_turn"][0]
    assert turn0["state_ok"] is False and turn0["calls"] == 2 and turn0["steps"] == 1
    assert len(turn0["diffs"]) <= 5 and all(len(d) <= 303 for d in turn0["diffs"])
    # later turns: the model made no call although ground truth does
    assert outcome.extra["per_turn"][1]["passed"] is False
    assert outcome.score["turns_passed"] == 0.0


def test_bad_arguments_modes(mem_graph: ContextGraph) -> None:
    def script():
        return [{"role": "assistant", "content": None, "tool_calls": [
            _call(0, "cd", '{"folder": "document"'), _call(1, "pwd", {})]},
            {"role": "assistant", "content": "sorry"}] + [{"role": "assistant", "content": "x"}] * 10

    for mode in ("error_result", "end_turn"):
        bench = BFCLMultiTurn(category="multi_turn_base", ids=["multi_turn_base_0"], bad_arguments=mode)
        task = bench.tasks()[0]
        outcome, episode = _run(bench, task, _policy("contextrender"), HUGE, mem_graph, _Replay(script()))
        msgs = episode.session.messages
        tool_msgs = [m for m in msgs[:5] if m.role == "tool"]
        assert [m.tool_call_id for m in tool_msgs] == ["c0", "c1"]  # every call id answered
        assert tool_msgs[0].content.startswith("Error during execution: could not decode the arguments as JSON")
        turn0 = outcome.extra["per_turn"][0]
        if mode == "error_result":  # the valid call still runs and the model is asked again
            assert "current_working_directory" in tool_msgs[1].content
            assert turn0["calls"] == 1 and turn0["steps"] == 1 and msgs[4].content == "sorry"
        else:  # BFCL: nothing of that response runs and the turn ends
            assert tool_msgs[1].content.startswith("Error during execution: not executed")
            assert turn0["calls"] == 0 and msgs[4].role == "user"


def test_per_turn_step_limit_force_quits(mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(category="multi_turn_base", ids=["multi_turn_base_0"], per_turn_step_limit=3)
    task = bench.tasks()[0]
    script = [{"role": "assistant", "content": None, "tool_calls": [_call(i, "pwd", {})]} for i in range(10)]
    outcome, episode = _run(bench, task, _policy("contextrender"), HUGE, mem_graph, _Replay(script))
    # BFCL: the step counter must exceed the limit, so limit + 1 tool-calling steps run
    assert episode.invocations == 4
    assert outcome.status == "step_limit" and outcome.score["task_acc"] == 0.0
    assert outcome.extra["turns_played"] == 1 and outcome.extra["per_turn"][0]["force_quit"] is True
    assert "forced to quit" in outcome.extra["stopped"]
    assert outcome.score["turns"] == float(sum(1 for g in task.ground_truth if g))


def test_episode_step_limit_is_scored_not_raised(mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(category="multi_turn_base", ids=["multi_turn_base_0"])
    task = bench.tasks()[0]
    outcome, _ = _run(bench, task, _policy("contextrender"), HUGE, mem_graph, limits=Limits(max_steps=3))
    assert outcome.status == "step_limit" and outcome.score["task_acc"] == 0.0
    assert "step limit 3" in outcome.extra["stopped"]


def test_system_prompt_is_optional(mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(category="multi_turn_base", ids=["multi_turn_base_0"], system_prompt="Be brief.")
    outcome, episode = _run(bench, bench.tasks()[0], _policy("contextrender"), HUGE, mem_graph)
    assert outcome.score["task_acc"] == 1.0
    assert episode.session.messages[0].role == "system" and episode.session.messages[0].content == "Be brief."


# -- live path: real litellm with a scripted custom provider ---------------------------


class ScriptedBFCL(CustomLLM):
    """Plays a task's ground truth: each turn's calls as one parallel response, then text.

    It reads its position from the messages it receives (user turns so far and
    whether the last message is a tool result), like a stateless server would.
    """

    def __init__(self, task: Any, bad_first_call: bool = False) -> None:
        super().__init__()
        self.task = task
        self.bad_first_call = bad_first_call
        self.seen: list[dict[str, Any]] = []
        self.calls = 0

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.seen.append(kwargs)
        self.calls += 1
        messages = kwargs["messages"]
        turn = sum(1 for m in messages if m["role"] == "user") - 1
        last = messages[-1]
        retry = last["role"] == "tool" and "could not decode" in last["content"]
        if last["role"] == "tool" and not retry:
            return self._reply({"role": "assistant", "content": "Done."})
        if self.bad_first_call and turn == 0 and last["role"] == "user":  # truncated JSON
            return self._reply({"role": "assistant", "content": None, "tool_calls": [
                {"id": "bad", "type": "function", "function": {"name": "cd", "arguments": '{"folder": "docu'}}]})
        calls = []
        for i, call in enumerate(self.task.ground_truth[turn]):
            name, arguments = parse_call_string(call)
            calls.append({"id": f"t{self.calls}_{i}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments)}})
        if not calls:
            return self._reply({"role": "assistant", "content": "I can't do that with these tools."})
        return self._reply({"role": "assistant", "content": None, "tool_calls": calls})

    @staticmethod
    def _reply(message: dict[str, Any]) -> ModelResponse:
        return ModelResponse(
            choices=[{"index": 0, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                      "message": message}],
            usage={"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105})


@pytest.fixture
def scripted_provider():
    def install(handler: CustomLLM) -> CustomLLM:
        litellm.custom_provider_map = [{"provider": "scripted", "custom_handler": handler}]
        litellm.utils.custom_llm_setup()
        return handler
    yield install
    litellm.custom_provider_map = []


def test_offline_environment_for_litellm() -> None:
    assert os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP") == "True"


@pytest.mark.parametrize("bad_first_call", [False, True])
def test_live_path_with_scripted_provider(bad_first_call: bool, scripted_provider, mem_graph: ContextGraph) -> None:
    bench = BFCLMultiTurn(category="multi_turn_base", ids=["multi_turn_base_0"])
    task = bench.tasks()[0]
    handler = scripted_provider(ScriptedBFCL(task, bad_first_call))
    model = LiteLLMModel(model="scripted/bfcl", cache=False)
    outcome, episode = _run(bench, task, _policy("contextrender"), HUGE, mem_graph, model)
    assert outcome.status == "ok" and outcome.score["task_acc"] == 1.0, outcome.extra
    # one parallel step per checked turn (+1 retry after the bad call), one closing per turn
    assert handler.calls == sum(2 for g in task.ground_truth if g) + int(bad_first_call)
    first = handler.seen[0]
    assert first["messages"][0]["role"] == "user"  # BFCL sends no system prompt
    tools = first["optional_params"].get("tools") or first.get("tools")
    assert {t["function"]["name"] for t in tools} >= {"cd", "mkdir", "post_tweet"}
    assert episode.agent_usage.input == 100 * handler.calls
    if bad_first_call:
        errors = [m for m in episode.session.messages if m.role == "tool" and "could not decode" in m.content]
        assert len(errors) == 1
        assert outcome.extra["per_turn"][0]["steps"] == 2
