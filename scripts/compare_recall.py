"""Compare two sets of replay outputs (recall JSON files) method by method: before → after.

    python scripts/compare_recall.py BEFORE_DIR AFTER_DIR --out results/markers/markers.md \
        [--title "..."] [--note "..."]...

Each directory holds ``<trace set>_B<budget>.json`` files written by
``python -m contextrender.experiments.evaluation.replay`` (the same trace files,
budgets and methods on both sides; only the code differs). The table gives,
per trace set and method, the recall at every budget before and after and the
difference in points, and the mean difference per method over all sets.
Used for the omission-marker change (results/markers/README.md
says how the two sides were produced).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

NAME = re.compile(r"^(?P<set>.+)_B(?P<budget>\d+)\.json$")


def load(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    out = {}
    for f in sorted(folder.glob("*_B*.json")):
        m = NAME.match(f.name)
        if m is None:
            continue
        data = json.loads(f.read_text(encoding="utf-8"))
        if "methods" not in data or "budget" not in data:
            raise SystemExit(f"{f}: not a replay output (needs 'budget' and 'methods')")
        if int(data["budget"]) != int(m["budget"]):
            raise SystemExit(f"{f}: file name says B={m['budget']}, the file says B={data['budget']}")
        out[(m["set"], int(m["budget"]))] = data
    if not out:
        raise SystemExit(f"{folder}: no <set>_B<budget>.json replay outputs")
    return out


def compare(before: dict[tuple[str, int], dict[str, Any]], after: dict[tuple[str, int], dict[str, Any]],
            title: str, notes: list[str]) -> str:
    missing = sorted(set(before) ^ set(after))
    if missing:
        raise SystemExit(f"the two sides differ in trace sets/budgets: {missing}")
    sets = list(dict.fromkeys(s for s, _ in sorted(before)))
    budgets = sorted({b for _, b in before})
    lines = [f"## {title}", ""]
    head = "| trace set | traces | events @B=2000 | method | " + " | ".join(f"B={b}: before → after (Δ)" for b in budgets)
    lines += [head + " |", "|---|---:|---:|---|" + "---:|" * len(budgets)]
    deltas: dict[str, list[float]] = defaultdict(list)
    for s in sets:
        ref = before[(s, budgets[min(1, len(budgets) - 1)])]
        for method in ref["methods"]:
            cells = []
            for b in budgets:
                x, y = before[(s, b)]["methods"].get(method), after[(s, b)]["methods"].get(method)
                if x is None or y is None or x.get("recall") is None or y.get("recall") is None:
                    cells.append("–")
                    continue
                if before[(s, b)]["events"] != after[(s, b)]["events"]:
                    raise SystemExit(f"{s} B={b}: the two sides saw different reuse events")
                d = y["recall"] - x["recall"]
                deltas[method].append(d)
                cells.append(f"{x['recall']:.1f} → {y['recall']:.1f} ({d:+.1f})")
            lines.append(f"| {s} | {ref['traces']} | {ref['events']} | {method} | " + " | ".join(cells) + " |")
    lines += ["", "| method | mean Δ recall (points, every set and budget) | min Δ | max Δ |", "|---|---:|---:|---:|"]
    for method, ds in deltas.items():
        lines.append(f"| {method} | {sum(ds) / len(ds):+.2f} | {min(ds):+.1f} | {max(ds):+.1f} |")
    lines += ["", *[f"- {n}" for n in notes]] if notes else []
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="Later-Used Result Recall before → after")
    ap.add_argument("--note", action="append", default=[])
    args = ap.parse_args(argv)
    md = compare(load(args.before), load(args.after), args.title, args.note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
