"""The tabular form (contextrender.tabular): lossless, shorter, and read back exactly."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextrender.tabular import MAX_DEPTH, TabularError, tabulate, untabulate
from contextrender.tokens import TokenCounter

# Strings that stress the bare/quoted rule: separators, quotes, literals, numbers, outer spaces, newlines.
_TRICKY = st.sampled_from(["", " ", "a b", " lead", "trail ", "true", "null", "1e5", "-3", "NaN", "Infinity",
                           "a|b", "a,b", "[x]", "{y}", 'q"uote', "back\\slash", "line\nbreak", "tab\tx", "-",
                           "- item", "k: v", "a.b", "#W123", "é ü", "0012", ".5", "x:", "{}", "[]"])
_TEXT = st.one_of(_TRICKY, st.text(max_size=12))
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 12, 10 ** 12),
                    st.floats(allow_nan=False, allow_infinity=False), _TEXT)
_JSON = st.recursive(_SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=25)


def _records(n: int) -> st.SearchStrategy:
    """n dicts of one shape (the case tables are for), with nested dicts and scalar lists."""
    shape = st.dictionaries(_TEXT, st.sampled_from(["s", "d", "l"]), min_size=1, max_size=4)

    def build(sh: dict[str, str]) -> st.SearchStrategy:
        def one() -> st.SearchStrategy:
            return st.fixed_dictionaries({k: (_SCALAR if kind == "s" else st.lists(_SCALAR, max_size=3) if kind == "l"
                                              else st.fixed_dictionaries({"x": _SCALAR, "y.z": _SCALAR}))
                                          for k, kind in sh.items()})
        return st.lists(one(), min_size=n, max_size=n)
    return shape.flatmap(build)


def _same(a: object, b: object) -> bool:
    """Equal as JSON values (floats compared exactly; -0.0 == 0.0 as JSON writes them)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.lists(_JSON, min_size=1, max_size=4), st.dictionaries(_TEXT, _JSON, min_size=1, max_size=4)))
def test_round_trips_any_json(value: object) -> None:
    form = tabulate(json.dumps(value))
    assert form is not None
    assert _same(untabulate(form), value), form


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(2, 5).flatmap(_records), key=_TEXT, keyed=st.booleans())
def test_round_trips_tables(rows: list[dict], key: str, keyed: bool) -> None:
    value: object = {key: rows}
    if keyed:  # a dict of records keyed by a field each record holds (the {c} table)
        ids = [f"id{i}" for i in range(len(rows))]
        value = {key: {i: {"item_id": i, **r} for i, r in zip(ids, rows, strict=True)}}
    form = tabulate(json.dumps(value))
    assert form is not None
    assert _same(untabulate(form), value), form


def test_a_product_catalogue_is_one_table_with_each_id_once() -> None:
    variants = {str(9690244451 + k): {"item_id": str(9690244451 + k),
                                      "options": {"switch type": "clicky", "backlight": "RGB", "size": f"{60 + k}%"},
                                      "available": k % 2 == 0, "price": 200.5 + k} for k in range(12)}
    product = {"name": "Mechanical Keyboard", "product_id": "1656367028", "variants": variants}
    text = json.dumps(product)
    form = tabulate(text)
    assert form is not None
    lines = form.splitlines()
    assert lines[:3] == ['name: Mechanical Keyboard', 'product_id: "1656367028"',
                         "variants{item_id}: item_id|options.switch type|options.backlight|options.size|available|price"]
    assert lines[3] == '  "9690244451"|clicky|RGB|60%|true|200.5'
    assert len(lines) == 3 + 12
    for item_id in variants:
        assert form.count(item_id) == 1  # the dict key is not written again
    assert untabulate(form) == product
    c = TokenCounter()
    assert c.text(form) < 0.6 * c.text(text)


def test_a_list_of_records_and_a_top_level_array() -> None:
    flights = [{"flight_number": f"HAT0{k}", "origin": "JFK", "date": "2024-05-01", "price": 100 + k} for k in range(3)]
    form = tabulate(json.dumps({"reservation_id": "4WQ150", "flights": flights}))
    assert form == ('reservation_id: 4WQ150\nflights[3]: flight_number|origin|date|price\n'
                    '  HAT00|JFK|2024-05-01|100\n  HAT01|JFK|2024-05-01|101\n  HAT02|JFK|2024-05-01|102')
    top = tabulate(json.dumps(flights))
    assert top is not None and top.startswith("[3]: flight_number|origin|date|price\n")
    assert untabulate(top) == flights


@pytest.mark.parametrize("text", ["", "plain text", "42", '"a string"', "[]", "{}", "{not json", "[1, 2"])
def test_only_non_empty_json_containers_have_a_form(text: str) -> None:
    assert tabulate(text) is None


@pytest.mark.parametrize("form, where", [("a: 1\n   b: 2", "line 2"), ("a:\nb: 1", "line 1"),
                                         ("t[2]: x|y\n  1|2", "line 1"), ("t[1]: x|y\n  1|2|3", "line 2"),
                                         ('a: "open', "line 1")])
def test_a_malformed_form_names_the_line(form: str, where: str) -> None:
    with pytest.raises(TabularError, match=where):
        untabulate(form)


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_real_tau2_results_round_trip_and_shrink(domain: str) -> None:
    """The τ² package's own tool responses (its database, its get_response) round-trip, and a retail
    product's details shrink most (its variants are one keyed table)."""
    from contextrender.experiments.benchmarks.tau2.environment import new_environment, tau2

    env = new_environment(domain)
    db = env.tools.db
    calls = ([("get_product_details", {"product_id": p}) for p in list(db.products)[:10]]
             + [("get_order_details", {"order_id": o}) for o in list(db.orders)[:10]]
             + [("get_user_details", {"user_id": u}) for u in list(db.users)[:10]]) if domain == "retail" else (
        [("get_reservation_details", {"reservation_id": r}) for r in list(db.reservations)[:10]]
        + [("get_user_details", {"user_id": u}) for u in list(db.users)[:10]])
    c = TokenCounter()
    ratios: dict[str, list[float]] = {}
    for i, (name, args) in enumerate(calls):
        call = tau2().message.ToolCall(id=f"c{i}", name=name, arguments=args, requestor="assistant")
        text = env.get_response(call).content
        form = tabulate(text)
        assert form is not None, (name, text[:80])
        assert untabulate(form) == json.loads(text)
        ratios.setdefault(name, []).append(c.text(form) / c.text(text))
    assert all(max(r) < 1.0 for r in ratios.values()), ratios
    if domain == "retail":
        assert max(ratios["get_product_details"]) < 0.6


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 5000])
def test_deep_nesting_has_no_form_and_never_raises(depth: int) -> None:
    """A result nested deeper than the writer follows is left as it is (json.loads itself gives up at ~1,000
    levels); a form nested that deep is a clear TabularError, not a RecursionError."""
    assert tabulate("[" * depth + "1" + "]" * depth) is None
    assert tabulate('{"a": ' * depth + "1" + "}" * depth) is None
    deep = "\n".join("  " * i + "a:" for i in range(3000)) + "\n" + "  " * 3000 + "a: 1"
    with pytest.raises(TabularError, match="nested deeper"):
        untabulate(deep)


def test_nesting_up_to_the_limit_round_trips() -> None:
    value: object = 1
    for i in range(MAX_DEPTH - 1):
        value = {"k": value} if i % 2 else [value, 2]
    wrapped = {"root": value}
    form = tabulate(json.dumps(wrapped))
    assert form is not None and untabulate(form) == wrapped
