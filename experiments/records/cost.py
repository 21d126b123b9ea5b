"""The paper's cost model (docs/method.md §7, Eq. 3) and cost comparisons.

    C = ([2(1−ρ) + 0.5ρ]·P + 8·O + 0.13·E) / 1e6    (USD per task)

P, O, E are input, output and embedding tokens over ALL calls of the task
(agent, summariser/compressor, embeddings: :data:`COST_PARTS`). A usage part a
benchmark adds for its own model calls — τ²'s LLM user simulator, ``user`` —
is the environment's spend, not the method's: it is reported apart in the
record, counted by the spend caps (:func:`upper_bound_cost`), and left out of C
and ρ (the paper's setups have no LLM user). ρ is the cache fraction observed
in Full-history runs of the same model × benchmark and is used for every
method. Costs are compared on T, the tasks whose Full-history run exceeded B
before some invocation; normalised cost is a ratio of means.

Eq. 3 is the paper's model and stays, so Table 1 reproduces. What a provider bills is
:func:`billed_cost`: each request from its own cached prefix under a pricing profile (docs/method.md
§14), at a model's prices from litellm's cost map.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from contextrender.billing import Prices, PromptUsage

INPUT_USD_PER_M = 2.0
CACHED_INPUT_USD_PER_M = 0.5
OUTPUT_USD_PER_M = 8.0
EMBEDDING_USD_PER_M = 0.13
#: The usage parts that C covers (docs/method.md §7); any other part (τ²'s ``user``) is spend only.
COST_PARTS = ("agent", "compactor", "embeddings")


def task_cost(input_tokens: int, output_tokens: int, embedding_tokens: int, rho: float) -> float:
    """Eq. 3 for one task (docs/method.md §7)."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"cache fraction rho must be in [0, 1], got {rho}")
    per_input = INPUT_USD_PER_M * (1.0 - rho) + CACHED_INPUT_USD_PER_M * rho
    return (per_input * input_tokens + OUTPUT_USD_PER_M * output_tokens + EMBEDDING_USD_PER_M * embedding_tokens) / 1e6


def record_tokens(rec: Mapping[str, Any], parts: tuple[str, ...] | None = COST_PARTS) -> tuple[int, int, int, int]:
    """(P, O, E, cached) summed over a record's usage parts in C (``parts=None``: every part)."""
    usage = rec["usage"]
    p = o = e = c = 0
    for name, part in usage.items():
        if parts is not None and name not in parts:
            continue
        p += int(part.get("input", 0))
        o += int(part.get("output", 0))
        e += int(part.get("embedding", 0))
        c += int(part.get("cached", 0))
    return p, o, e, c


def cache_fraction(full_records: Iterable[Mapping[str, Any]]) -> float:
    """ρ: cached input tokens / input tokens over Full-history runs (agent calls; docs/method.md §7)."""
    cached = total = 0
    for rec in full_records:
        agent = rec["usage"].get("agent", {})
        cached += int(agent.get("cached", 0))
        total += int(agent.get("input", 0))
    return cached / total if total else 0.0


def record_cost(rec: Mapping[str, Any], rho: float) -> float:
    p, o, e, _ = record_tokens(rec)
    return task_cost(p, o, e, rho)


def upper_bound_cost(rec_usage: Mapping[str, Mapping[str, int]]) -> float:
    """Spend with ρ = 0 — what spend caps use, since ρ is known only after Full runs.

    Over every usage part, a benchmark's own (τ²'s ``user``) included: the
    caps bound money spent. Without such a part it equals C at ρ = 0.
    """
    p, o, e, _ = record_tokens({"usage": rec_usage}, parts=None)
    return task_cost(p, o, e, 0.0)


def comparison_set(full_records: Iterable[Mapping[str, Any]]) -> set[str]:
    """T: task ids whose Full-history run exceeded B before some invocation (docs/method.md §7)."""
    return {r["task"] for r in full_records if r.get("exceeded_budget")}


def mean_cost(records: Iterable[Mapping[str, Any]], tasks: set[str], rho: float) -> float | None:
    """Mean cost over the tasks in T (successes and failures alike)."""
    costs = [record_cost(r, rho) for r in records if r["task"] in tasks]
    return sum(costs) / len(costs) if costs else None


def normalised_cost(method_mean: float | None, full_mean: float | None) -> float | None:
    """mean_m / mean_Full — a ratio of means, not a mean of ratios (docs/method.md §7)."""
    if method_mean is None or not full_mean:
        return None
    return method_mean / full_mean


def relative_change(cr: float | None, other: float | None) -> float | None:
    """Table 1: (CR − m) / m (docs/method.md §7)."""
    if cr is None or other is None or other == 0:
        return None
    return (cr - other) / other


# -- billed cost (docs/method.md §14) ---------------------------------------------------------------------------


def record_billed(rec: Mapping[str, Any], profile: str) -> PromptUsage | None:
    """The agent's requests of one record as billed under ``profile``: each request's prompt and output tokens and the
    cache reads and writes simulated for it (schema 5; docs/method.md §14) — or, for a live run under its provider's own
    profile (``extra.provider_profile``), the figures the provider reported. None for an older record, or one whose
    renders lack the profile. ``none`` is the prompt tokens with nothing cached."""
    renders = rec.get("renders") or []
    if not renders:
        return None
    # A live run billed under its own provider's profile takes the provider's figures (docs/method.md §14).
    own = (rec.get("extra") or {}).get("provider_profile") == profile != "none"
    out = PromptUsage()
    for r in renders:
        if not isinstance(r, Mapping) or r.get("prompt") is None:
            return None
        reported = r.get("provider_cache") if own else None
        if reported:
            prompt, read, write = (int(x) for x in reported)
            out = out + PromptUsage(prompt, min(read, prompt), min(write, max(0, prompt - read)),
                                    int(r.get("output") or 0))
            continue
        read = write = 0
        if profile != "none":
            pair = (r.get("cache") or {}).get(profile)
            if pair is None:
                return None
            read, write = int(pair[0]), int(pair[1])
        out = out + PromptUsage(int(r["prompt"]), read, write, int(r.get("output") or 0))
    return out


def billed_cost(rec: Mapping[str, Any], profile: str, model_prices: Prices,
                embedding_price: float = 0.0) -> float | None:
    """US$ of one record as the provider bills it under ``profile`` at ``model_prices`` (docs/method.md §14): the agent's
    requests from their own cached prefixes, the compaction model's calls as plain input and output (each is a new
    prompt), embeddings at ``embedding_price`` per token (0 for a local embedder). None when the record cannot be
    billed (written before schema 5)."""
    agent = record_billed(rec, profile)
    if agent is None:
        return None
    comp = rec.get("usage", {}).get("compactor", {})
    compactor = PromptUsage(int(comp.get("input", 0)), 0, 0, int(comp.get("output", 0)))
    emb = int(rec.get("usage", {}).get("embeddings", {}).get("embedding", 0))
    return model_prices.cost(agent) + model_prices.cost(compactor) + embedding_price * emb


def cache_hit_share(records: Iterable[Mapping[str, Any]], profile: str) -> float | None:
    """Σ cache reads / Σ prompt tokens of the agent's requests under ``profile`` (None when none can be billed)."""
    read = prompt = 0
    for r in records:
        u = record_billed(r, profile)
        if u is not None:
            read += u.cache_read
            prompt += u.prompt
    return read / prompt if prompt else None
