"""BFCL v4 multi-turn as a :class:`~experiments.benchmarks.base.Benchmark`.

The episode loop mirrors bfcl-eval 2026.3.23's FC inference loop
(``BaseHandler.inference_multi_turn_FC``, read from its source):

* no system prompt (BFCL sends none to FC models); ``system_prompt`` adds one;
* each turn's user messages are appended, then the model is stepped until it
  replies without tool calls; every call is executed in order against the
  task's environment and its result string fed back as a ``tool`` message;
* BFCL counts executed steps per turn and force-quits once the count exceeds
  ``MAXIMUM_STEP_LIMIT`` = 20 (so the 21st tool-calling step is the last);
  a force-quit fails the whole task and ends the episode.

Scoring runs the checker after every turn against a ground-truth environment
advanced by that turn's ground-truth calls (:class:`.checker.BFCLChecker`).
A task passes iff every checked turn passes and nothing stopped it early.

Malformed tool-call arguments: BFCL's FC decoder ``json.loads`` every call of
a response and, if one fails, executes none of them and ends the turn. With
``bad_arguments="error_result"`` (default) each undecodable call instead gets
an ``Error during execution: ...`` result and the others run — the feedback a
real agent loop gives. ``bad_arguments="end_turn"`` reproduces BFCL: no call
of that response runs, each gets an error result (the provider API needs a
result per call id) and the turn ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contextrender.experiments.benchmarks.base import EpisodeOutcome, decode_arguments
from contextrender.experiments.benchmarks.bfcl.backend import BFCLEnvironment
from contextrender.experiments.benchmarks.bfcl.checker import BFCLChecker, TurnCheck
from contextrender.experiments.benchmarks.bfcl.data import CATEGORIES, BFCLTask, load_tasks, tools_openai
from contextrender.experiments.runtime.episode import Episode, EpisodeStop
from contextrender.experiments.runtime.oracle import OracleEpisode

__all__ = ["BFCLMultiTurn", "BAD_ARGUMENTS_MODES"]

BAD_ARGUMENTS_MODES = ("error_result", "end_turn")
_MAX_DIFFS_IN_EXTRA = 5
_MAX_DIFF_CHARS = 300


@dataclass
class _TurnLog:
    turn: int
    steps: int = 0  # model steps that made tool calls
    calls: int = 0
    check: TurnCheck | None = None
    force_quit: bool = False

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"turn": self.turn, "steps": self.steps, "calls": self.calls}
        if self.force_quit:
            d["force_quit"] = True
        if self.check is not None:
            d.update(passed=self.check.passed and not self.force_quit, state_ok=self.check.state_ok,
                     response_ok=self.check.response_ok)
            if self.check.diffs:
                d["diffs"] = [x if len(x) <= _MAX_DIFF_CHARS else x[:_MAX_DIFF_CHARS] + "..."
                              for x in self.check.diffs[:_MAX_DIFFS_IN_EXTRA]]
                if len(self.check.diffs) > _MAX_DIFFS_IN_EXTRA:
                    d["more_diffs"] = len(self.check.diffs) - _MAX_DIFFS_IN_EXTRA
        return d


class BFCLMultiTurn:
    """BFCL v4 ``multi_turn_base`` / ``multi_turn_long_context`` (Hydra-instantiable)."""

    primary_metric = "task_acc"
    synthetic = False

    def __init__(self, category: str = "multi_turn_long_context", limit: int | None = None,
                 ids: list[str] | None = None, per_turn_step_limit: int = 20,
                 include_response_schema: bool = False, system_prompt: str | None = None,
                 bad_arguments: str = "error_result") -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unsupported category {category!r}; expected one of {sorted(CATEGORIES)}")
        if bad_arguments not in BAD_ARGUMENTS_MODES:
            raise ValueError(f"bad_arguments must be one of {BAD_ARGUMENTS_MODES}, got {bad_arguments!r}")
        if per_turn_step_limit < 1:
            raise ValueError("per_turn_step_limit must be >= 1")
        self.category = category
        self.name = f"bfcl_{category}"
        self.limit = limit
        self.ids = [str(i) for i in ids] if ids is not None else None  # Hydra may pass a ListConfig
        self.per_turn_step_limit = per_turn_step_limit
        self.include_response_schema = include_response_schema
        self.system_prompt = system_prompt
        self.bad_arguments = bad_arguments
        self._tasks: list[BFCLTask] | None = None

    def tasks(self) -> list[BFCLTask]:
        if self._tasks is None:
            self._tasks = load_tasks(self.category, limit=self.limit, ids=self.ids)
        return list(self._tasks)

    # -- one episode ------------------------------------------------------------------

    def run_episode(self, task: BFCLTask, episode: Episode) -> EpisodeOutcome:
        env = BFCLEnvironment(task)
        checker = BFCLChecker(task)
        if isinstance(episode.model, OracleEpisode):  # read-only: leaves the state BFCL's checker compares
            episode.model.read_only = env.read_only
        tools = tools_openai(task, self.include_response_schema)
        turns: list[_TurnLog] = []
        status, stopped = "ok", None
        if self.system_prompt:
            episode.add({"role": "system", "content": self.system_prompt})
        try:
            for turn_index, user_messages in enumerate(task.turns):
                log = _TurnLog(turn_index)
                turns.append(log)
                env.begin_turn(turn_index)
                for m in user_messages:
                    episode.add(dict(m))
                self._play_turn(env, episode, tools, log)
                log.check = checker.check_turn(env, turn_index)
                if log.force_quit:
                    status = "step_limit"
                    stopped = (f"turn {turn_index}: forced to quit after {log.steps} tool-calling steps "
                               f"(per-turn limit {self.per_turn_step_limit})")
                    break
        except EpisodeStop as stop:  # episode-level step/cost cap: score what was played
            status, stopped = stop.status, str(stop)
        return self._outcome(task, turns, status, stopped, episode)

    def _play_turn(self, env: BFCLEnvironment, episode: Episode, tools: list[dict[str, Any]],
                   log: _TurnLog) -> None:
        while True:
            message = episode.step(tools)
            log.steps += episode.take_rounds()  # each expand round (docs/method.md §16) is a tool-calling step
            calls = message.get("tool_calls") or []
            if not calls:
                return
            decoded = [decode_arguments(tc["function"].get("arguments"), "Error during execution") for tc in calls]
            end_turn = self.bad_arguments == "end_turn" and any(isinstance(a, str) for a in decoded)
            for tc, arguments in zip(calls, decoded, strict=True):
                if end_turn:
                    result = arguments if isinstance(arguments, str) else (
                        "Error during execution: not executed; another call in this response "
                        "had undecodable arguments")
                elif isinstance(arguments, str):
                    result = arguments
                else:
                    result = env.execute(tc["function"]["name"], arguments)
                    log.calls += 1
                episode.add({"role": "tool", "tool_call_id": tc["id"], "content": result})
            if end_turn:
                return
            log.steps += 1
            if log.steps > self.per_turn_step_limit:  # BFCL: count > MAXIMUM_STEP_LIMIT
                log.force_quit = True
                return

    def _outcome(self, task: BFCLTask, turns: list[_TurnLog], status: str, stopped: str | None,
                 episode: Episode) -> EpisodeOutcome:
        checked = [i for i, gt in enumerate(task.ground_truth) if gt]  # BFCL skips empty-truth turns
        by_turn = {t.turn: t for t in turns}
        passed = {i for i in checked
                  if (t := by_turn.get(i)) is not None and t.check is not None and t.check.passed
                  and not t.force_quit}
        all_played = len(turns) == len(task.turns) and all(t.check is not None for t in turns)
        task_ok = status == "ok" and all_played and len(passed) == len(checked)
        first_fail = next((i for i in checked if i not in passed), None)
        extra: dict[str, Any] = {
            "first_failing_turn": first_fail,
            "turns_played": len(turns),
            "total_turns": len(task.turns),
            "per_turn": [t.to_dict() for t in turns],
        }
        if stopped:
            extra["stopped"] = stopped
        hidden = getattr(episode.model, "hidden_log", None)
        if hidden:  # the offline oracle's record of values the policy hid from it
            extra["oracle_hidden"] = [[t, name, list(values)] for t, name, values in hidden][:20]
        if isinstance(episode.model, OracleEpisode):
            extra["oracle_rereads"] = episode.model.rereads
            if episode.model.expands:
                extra["oracle_expansions"] = episode.model.expansions
                extra["oracle_expand_log"] = [[t, args, list(values)]
                                              for t, args, values in episode.model.expand_log][:20]
            if episode.model.reread_log:
                extra["oracle_reread_log"] = [[t, name, list(values)]
                                              for t, name, values in episode.model.reread_log][:20]
        score = {
            "task_acc": 1.0 if task_ok else 0.0,
            "turn_acc": len(passed) / len(checked) if checked else 1.0,
            "turns_passed": float(len(passed)),
            "turns": float(len(checked)),
        }
        return EpisodeOutcome(score=score, status=status, extra=extra)
