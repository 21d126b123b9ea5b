"""Replay's cross-trace embedding prefetch changes no number, only time.

The same traces are replayed with every text embedded when a policy asks
(``prefetch=0``), per trace (``prefetch=1``, the default of :func:`replay`) and
all traces at once; results, and every render's messages and visible set,
must be identical. Offline hashing embeddings for many methods and budgets,
and the local MiniLM for the embedding methods at one budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contextrender import CachedEmbedder, ExtractiveCompactor, HashingEmbedder
from contextrender.experiments.evaluation.replay import (
    Shared,
    SharedEmbeddings,
    build_policies,
    likely_embedded_texts,
    replay,
    replay_traces,
)
from contextrender.experiments.evaluation.traces import Episode, read_traces
from contextrender.experiments.studies.bench import generated_episodes

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
FILES = [DATA / "react_traces.jsonl", DATA / "parallel_agent_traces.jsonl", DATA / "tau2" / "scripted_retail.json",
         next((DATA / "taubench").glob("*.json"))]
METHODS = ["prune", "semantic_retrieval", "contextrender", "cr_recency", "cr_relevance", "cr_recency_relevance",
           "contextrender_plus", "openhands_masking", "clear_tool_uses", "full"]
EMBEDDING_METHODS = ["semantic_retrieval", "contextrender", "cr_relevance", "contextrender_plus"]


def big_focus_episode() -> Episode:
    """An assistant message too large for the verbatim share of B: the trim drops it, so the focus
    f_t is not the one prefetch guesses and is embedded on demand, mixed with prefetched texts."""
    def call(i: int, args: str) -> dict:
        return {"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": args}}

    msgs: list[dict] = [{"role": "system", "content": "You look things up."},
                        {"role": "user", "content": "Find order W2378156 and refund item 4242."}]
    for i in range(6):
        text = ("Thinking aloud about every order in detail. " * 120) if i == 4 else f"step {i}"
        msgs.append({"role": "assistant", "content": text, "tool_calls": [call(i, f'{{"q": "W{i}2378156"}}')]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}",
                     "content": json.dumps({"order": f"W{i}2378156", "items": [4242 + i] * 30, "status": "ok"})})
    msgs.append({"role": "assistant", "content": "Refunded."})
    return Episode("big-focus", tuple(msgs), 1, "built:1")


def corpus() -> list[Episode]:
    eps = [e for p in FILES for e in read_traces(p)]
    return eps + generated_episodes(3, seed=5, turns=14) + [big_focus_episode()]


def run(eps, methods, budget, embedder, tmp_path, prefetch, label):
    """Replay through a fresh on-disk cache (every text embedded in this run); result, renders, counts."""
    inner = CachedEmbedder(embedder, tmp_path / f"{label}.sqlite")
    policies, shared = build_policies(methods, embedder=inner, compactor=ExtractiveCompactor())
    renders: list[tuple] = []

    def hook(name, ep, j, session, rendered):
        renders.append((name, ep.task_id, j, json.dumps(rendered.messages, sort_keys=True),
                        tuple(sorted(rendered.visible)), rendered.tokens, rendered.usage.to_dict()))

    res = replay(eps, policies, budget, tmp_path / f"{label}.graph.sqlite", shared=shared, progress=False,
                 on_render=hook, prefetch=prefetch)
    assert isinstance(shared.embedder, SharedEmbeddings)
    return res.to_json(), renders, dict(shared.embedder.counts), inner.misses


@pytest.mark.parametrize("budget", [300, 1000, 2000])
def test_prefetch_changes_nothing_hashing(tmp_path, budget):
    eps = corpus()
    base = run(eps, METHODS, budget, HashingEmbedder(dim=256), tmp_path, 0, "none")
    assert base[2]["prefetched"] == 0 and base[2]["on_demand"] > 0
    for prefetch in (1, 4, len(eps)):
        got = run(eps, METHODS, budget, HashingEmbedder(dim=256), tmp_path, prefetch, f"p{prefetch}")
        assert got[0] == base[0]  # recall, by age, tokens, over-budget counts, measures
        assert got[1] == base[1]  # every render: messages, visible results, tokens, usage
        counts = got[2]
        assert counts["prefetched"] > 0
        # The guess covers what the policies ask for (the big-focus turn is the designed miss)...
        assert counts["on_demand"] <= max(3, 0.02 * counts["prefetched"]), counts
        # ...and embeds little they do not: the model saw about what the no-prefetch run embedded.
        assert got[3] <= base[3] + 0.05 * base[3] + 3, (got[3], base[3])


def test_prefetch_changes_nothing_minilm(tmp_path, local_embedder):
    eps = [e for p in FILES[:3] for e in read_traces(p)] + generated_episodes(2, seed=7, turns=10)
    eps.append(big_focus_episode())
    base = run(eps, EMBEDDING_METHODS, 1000, local_embedder, tmp_path, 0, "none")
    got = run(eps, EMBEDDING_METHODS, 1000, local_embedder, tmp_path, len(eps), "all")
    assert got[2]["prefetched"] > 0
    assert got[0] == base[0] and got[1] == base[1]


def test_replay_traces_prefetch_setting(tmp_path):
    """The file entry point: the default (read ahead all traces) and 0 agree; bad values are refused."""
    def go(prefetch):
        return replay_traces(FILES[:2], 300, ["contextrender", "semantic_retrieval", "prune"],
                             embedder=HashingEmbedder(dim=128), compactor=ExtractiveCompactor(),
                             prefetch=prefetch).to_json()

    assert go(0) == go(2000) == go(1)
    with pytest.raises(ValueError, match="prefetch"):
        go(-1)


def test_default_replay_takes_episodes_one_at_a_time(tmp_path):
    """replay()'s default reads no further ahead than the episode it replays (callers that prepare each
    episode as it is yielded, like the plus study's hindsight ceilings, rely on it)."""
    eps = corpus()[:4]
    log: list[str] = []

    def lazily():
        for e in eps:
            log.append(f"yield {e.task_id}")
            yield e

    policies, shared = build_policies(["contextrender"], embedder=HashingEmbedder(dim=64),
                                      compactor=ExtractiveCompactor())
    replay(lazily(), policies, 300, tmp_path / "g.sqlite", shared=shared, progress=False,
           on_render=lambda name, ep, j, s, r: log.append(f"render {ep.task_id}") if j == 0 else None)
    assert log == [x for e in eps for x in (f"yield {e.task_id}", f"render {e.task_id}")]


def test_budget_leaves_out_queries_of_turns_that_fit():
    ep = big_focus_episode()
    every = likely_embedded_texts(ep)
    few = likely_embedded_texts(ep, budget=10**6)  # everything fits: only the results are needed
    results = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert few == list(dict.fromkeys(results))
    assert set(few) < set(every)
    assert set(likely_embedded_texts(ep, budget=300)) <= set(every)


def test_prewarm_with_no_embedder_is_a_no_op():
    assert Shared().prewarm(corpus()[:2], budget=300) == 0
