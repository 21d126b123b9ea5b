"""The contextrender_plus study's machinery: split, synthetic traces, hindsight ceilings."""

from __future__ import annotations

import pytest

from experiments import plus_eval as pe
from experiments.recall import reuse_events
from experiments.traces import read_traces


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "synth.jsonl"
    pe.write_synth(path, n=6, seed=3)
    return list(read_traces(path))


def test_split_is_deterministic_and_balanced():
    ids = [f"synth:synth-{i:04d}" for i in range(400)]
    first = [pe.is_train(i) for i in ids]
    assert first == [pe.is_train(i) for i in reversed(ids)][::-1]
    assert 0.4 < sum(first) / len(first) < 0.6


def test_synthetic_traces_have_long_range_reuse(episodes):
    ages = [e.age for ep in episodes for e in reuse_events(list(ep.messages))]
    assert ages and max(ages) > 10


@pytest.mark.parametrize("budget", [600, 1500])
def test_hindsight_ceiling_bounds_every_policy(episodes, budget):
    specs = {"contextrender": ("contextrender", {}), "contextrender_plus": ("contextrender_plus", {}),
             "prune": ("prune", {}), "semantic_retrieval": ("semantic_retrieval", {})}
    res = pe.run_replay(specs, episodes, budget)
    ceil = pe.ceilings(episodes, budget)
    paper, terse = (ceil.methods[k] for k in pe.CEILINGS)
    assert paper.over_budget == 0 and terse.over_budget == 0
    assert paper.stats.hits <= terse.stats.hits  # terse markers only add room
    for name, t in res.methods.items():
        assert t.stats.events == paper.stats.events
        bound = terse if name == "contextrender_plus" else paper
        assert t.stats.hits <= bound.stats.hits, name
    assert paper.stats.hits < paper.stats.events  # at these budgets not everything can be shown
