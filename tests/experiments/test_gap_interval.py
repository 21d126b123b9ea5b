"""The gap share's interval: a paired bootstrap over traces (experiments/evaluation/ceiling.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from contextrender import ExtractiveCompactor, HashingEmbedder
from contextrender.experiments.evaluation.ceiling import gap_covered, gap_interval, gap_traces
from contextrender.experiments.evaluation.replay import markdown_table, replay_traces, write_json
from contextrender.experiments.evaluation.traces import write_trace


def test_a_method_that_covers_half_of_every_traces_gap_has_a_point_interval():
    ref = [0, 2, 4, 1] * 5
    top = [r + 4 for r in ref]
    half = [r + 2 for r in ref]
    assert gap_interval(half, ref, top) == (50.0, 50.0)


def test_the_interval_holds_the_point_estimate_and_narrows_with_more_traces():
    rng = np.random.default_rng(1)
    ref = rng.integers(0, 5, 30)
    top = ref + rng.integers(0, 6, 30)
    hits = ref + rng.binomial(top - ref, 0.6)
    point = gap_covered(float(hits.sum()), float(ref.sum()), float(top.sum()))
    lo, hi = gap_interval(hits, ref, top)
    assert lo < point < hi and hi - lo > 5.0  # 30 traces of a noisy share: a real spread
    lo4, hi4 = gap_interval(np.tile(hits, 4), np.tile(ref, 4), np.tile(top, 4))
    assert lo4 < point < hi4 and (hi4 - lo4) < 0.7 * (hi - lo)  # 4× the traces: about half the width
    assert gap_interval(hits, ref, top) == (lo, hi)  # seeded: the same interval every run
    assert gap_interval(hits, ref, top, seed=2) != (lo, hi)


def test_no_interval_unless_ten_traces_hold_some_of_the_gap():
    """Fewer than GAP_CI_MIN_TRACES traces with a gap are too few clusters for the level to hold
    (scripts/gap_interval_coverage.py): None, however many traces there are."""
    assert gap_interval([1] * 9, [0] * 9, [2] * 9) is None  # under 10 traces at all
    for k, given in ((9, False), (10, True)):
        ref = [5] * 100
        top = [7] * k + [5] * (100 - k)
        hits = [6] * k + [5] * (100 - k)
        assert gap_traces(ref, top) == k
        assert (gap_interval(hits, ref, top) is not None) is given, k
        assert gap_interval(hits, ref, top, min_traces=k) is not None  # the rule is the parameter
    # one trace in 40 has the whole gap: most draws miss it, so most have no gap at all
    ref = [3] * 40
    top = [3] * 39 + [5]
    assert gap_interval([3] * 39 + [4], ref, top, min_traces=1) is None
    with pytest.raises(ValueError, match="one count per trace"):
        gap_traces([1, 2], [1])
    with pytest.raises(ValueError, match="one count per trace"):
        gap_interval([1] * 12, [0] * 12, [2] * 11)
    with pytest.raises(ValueError, match="level"):
        gap_interval([1] * 12, [0] * 12, [2] * 12, level=1.0)


def _call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _lookups(path: Path, n: int) -> None:
    """Traces whose early lookups are reused after bulky later results: a tight B misses some of them."""
    for k in range(n):
        msgs: list[dict] = [{"role": "user", "content": f"Update the accounts of customer {k}."}]
        for i in range(3 + k % 4):
            cid = f"u{k}_{i}"
            msgs += [{"role": "assistant", "content": None,
                      "tool_calls": [_call(cid, "get_account", {"account": f"ACC_{k}X{i}Q"})]},
                     {"role": "tool", "tool_call_id": cid,
                      "content": f"account ACC_{k}X{i}Q owner OWN_{k}Y{i}Z " + "history " * (30 + 25 * (i % 3))}]
        for i in range(3 + k % 4):
            cid = f"w{k}_{i}"
            msgs += [{"role": "assistant", "content": None,
                      "tool_calls": [_call(cid, "update_owner", {"owner": f"OWN_{k}Y{i}Z"})]},
                     {"role": "tool", "tool_call_id": cid, "content": "ok"}]
        msgs.append({"role": "assistant", "content": "Done."})
        write_trace(path, f"lookups_{k}", msgs)


def test_replay_reports_each_gap_share_with_its_interval(tmp_path):
    path = tmp_path / "lookups.jsonl"
    _lookups(path, 24)
    res = replay_traces(path, 350, ["contextrender", "semantic_retrieval"], embedder=HashingEmbedder(dim=64),
                        compactor=ExtractiveCompactor())
    for t in [*res.methods.values(), res.ceiling]:
        assert len(t.hits_per_trace) == res.traces == 24 and sum(t.hits_per_trace) == t.stats.hits
    # the same trace order for every tally: the ceiling covers at least as much on each trace
    for name, t in res.methods.items():
        assert all(c >= h for c, h in zip(res.ceiling.hits_per_trace, t.hits_per_trace, strict=True)), name
    assert res.gap_trace_count() == gap_traces(res.methods["contextrender"].hits_per_trace, res.ceiling.hits_per_trace)
    assert res.gap_trace_count() >= 10
    gaps, cis = res.gap_covered(), res.gap_intervals()
    assert gaps is not None and cis is not None and gaps["semantic_retrieval"] is not None
    lo, hi = cis["semantic_retrieval"]
    assert lo <= gaps["semantic_retrieval"] <= hi and lo < hi
    j = res.to_json()
    assert j["gap_covered"]["interval"]["methods"]["semantic_retrieval"] == [lo, hi]
    assert j["gap_covered"]["interval"]["level"] == 0.95
    assert (j["gap_covered"]["interval"]["gap_traces"], j["gap_covered"]["interval"]["min_traces"]) == (
        res.gap_trace_count(), 10)
    few = replay_traces(path, 350, ["contextrender", "semantic_retrieval"], embedder=HashingEmbedder(dim=64),
                        compactor=ExtractiveCompactor(), limit=6)
    assert few.gap_intervals() == {"semantic_retrieval": None} and few.gap_trace_count() < 10
    assert f"The gap lies in {few.gap_trace_count()} trace" in markdown_table(few)
    assert j["methods"]["contextrender"]["hits_per_trace"] == res.methods["contextrender"].hits_per_trace
    assert f"semantic_retrieval {gaps['semantic_retrieval']:.0f} % (95 % CI {lo:.0f} to {hi:.0f} %)" in markdown_table(res)


def test_written_json_keeps_number_lists_on_one_line_and_every_value_intact(tmp_path):
    """Per-trace hits make long lists: write_json puts a list of numbers on one line, and nothing else
    changes — strings that look like lists, nested lists, booleans, NaN."""
    obj = {"hits_per_trace": [3, 0, 12], "interval": [-4.5, 1e-05], "empty": [], "nested": [[1, 2], [3]],
           "text": "[1,2]", "multiline": "[\n1,\n2\n]", "mixed": [True, 1, None], "inf": [float("inf"), 2],
           "negatives then null": [-1] * 60 + [None]}  # the case a "-?" before the class made exponential
    path = tmp_path / "r.json"
    write_json(path, obj)
    text = path.read_text(encoding="utf-8")
    assert json.loads(text) == obj
    assert '"hits_per_trace": [3, 0, 12]' in text and '"interval": [-4.5, 1e-05]' in text
    assert '"text": "[1,2]"' in text and '"mixed": [\n' in text
