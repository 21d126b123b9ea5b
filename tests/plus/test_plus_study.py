"""The plus study's verdict rule (experiments/studies/plus.py): which switch stays is read from the numbers."""

from __future__ import annotations

from contextrender.experiments.studies import plus as study


def _cells(plus: float, **variants: float) -> dict:
    return {"oracle": {study.PLUS: {"pass": plus}, **{k: {"pass": v} for k, v in variants.items()}}}


def test_slugs_name_each_variant_once_and_as_records_do() -> None:
    slugs = [study.slug(v) for v in study.VARIANTS]
    assert slugs[0] == study.PLUS and len(set(slugs)) == len(slugs)
    assert study.slug("plus −id forms") == "plus_no_id_forms"
    assert study.slug("plus +lexical (W_lex 1)") == "plus_with_lexical"


def test_a_switch_stays_when_turning_it_off_loses_tasks_and_goes_when_it_helps() -> None:
    off_ids, off_tab, with_lex = "plus −id forms", "plus −tabular", "plus +lexical (W_lex 1)"
    runs = {"tau2_retail": _cells(96.5, **{off_ids: 80.0, off_tab: 96.5, with_lex: 97.4})}
    ready = {"tau2_retail": {study.PLUS: {"call_readiness": 90.0}, off_ids: {"call_readiness": 70.0},
                             off_tab: {"call_readiness": 90.0}, with_lex: {"call_readiness": 91.0}}}
    v = study.verdicts(runs, ready)
    assert v[off_ids]["verdict"] == "keep" and round(v[off_ids]["delta_pass_sum"], 1) == -16.5
    assert v[off_tab]["verdict"] == "no effect here"
    assert v[with_lex]["verdict"] == "drop?"  # flipping the default did better: the report says so
    text = study.report(runs, ready, v)
    assert "kept): −id forms" in text and "+lexical" in text.split("did as well or better here:")[1]


def test_equal_pass_but_lower_readiness_keeps_the_switch() -> None:
    off = "plus −packing"
    runs = {"bfcl": _cells(100.0, **{off: 100.0})}
    ready = {"bfcl": {study.PLUS: {"call_readiness": 99.0}, off: {"call_readiness": 97.5}}}
    assert study.verdicts(runs, ready)[off]["verdict"] == "keep"


def test_a_variant_without_records_is_not_run_not_without_effect() -> None:
    runs = {"tau2_retail": _cells(96.5)}
    v = study.verdicts(runs, {})
    assert {x["verdict"] for x in v.values()} == {"not run"}
    assert "Not run yet (no records)" in study.report(runs, {}, v)
