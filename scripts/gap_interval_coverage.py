"""How often the gap share's "95 %" interval holds the true share, by how many traces hold the gap.

The reason ``gap_interval`` gives no interval below ``GAP_CI_MIN_TRACES`` traces that hold some of the gap
(docs/design.md, "How sure a gap share is"). Simulated trace sets of 50 traces: in ``k`` of them the ceiling covers
1–4 more events than the reference, and the method covers each of those with probability ``p`` (its true
share of the gap); the other traces have no gap. Prints the share of runs whose interval holds ``p``.

    .venv/bin/python scripts/gap_interval_coverage.py [--runs 400]
"""

from __future__ import annotations

import argparse

import numpy as np

from contextrender.experiments.evaluation.ceiling import gap_interval


def coverage(k: int, p: float, runs: int, n: int = 50, seed: int = 7) -> tuple[int, float]:
    """(runs with an interval, % of them whose interval holds 100·p), with every interval allowed."""
    rng = np.random.default_rng([seed, k, int(1000 * p)])
    held = given = 0
    for run in range(runs):
        ref = rng.integers(0, 10, n)
        room = np.zeros(n, dtype=np.int64)
        room[:k] = rng.integers(1, 5, k)
        gain = rng.binomial(room, p)
        ci = gap_interval(ref + gain, ref, ref + room, draws=1000, seed=run, min_traces=1)
        if ci is not None:
            given += 1
            held += ci[0] <= 100.0 * p <= ci[1]
    return given, 100.0 * held / max(given, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=400)
    a = ap.parse_args()
    print("| traces holding the gap (of 50) | true share | runs with an interval | coverage % |")
    print("|---:|---:|---:|---:|")
    for k in (3, 6, 10, 20, 40):
        for p in (0.6, 0.85):
            given, cov = coverage(k, p, a.runs)
            print(f"| {k} | {100 * p:.0f} % | {given} | {cov:.1f} |", flush=True)


if __name__ == "__main__":
    main()
