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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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
