"""render.py's two ends of every render (start_render, fits, seal) and the constructor argument checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contextrender import HashingEmbedder
from contextrender.events import Usage
from contextrender.render import (
    BudgetExceeded,
    Scope,
    assemble,
    check_int,
    check_positive,
    check_share,
    fits,
    seal,
    start_render,
)
from contextrender.selector import ContextRender

from ._helpers import Transcript, filler


def _session():
    t = Transcript(task="Find the invoice of ACME_42.")
    t.call("search", {"q": "ACME_42"}, filler("r1", 40))
    t.user("And its due date?")
    return t.into()


# -- start_render, fits, seal ----------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "100", None])
def test_start_render_refuses_a_bad_budget_before_reading_the_session(bad):
    with pytest.raises(ValueError, match="budget must be a positive integer"):
        start_render(None, bad)  # type: ignore[arg-type]  # never read: the budget fails first


def test_start_render_returns_the_scope_and_keeps_numpy_budgets():
    s = _session()
    assert start_render(s, np.int64(50)) == Scope.of(s)


def test_fits_is_the_full_history_test():
    s = _session()
    scope = Scope.of(s)
    full = scope.full_tokens(s)
    assert fits(s, scope, full) and not fits(s, scope, full - 1)


def test_seal_checks_the_budget_on_what_was_assembled():
    s = _session()
    scope = Scope.of(s)
    assembled = assemble(s, scope, scope.history)
    r = seal("p", 10, assembled, 10, [3], Usage())
    assert r.messages == tuple(assembled.messages) and r.sources == tuple(assembled.sources)
    assert r.tokens == 10 and r.visible == frozenset({3})
    with pytest.raises(BudgetExceeded, match="p rendered 11 history tokens, budget is 10"):
        seal("p", 10, assembled, 11, [], Usage())
    assert seal("full", 10, assembled, 11, [], Usage(), budgeted=False).tokens == 11  # Full history may exceed B


def test_the_selector_starts_with_the_shared_preamble():
    with pytest.raises(ValueError, match="budget must be a positive integer"):
        ContextRender(embedder=HashingEmbedder(dim=16))._stage(_session(), 0, None)


# -- argument checks ---------------------------------------------------------------------------


def test_check_int():
    assert check_int("k", 0) == 0 and check_int("n", 3, minimum=1) == 3
    for bad in (-1, True, 1.0, "2", None):
        with pytest.raises(ValueError, match=r"^k must be an integer ≥ 0, got "):
            check_int("k", bad)
    with pytest.raises(ValueError, match=r"^n must be a positive integer, got 0$"):
        check_int("n", 0, minimum=1)
    with pytest.raises(ValueError, match=r"^k must be an integer ≥ 2, got 1$"):
        check_int("k", 1, minimum=2)
    with pytest.raises(ValueError, match=r"got '2'$"):  # the value is shown as repr: a string is visible
        check_int("k", "2")


@pytest.mark.parametrize("zero,one,bounds,ok,bad", [
    (True, True, "[0, 1]", (0.0, 0.5, 1.0), (-0.1, 1.1)),
    (False, True, "(0, 1]", (0.5, 1.0), (0.0, -1.0, 1.5)),
    (True, False, "[0, 1)", (0.0, 0.5), (1.0, 2.0)),
    (False, False, "(0, 1)", (0.5,), (0.0, 1.0)),
])
def test_check_share(zero, one, bounds, ok, bad):
    for v in ok:
        assert check_share("s", v, allow_zero=zero, allow_one=one) == v
    for v in (*bad, math.nan):
        with pytest.raises(ValueError) as e:
            check_share("s", v, allow_zero=zero, allow_one=one)
        assert str(e.value) == f"s must be in {bounds}, got {v}"


def test_check_positive():
    assert check_positive("r", 1) == 1 and check_positive("k", 0, allow_zero=True) == 0
    with pytest.raises(ValueError) as e:
        check_positive("r", 0)
    assert str(e.value) == "r must be positive, got 0"
    with pytest.raises(ValueError) as e:
        check_positive("k", -2, allow_zero=True)
    assert str(e.value) == "k must be ≥ 0, got -2"
