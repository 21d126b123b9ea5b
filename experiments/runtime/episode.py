"""One episode's agent runtime: render → model → record, shared by every benchmark.

A benchmark owns its environment (executing calls, feeding user turns,
scoring); :class:`Episode` owns everything the paper compares: the graph
session, the active policy at budget B, the model call, per-invocation render
statistics and the usage split (agent / compactor / embeddings, plus any
part a benchmark's own model calls add: τ²'s user simulator is ``user``).
Benchmarks never know which policy is active.

Every render is checked and measured for the failure modes users report
(:mod:`~contextrender.experiments.evaluation.measures`): pairing validity is
asserted before the model is called (a split call/result pair raises
:class:`~contextrender.experiments.evaluation.measures.PairingError`, a bug
that stops the job), and each invocation's prefix retention, identifier
survival and re-reads of the calls the model made go into its
:class:`~contextrender.experiments.records.schema.RenderStat` and, pooled, into
:attr:`Episode.measures` (the record's ``measures``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from contextrender.events import Usage
from contextrender.experiments.evaluation.measures import MeasureStats, MeasureTracker
from contextrender.experiments.records.cost import upper_bound_cost
from contextrender.experiments.records.schema import RenderStat
from contextrender.graph import Session
from contextrender.render import ContextPolicy, Scope


class EpisodeStop(Exception):
    """The episode ended early; ``status`` goes into the record."""

    status = "error"


class StepLimit(EpisodeStop):
    status = "step_limit"


class CostLimit(EpisodeStop):
    status = "cost_limit"


@dataclass(frozen=True)
class Limits:
    max_steps: int = 50  # model invocations per episode
    max_cost_usd: float | None = None  # per task, Eq. 3 with ρ = 0


class Episode:
    """Drives one task: ``add`` environment messages, ``step`` the model."""

    def __init__(self, session: Session, policy: ContextPolicy, model: Any, budget: int,
                 limits: Limits = Limits()) -> None:
        self.session = session
        self.policy = policy
        self.model = model
        self.budget = budget
        self.limits = limits
        self.renders: list[RenderStat] = []
        self.agent_usage = Usage()
        self.policy_usage = Usage()
        #: usage parts of the benchmark's own model calls (τ²'s user simulator: "user"); see add_usage
        self.extra_usage: dict[str, Usage] = {}
        self.exceeded_budget = False
        self.last_rendered: Any = None
        self._tracker = MeasureTracker(session.counter)  # pairing check and the failure-mode measures

    # -- environment side ---------------------------------------------------------

    def add(self, message: dict[str, Any]) -> int:
        """Append a system/user/tool message (the full history lives in the graph)."""
        return self.session.add(message)

    @property
    def invocations(self) -> int:
        return len(self.renders)

    # -- model side -----------------------------------------------------------------

    def step(self, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One invocation: render under B, call the model, store its message; return it."""
        if self.invocations >= self.limits.max_steps:
            raise StepLimit(f"step limit {self.limits.max_steps} reached")
        full = Scope.of(self.session).full_tokens(self.session)
        self.exceeded_budget |= full > self.budget
        rendered = self.policy.render(self.session, self.budget)
        self.last_rendered = rendered
        self.policy_usage += rendered.usage
        t = self.session.next_invocation
        # Before the model sees it: a render that splits a call from its result is a bug (PairingError).
        pre = self._tracker.on_render(self.session, rendered, f"{self.policy.name} at invocation {t}")
        stat = RenderStat(t, rendered.tokens, full, tuple(sorted(rendered.visible)), input_tokens=pre.input_tokens,
                          prefix_tokens=pre.prefix_tokens)
        self.renders.append(stat)
        completion = self.model.complete(list(rendered.messages), tools)
        self.agent_usage += completion.usage
        m = self._tracker.on_turn(completion.message)
        self.renders[-1] = replace(stat, id_uses=m.id_uses, id_survived=m.id_survived, calls=m.calls,
                                   rereads=m.rereads)
        self.session.add(completion.message)
        self._check_cost()
        return completion.message

    def add_usage(self, part: str, usage: Usage) -> None:
        """Count a model call the benchmark makes itself (τ²'s user simulator) as usage part ``part``.

        The part is reported apart in :meth:`usage` and counts toward the
        per-task spend cap (CostLimit here, as after an agent call), but not
        toward the paper's cost C, which covers
        :data:`~experiments.records.cost.COST_PARTS` only.
        """
        if part in ("agent", "compactor", "embeddings"):
            raise ValueError(f"usage part {part!r} is the episode's own")
        self.extra_usage[part] = self.extra_usage.get(part, Usage()) + usage
        self._check_cost()

    def _check_cost(self) -> None:
        if self.limits.max_cost_usd is not None and self.cost_upper() > self.limits.max_cost_usd:
            raise CostLimit(f"task spend {self.cost_upper():.4f} USD above cap {self.limits.max_cost_usd}")

    # -- accounting -------------------------------------------------------------------

    @property
    def measures(self) -> MeasureStats:
        """The failure-mode measures' counts over this episode's invocations so far."""
        return self._tracker.stats

    def usage(self) -> dict[str, dict[str, int]]:
        p = self.policy_usage
        return {
            "agent": self.agent_usage.to_dict(),
            "compactor": Usage(input=p.input, output=p.output, cached=p.cached, calls=p.calls).to_dict(),
            "embeddings": Usage(embedding=p.embedding).to_dict(),
            **{part: u.to_dict() for part, u in self.extra_usage.items()},
        }

    def cost_upper(self) -> float:
        return upper_bound_cost(self.usage())
