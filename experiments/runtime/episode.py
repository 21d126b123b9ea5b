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

from contextrender.billing import SessionBilling
from contextrender.events import Usage
from contextrender.expand import TOOL_NAME as EXPAND_TOOL
from contextrender.expand import ExpandTool, chat_tool, gives_handles
from contextrender.experiments.evaluation.measures import MeasureStats, MeasureTracker
from contextrender.experiments.records.cost import upper_bound_cost
from contextrender.experiments.records.schema import RenderStat
from contextrender.graph import Session
from contextrender.render import ContextPolicy, Scope

#: The billing profiles every request is simulated under (docs/method.md §14; ``none`` needs no simulation).
BILLED_PROFILES = ("anthropic", "openai")


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
        self._billing = SessionBilling(BILLED_PROFILES, session.counter)  # each request's cache, per profile
        #: docs/method.md §16: a model that reads omitted results back (the oracle's ``expand`` mode) is offered
        #: the expand tool; the episode answers its calls itself, as the service would, so the benchmark never
        #: sees them. Each expansion is an invocation of its own, charged and counted like any other.
        #: Offered only where the policy's markers carry handles (its ``expand`` option): for any other the tool could
        #: read nothing back and would only cost its schema's tokens, so its runs are its strict ones.
        self.expander = ExpandTool(session, budget) if getattr(model, "expands", False) and gives_handles(policy) else None
        #: the tool definitions the benchmark offered the agent at its latest step (the expand tool not among them): the
        #: episode's trace line carries them, so a replay bills each request as it was sent (docs/method.md §14)
        self.tools: list[dict[str, Any]] = []
        self.expansions = 0  # calls answered
        self.expansion_rounds = 0  # invocations that called the tool
        self._rounds_taken = 0

    # -- environment side ---------------------------------------------------------

    def add(self, message: dict[str, Any]) -> int:
        """Append a system/user/tool message (the full history lives in the graph)."""
        return self.session.add(message)

    @property
    def invocations(self) -> int:
        return len(self.renders)

    # -- model side -----------------------------------------------------------------

    def step(self, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One invocation: render under B, call the model, store its message; return it.

        With the expand tool offered (:attr:`expander`), the model's calls of it are answered here and the model
        is called again until it answers with something else; the message returned holds none of those calls.
        The benchmark counts the extra invocations against its own step limits (:meth:`take_rounds`)."""
        self.tools = list(tools or [])
        if self.expander is None:
            return self._invoke(tools)
        offered = [*(tools or []), chat_tool()]
        while True:
            message = self._invoke(offered)
            calls = message.get("tool_calls") or []
            mine = [c for c in calls if (c.get("function") or {}).get("name") == EXPAND_TOOL]
            if not mine:
                return message
            at = len(self.session) - 1  # the assistant message that called the tool
            for c in mine:
                text, _ = self.expander.answer((c.get("function") or {}).get("arguments"), at=at)
                self.session.add({"role": "tool", "tool_call_id": c["id"], "content": text})
                self.expansions += 1
            self.expansion_rounds += 1
            rest = [c for c in calls if c not in mine]
            if rest:
                return {**message, "tool_calls": rest}

    def take_rounds(self) -> int:
        """Invocations spent on the expand tool since the last call (what a benchmark adds to its step count)."""
        n, self._rounds_taken = self.expansion_rounds - self._rounds_taken, self.expansion_rounds
        return n

    def _invoke(self, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
        u = completion.usage
        self.agent_usage += u
        m = self._tracker.on_turn(completion.message)
        # What this request costs under each provider's cache (docs/method.md §14), from what it sent.
        billed = self._billing.request(rendered.messages, tools, u.output)
        prompt = next(iter(billed.values())).prompt if billed else None
        self.renders[-1] = replace(stat, id_uses=m.id_uses, id_survived=m.id_survived, calls=m.calls,
                                   rereads=m.rereads, prompt=prompt, output=u.output,
                                   cache={p: [b.cache_read, b.cache_write] for p, b in billed.items()},
                                   provider_cache=None if getattr(self.model, "simulated", False)
                                   else [u.input, u.cached, u.cache_write])
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
