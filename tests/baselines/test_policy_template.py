"""The render skeleton every baseline and peer shares (``BasePolicy``) and their constructors' argument checks."""

from __future__ import annotations

import pytest
from _baseline_util import Transcript, text_of

from contextrender.baselines._common import BasePolicy, StatelessPolicy, finish
from contextrender.baselines.acon import Acon
from contextrender.baselines.compact import Compact
from contextrender.baselines.full import FullHistory
from contextrender.baselines.peers import (
    ClearToolUses,
    InspectEdit,
    InspectTrim,
    OpencodePrune,
    OpenHandsSummary,
    SweLastN,
    TailCompaction,
)
from contextrender.baselines.peers._shared import scaled
from contextrender.baselines.peers.openhands import OpenHandsMasking
from contextrender.baselines.recency_summary import RecencySummary
from contextrender.baselines.semantic_retrieval import SemanticRetrieval
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.registry import build_policy, method_config, method_names
from contextrender.render import BudgetExceeded, ContextPolicy, Rendered, Scope


def _session(n: int = 3) -> Session:
    t = Transcript(task="Fix the failing build.")
    for i in range(n):
        t.call(text_of(f"result {i}", 40))
    return t.session()


class _Recorder(StatelessPolicy):
    """Shows only the verbatim messages; records every compose call."""

    def __init__(self, tokens: int | None = None) -> None:
        self.name = "recorder"
        self.calls = 0
        self.tokens = tokens

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        self.calls += 1
        shown = [s for s in scope.history if not session.is_result(s)]
        return finish(self.name, session, scope, budget, shown, visible=(), usage=Usage())


class _Stateful(BasePolicy[str | None]):
    def __init__(self, state: str | None) -> None:
        self.name = "stateful"
        self.state = state

    def prepare(self, session: Session, budget: int) -> str | None:
        return self.state

    def compose(self, session: Session, scope: Scope, budget: int, state: str | None) -> Rendered:
        return finish(self.name, session, scope, budget, [], visible=(), usage=Usage())


def test_every_registered_baseline_is_built_on_the_template():
    for name in method_names():
        policy = build_policy(method_config(name))
        assert isinstance(policy, ContextPolicy), name
        if type(policy).__module__.startswith("contextrender.baselines"):
            assert isinstance(policy, BasePolicy), name


def test_the_template_returns_the_full_history_while_it_fits():
    s = _session()
    full = Scope.of(s).full_tokens(s)
    p = _Recorder()
    out = p.render(s, full)
    assert p.calls == 0 and out.sources == tuple(range(len(s)))
    assert out.visible == frozenset(Scope.of(s).history_results(s))
    out = p.render(s, full - 1)
    assert p.calls == 1 and all(not s.is_result(src) for src in out.sources if src is not None)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_the_template_refuses_a_bad_budget_before_anything_else(bad):
    p = _Recorder()
    with pytest.raises(ValueError, match="budget must be a positive integer"):
        p.render(_session(), bad)
    assert p.calls == 0


def test_stored_state_turns_the_shortcut_off():
    s = _session()
    full = Scope.of(s).full_tokens(s)
    assert len(_Stateful(None).render(s, full).sources) == len(s)  # pristine: the full history
    assert _Stateful("changed").render(s, full).sources == (0, 1)  # system prompt and task only


def test_full_history_and_acon_never_take_the_shortcut():
    assert not FullHistory.full_when_fits and not Acon.full_when_fits
    s = _session()
    full = Scope.of(s).full_tokens(s)
    out = FullHistory().render(s, full // 2)  # above B, unchecked
    assert out.tokens == full and out.sources == tuple(range(len(s)))


def test_compose_ends_in_the_budget_check():
    class Overflowing(_Recorder):
        def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
            return finish(self.name, session, scope, budget, scope.history, visible=(), usage=Usage())

    s = _session()
    with pytest.raises(BudgetExceeded, match="recorder rendered"):
        Overflowing().render(s, Scope.of(s).full_tokens(s) - 1)


# The constructors' messages, as users see them from a config file or an override.
CHECKS = [
    (lambda: SemanticRetrieval(recent_turns=-1), "recent_turns must be an integer ≥ 0, got -1"),
    (lambda: SemanticRetrieval(recent_turns=True), "recent_turns must be an integer ≥ 0, got True"),
    (lambda: SemanticRetrieval(recent_share=1.5), "recent_share must be in [0, 1], got 1.5"),
    (lambda: Compact(summary_share=0.0), "summary_share must be in (0, 1], got 0.0"),
    (lambda: RecencySummary(summary_share=1.0), "summary_share must be in (0, 1), got 1.0"),
    (lambda: TailCompaction(summary_share=1.0), "summary_share must be in (0, 1), got 1.0"),
    (lambda: TailCompaction(tail_share=-0.5), "tail_share must be in [0, 1], got -0.5"),
    (lambda: TailCompaction(reference_context=0), "reference_context must be positive, got 0"),
    (lambda: Acon(history_threshold=-1), "thresholds must be positive (0 = ACON's value for the benchmark)"),
    (lambda: Acon(keep_last_turns=-1), "keep_last_turns must be ≥ 0, got -1"),
    (lambda: Acon(observation_ratio=0.0), "observation_ratio must be in (0, 1], got 0.0"),
    (lambda: ClearToolUses(keep=-1), "keep must be an integer ≥ 0, got -1"),
    (lambda: ClearToolUses(clear_at_least=1.5), "clear_at_least must be an integer ≥ 0, got 1.5"),
    (lambda: InspectEdit(keep_tool_uses=-2), "keep_tool_uses must be an integer ≥ 0, got -2"),
    (lambda: InspectTrim(preserve=2), "preserve must be in [0, 1], got 2"),
    (lambda: OpencodePrune(protect_tokens=-1), "protect_tokens must be an integer ≥ 0, got -1"),
    (lambda: OpencodePrune(minimum_tokens="5"), "minimum_tokens must be an integer ≥ 0, got '5'"),
    (lambda: OpencodePrune(skip_user_turns=-1), "skip_user_turns must be an integer ≥ 0, got -1"),
    (lambda: OpencodePrune(reference_context=-5), "reference_context must be positive, got -5"),
    (lambda: OpenHandsMasking(attention_window=-1), "attention_window must be an integer ≥ 0, got -1"),
    (lambda: OpenHandsSummary(keep_first=-1), "keep_first must be an integer ≥ 0, got -1"),
    (lambda: OpenHandsSummary(max_event_chars=False), "max_event_chars must be an integer ≥ 0, got False"),
    (lambda: SweLastN(n=0), "n must be a positive integer, got 0"),
    (lambda: SweLastN(polling=-1), "polling must be a positive integer, got -1"),
    (lambda: scaled(10, 100, reference_context=0, scale_to_budget=True), "reference_context must be positive, got 0"),
]


@pytest.mark.parametrize("build,message", CHECKS, ids=[m.split(" ")[0] + f"-{i}" for i, (_, m) in enumerate(CHECKS)])
def test_constructor_checks_name_the_argument_and_its_value(build, message):
    with pytest.raises(ValueError) as e:
        build()
    assert str(e.value) == message
