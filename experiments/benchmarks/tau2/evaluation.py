"""τ²'s own evaluator on a harness episode: the transcript as a ``SimulationRun``, scored by ``evaluate_simulation``.

:class:`Trajectory` collects the conversation in τ²'s message models while the
episode runs (the greeting, user messages, the agent's messages and tool calls
as ``ToolCall``\\ s, the ``ToolMessage``\\ s that ``Environment.get_response``
returned), so nothing is reconstructed from text. :func:`evaluate` wraps it
in a ``SimulationRun`` and calls ``tau2.evaluator.evaluator.evaluate_simulation``
with ``EvaluationType.ALL``: the database check (τ² replays the trajectory's
calls in a fresh environment and the reference actions in another, and
compares the hashes), the action check and the communicate check. NL
assertions need an LLM judge: only with ``nl_assertions=True``
(``ALL_WITH_NL_ASSERTIONS``, τ²'s own judge model); none of the retail or
airline tasks has them in its reward basis, so the reward is the same.

Without a judge the evaluation is a pure function of the task and the transcript, and most of an
episode's time (each of τ²'s environments loads the domain database): :func:`evaluate` keeps the
latest results in memory keyed by the task and the transcript's messages, so the methods of one sweep
that led the agent through the same conversation are scored once (:data:`EVAL_CACHE_SIZE`).

Scores: ``pass`` (pass^1: reward == 1), ``reward``, and the breakdown
``db``, ``communicate`` (τ²'s ``reward_breakdown``, 1.0 where a task's basis
lacks the component) and ``action`` (all reference actions matched; τ²
reports it, these tasks do not reward it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from contextrender.experiments.benchmarks.tau2.environment import Tau2Task, tau2

__all__ = ["Trajectory", "Tau2Score", "evaluate"]


@dataclass
class Trajectory:
    """The episode in τ²'s message models, appended in conversation order."""

    messages: list[Any] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    start_time: str = field(default_factory=lambda: tau2().message.get_now())

    def _add(self, m: Any) -> Any:
        m.turn_idx = len(self.messages)
        self.messages.append(m)
        return m

    def assistant(self, content: str | None, calls: list[Any] | None = None) -> Any:
        return self._add(tau2().message.AssistantMessage(role="assistant", content=content, tool_calls=calls or None))

    def user(self, content: str) -> Any:
        return self._add(tau2().message.UserMessage(role="user", content=content))

    def tool(self, message: Any) -> Any:
        return self._add(message)

    @staticmethod
    def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> Any:
        return tau2().message.ToolCall(id=call_id, name=name, arguments=arguments, requestor="assistant")

    def simulation(self, task: Tau2Task, termination: str) -> Any:
        m = tau2().simulation
        return m.SimulationRun(id=f"contextrender-{task.domain}-{task.id}", task_id=task.id,
                               start_time=self.start_time, end_time=tau2().message.get_now(),
                               duration=time.time() - self.started,
                               termination_reason=m.TerminationReason(termination), messages=list(self.messages))


@dataclass(frozen=True)
class Tau2Score:
    score: dict[str, float]
    extra: dict[str, Any]


def _breakdown(info: Any, kind: str) -> float:
    b = info.reward_breakdown or {}
    for k, v in b.items():
        if getattr(k, "value", k) == kind:
            return float(v)
    return 1.0 if info.reward_basis is not None and kind not in {r.value for r in info.reward_basis} else 0.0


#: Results :func:`evaluate` keeps (the latest; a few KB each).
EVAL_CACHE_SIZE = 4096
_eval_cache: OrderedDict[str, Tau2Score] = OrderedDict()
_eval_lock = threading.Lock()


def _transcript_key(task: Tau2Task, trajectory: Trajectory, termination: str) -> str:
    """What τ²'s evaluator reads of an episode: the task, the termination and every message's role, text, calls
    and results (not the timestamps)."""
    msgs = [m.model_dump(mode="json", exclude={"timestamp", "cost", "usage", "raw_data"}) for m in trajectory.messages]
    blob = json.dumps([task.domain, task.id, termination, msgs], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def evaluate(task: Tau2Task, trajectory: Trajectory, termination: str, nl_assertions: bool = False) -> Tau2Score:
    """Score the episode with τ²'s evaluator; return the score dict and what τ² said in detail.

    Without the judge (``nl_assertions=False``) a transcript already scored in this process is not scored
    again: the same result comes back (a copy)."""
    if nl_assertions:  # an LLM judge: not a pure function of the transcript
        return _evaluate(task, trajectory, termination, nl_assertions)
    key = _transcript_key(task, trajectory, termination)
    with _eval_lock:
        hit = _eval_cache.get(key)
        if hit is not None:
            _eval_cache.move_to_end(key)
            return copy.deepcopy(hit)
    result = _evaluate(task, trajectory, termination, nl_assertions)
    with _eval_lock:
        _eval_cache[key] = copy.deepcopy(result)
        while len(_eval_cache) > EVAL_CACHE_SIZE:
            _eval_cache.popitem(last=False)
    return result


def _evaluate(task: Tau2Task, trajectory: Trajectory, termination: str, nl_assertions: bool) -> Tau2Score:
    t = tau2()
    kind = t.evaluator.EvaluationType.ALL_WITH_NL_ASSERTIONS if nl_assertions else t.evaluator.EvaluationType.ALL
    sim = trajectory.simulation(task, termination)
    info = t.evaluator.evaluate_simulation(simulation=sim, task=task.task, evaluation_type=kind, solo_mode=False,
                                           domain=task.domain)
    reward = float(info.reward)
    checks = info.action_checks or []
    comm = info.communicate_checks or []
    n_nl = len(task.task.evaluation_criteria.nl_assertions or []) if task.task.evaluation_criteria else 0
    extra: dict[str, Any] = {
        "termination_reason": termination,
        "reward_basis": [r.value for r in info.reward_basis] if info.reward_basis else None,
        "db_match": info.db_check.db_match if info.db_check is not None else None,
        "actions_matched": [sum(1 for c in checks if c.action_match), len(checks)],
        "communicate_met": [sum(1 for c in comm if c.met), len(comm)],
        "nl_assertions": (f"evaluated by tau2's judge ({len(info.nl_assertions or [])})" if nl_assertions
                          else f"not evaluated: no LLM judge configured ({n_nl} in the task, not in its reward basis)"
                          if n_nl else "none in the task"),
    }
    if info.info and isinstance(info.info, dict) and "note" in info.info:
        extra["tau2_note"] = str(info.info["note"])
    unmatched = [c.action.action_id for c in checks if not c.action_match]
    if unmatched:
        extra["actions_unmatched"] = unmatched[:10]
    unmet = [c.info for c in comm if not c.met]
    if unmet:
        extra["communicate_unmet"] = unmet[:10]
    if info.reward_breakdown is None:  # terminated early: τ² scores 0 without a breakdown
        db = communicate = action = 0.0
    else:
        db, communicate = _breakdown(info, "DB"), _breakdown(info, "COMMUNICATE")
        action = 1.0 if all(c.action_match for c in checks) else 0.0
    score = {"pass": 1.0 if reward == 1.0 else 0.0, "reward": reward, "db": db, "communicate": communicate,
             "action": action}
    if nl_assertions and info.nl_assertions is not None:
        score["nl"] = 1.0 if all(c.met for c in info.nl_assertions) else 0.0
    json.dumps(extra)  # records are JSON: fail here, not in the writer
    return Tau2Score(score, extra)
