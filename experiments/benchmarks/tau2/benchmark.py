"""τ²-bench retail and airline as :class:`~contextrender.experiments.benchmarks.base.Benchmark`\\ s.

One episode, mirroring τ²'s orchestrator (``tau2.orchestrator.Orchestrator``,
read from its source):

* a fresh environment from τ²'s registry; system prompt = ``LLMAgent``'s,
  built from the domain policy; tools = the environment's OpenAI schemas;
* the orchestrator's first agent message ("Hi! How can I help you today?"),
  then the user's answer to it (offline: :func:`.environment.opening_message`;
  live: τ²'s ``UserSimulator``, :mod:`.live`);
* the agent is stepped (``episode.step(tools)``): every tool call is answered
  by ``Environment.get_response`` and fed back as a ``tool`` message; a reply
  without tool calls goes to the user, who answers or ends the call — with a
  stop token (``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``:
  ``UserSimulator.is_stop``), kept in τ²'s trajectory and never shown to the
  agent; the offline user ends it after the agent's first text reply (its
  closing message). The agent never ends the call itself (``LLMAgent`` has
  ``BaseAgent.is_stop``: False), and ``transfer_to_human_agents`` is one of
  the domain's tools like any other;
* τ²'s limits: ``max_steps`` orchestrator steps (each agent message, each
  batch of tool results, each user message; default 200) and ``max_errors``
  tool errors (default 10), checked after every step whose message does not
  go to the environment, the error limit last (as ``Orchestrator.run``), end
  the episode with τ²'s termination reason, which τ²'s evaluator scores 0; an
  empty message (no text, no tool calls) is τ²'s ``agent_error`` /
  ``user_error`` (``validate()`` fails in the orchestrator);
* scored by τ²'s evaluator on the trajectory (:mod:`.evaluation`).

The benchmark never looks at the model, except to choose the user when
``user=auto``: τ²'s ``UserSimulator`` for an API model (a ``LiteLLMModel``),
the offline user otherwise (the oracle follows :attr:`Tau2Task.reference`,
:mod:`.oracle_script`). ``user_factory`` replaces either.

Undecodable tool-call arguments (a live model's) get an error result and are
left out of τ²'s trajectory: τ²'s own agent fails before it could emit them,
and its evaluator replays every call it is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from contextrender.experiments.benchmarks.base import EpisodeOutcome, decode_arguments
from contextrender.experiments.benchmarks.tau2.environment import (
    DOMAINS,
    OfflineUser,
    Tau2Task,
    User,
    load_tasks,
    new_environment,
    system_prompt,
    tau2,
    tool_schemas,
)
from contextrender.experiments.benchmarks.tau2.evaluation import Trajectory, evaluate
from contextrender.experiments.benchmarks.tau2.live import DEFAULT_USER_MODEL, SimulatedUser
from contextrender.experiments.runtime.episode import Episode, EpisodeStop
from contextrender.experiments.runtime.models import LiteLLMModel
from contextrender.experiments.runtime.oracle import OracleEpisode

__all__ = ["Tau2Bench"]

_MAX_HIDDEN_IN_EXTRA = 20
USERS = ("auto", "offline", "simulator")


def _chars(m: dict[str, Any]) -> int:
    return len(m.get("content") or "") + sum(len(tc["function"]["name"]) + len(tc["function"].get("arguments") or "")
                                             for tc in m.get("tool_calls") or [])


class _Log:
    """The episode's messages into the graph, plus the history profile the records carry.

    Profile (per episode): tool calls, tool errors, tool-output tokens (the shared
    counter) and characters, and the largest history before an invocation —
    Tok(H_full) as the episode measured it, and its characters (history: every
    message but the system prompt and the current user message, docs/method.md §1).
    """

    def __init__(self, episode: Episode) -> None:
        self.episode = episode
        self.calls = self.errors = self.out_tokens = self.out_chars = 0
        self.chars = 0  # history characters so far, the current user message included
        self.user_chars = 0
        self.max_history_chars = 0

    def add(self, m: dict[str, Any]) -> None:
        self.episode.add(m)
        if m["role"] == "user":
            self.user_chars = _chars(m)
        if m["role"] != "system":
            self.chars += _chars(m)

    def result(self, call_id: str, content: str, error: bool) -> None:
        self.add({"role": "tool", "tool_call_id": call_id, "content": content})
        self.calls += 1
        self.errors += int(error)
        self.out_tokens += self.episode.session.counter.text(content)
        self.out_chars += len(content)

    def step(self, tools: list[dict[str, Any]]) -> dict[str, Any]:
        self.max_history_chars = max(self.max_history_chars, self.chars - self.user_chars)
        message = self.episode.step(tools)
        self.chars += _chars(message)
        return message

    def profile(self) -> dict[str, int]:
        return {"tool_calls": self.calls, "tool_errors": self.errors, "tool_output_tokens": self.out_tokens,
                "tool_output_chars": self.out_chars,
                "history_tokens": max((r.full_tokens for r in self.episode.renders), default=0),
                "history_chars": self.max_history_chars}


class Tau2Bench:
    """τ²-bench ``retail`` or ``airline`` (Hydra-instantiable; name ``tau2_<domain>``)."""

    # pass^1 (reward == 1): what τ²'s leaderboard reports; for retail and airline the reward is a
    # product of 0/1 checks (DB × COMMUNICATE), so mean reward and pass rate coincide anyway.
    primary_metric = "pass"
    synthetic = False

    def __init__(self, domain: str = "retail", split: str = "base", limit: int | None = None,
                 ids: list[str] | None = None, max_steps: int | None = None, max_errors: int | None = None,
                 nl_assertions: bool = False, user: str = "auto", user_model: str = DEFAULT_USER_MODEL,
                 user_model_args: dict[str, Any] | None = None,
                 user_factory: Callable[[Tau2Task], User] | None = None) -> None:
        if domain not in DOMAINS:
            raise ValueError(f"unsupported τ² domain {domain!r}; expected one of {DOMAINS}")
        if user not in USERS:
            raise ValueError(f"unknown τ² user {user!r}; expected one of {USERS}")
        self.domain = domain
        self.name = f"tau2_{domain}"
        self.split = split
        self.limit = limit
        self.ids = [str(i) for i in ids] if ids is not None else None  # Hydra may pass a ListConfig of ints
        self.max_steps = max_steps
        self.max_errors = max_errors
        self.nl_assertions = nl_assertions
        self.user = user
        self.user_model = user_model
        self.user_model_args = dict(user_model_args or {})
        self.user_factory = user_factory
        self._user_llm: LiteLLMModel | None = None
        self._lock = threading.Lock()
        self._tasks: list[Tau2Task] | None = None

    def tasks(self) -> list[Tau2Task]:
        if self._tasks is None:
            self._tasks = load_tasks(self.domain, self.split, self.ids, self.limit)
        return list(self._tasks)

    # -- the user -----------------------------------------------------------------------

    def user_llm(self) -> LiteLLMModel:
        """The simulator's harness model (``user_model`` through litellm; one per benchmark, built on first use)."""
        with self._lock:
            if self._user_llm is None:
                self._user_llm = LiteLLMModel(self.user_model, **self.user_model_args)
            return self._user_llm

    def make_user(self, task: Tau2Task, episode: Episode) -> User:
        """``user_factory``'s user, or by ``user``: ``auto`` plays τ²'s simulator against an API model only."""
        if self.user_factory is not None:
            user = self.user_factory(task)
        else:
            kind = self.user
            if kind == "auto":
                kind = "simulator" if isinstance(episode.model, LiteLLMModel) else "offline"
            user = SimulatedUser(task, self.user_llm()) if kind == "simulator" else OfflineUser()
        bind = getattr(user, "bind_episode", None)
        if bind is not None:
            bind(episode)
        return user

    # -- one episode ------------------------------------------------------------------

    def run_episode(self, task: Tau2Task, episode: Episode) -> EpisodeOutcome:
        t = tau2()
        max_steps = self.max_steps if self.max_steps is not None else t.max_steps
        max_errors = self.max_errors if self.max_errors is not None else t.max_errors
        is_stop = t.user_simulator.UserSimulator.is_stop
        env = new_environment(task.domain)
        tools = tool_schemas(env)
        if isinstance(episode.model, OracleEpisode):  # τ²'s own notion of a read-only call: its tool types
            episode.model.read_only = lambda name, args: (
                env.tools.has_tool(name) and env.tools.tool_type(name).value == "read")
        user = self.make_user(task, episode)
        traj = Trajectory()
        log = _Log(episode)
        steps = errors = 0

        def limits(termination: str | None) -> str | None:
            # after a step whose message does not go to the environment; as Orchestrator.run, the later check wins
            if steps >= max_steps:
                termination = "max_steps"
            if errors >= max_errors:
                termination = "too_many_errors"
            return termination

        def from_user(text: str | None) -> str | None:
            """One user step; the termination it causes (None: the message went to the agent)."""
            nonlocal steps
            steps += 1
            if text is None:  # the offline user ends the call
                traj.user(t.stop)
                return "user_stop"
            if not text.strip():  # τ²: UserMessage.validate() fails
                return "user_error"
            traj.user(text)
            if is_stop(t.message.UserMessage(role="user", content=text)):
                return "user_stop"
            log.add({"role": "user", "content": text})
            return None

        log.add({"role": "system", "content": system_prompt(env)})
        log.add({"role": "assistant", "content": t.greeting})
        traj.assistant(t.greeting)
        termination, status, stopped = None, "ok", None
        try:
            termination = limits(from_user(user.opening(task)))
            while termination is None:
                message = log.step(tools)
                # each expand round (docs/method.md §16) was an agent message and a tool message: τ²'s two steps
                steps += 1 + 2 * episode.take_rounds()
                calls = message.get("tool_calls") or []
                if not calls:  # to the user
                    text = message.get("content") or ""
                    if not text.strip():  # τ²: AssistantMessage.validate() fails
                        termination = "agent_error"
                        break
                    traj.assistant(text)
                    termination = limits(None)
                    if termination is None:
                        termination = limits(from_user(user.reply(text)))
                    continue
                errors += _execute(message, calls, env, traj, log)
                steps += 1
                termination = limits(None)
        except EpisodeStop as stop:  # the harness's step/cost cap: τ² would call it max_steps
            status, stopped, termination = stop.status, str(stop), "max_steps"
        outcome = self._outcome(task, episode, traj, termination, status, stopped, log.profile())
        describe = getattr(user, "describe", None)
        if describe is not None:
            outcome.extra["user"] = describe()
        return outcome

    def _outcome(self, task: Tau2Task, episode: Episode, traj: Trajectory, termination: str, status: str,
                 stopped: str | None, prof: dict[str, int]) -> EpisodeOutcome:
        result = evaluate(task, traj, termination, self.nl_assertions)
        extra: dict[str, Any] = {"tau2": result.extra, "split": self.split}
        extra["profile"] = prof
        if stopped:
            extra["stopped"] = stopped
        model = episode.model
        hidden = getattr(model, "hidden_log", None)
        if isinstance(model, OracleEpisode):
            script = task.script
            extra["oracle_script"] = {"identify": script.count("identify"), "lookup": script.count("lookup"),
                                      "reference": script.count("reference"), "dropped": len(script.dropped)}
            if hidden:  # the offline oracle's record of values the policy hid from it
                extra["oracle_hidden"] = [[t, name, list(values)] for t, name, values in hidden][
                    :_MAX_HIDDEN_IN_EXTRA]
            extra["oracle_rereads"] = model.rereads
            if model.expands:
                extra["oracle_expansions"] = model.expansions
                extra["oracle_expand_log"] = [[t, args, list(values)] for t, args, values in model.expand_log][
                    :_MAX_HIDDEN_IN_EXTRA]
            if model.reread_log:
                extra["oracle_reread_log"] = [[t, name, list(values)] for t, name, values in model.reread_log][
                    :_MAX_HIDDEN_IN_EXTRA]
        return EpisodeOutcome(score=result.score, status=status, extra=extra)


def _execute(message: dict[str, Any], calls: list[dict[str, Any]], env: Any, traj: Trajectory, log: _Log) -> int:
    """Run one assistant turn's tool calls in τ²'s environment, in order, as its orchestrator does; record the
    turn and each result (a call whose arguments are not JSON gets the decoding error as its result, and runs
    nothing). Returns how many results were errors."""
    executed, results = [], []
    for tc in calls:
        args = decode_arguments(tc["function"].get("arguments"), "Error")
        if isinstance(args, str):
            results.append((tc["id"], args, None))
            continue
        call = traj.tool_call(tc["id"], tc["function"]["name"], args)
        executed.append(call)
        response = env.get_response(call)  # what τ²'s orchestrator calls
        results.append((tc["id"], response.content or "", response))
    if executed:
        traj.assistant(message.get("content") or None, executed)
    errors = 0
    for call_id, content, response in results:
        log.result(call_id, content, error=response is None or response.error)
        errors += 1 if response is None or response.error else 0
        if response is not None:
            traj.tool(response)
    return errors
