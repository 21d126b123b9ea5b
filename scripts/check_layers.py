"""Imports run one way: entry points → analysis → harness → policies → core; service → policies → core.

Run by ``make check``. Every module of the package (the checkout's folders
map to subpackages: ``baselines/`` → ``contextrender.baselines``,
``experiments/`` → ``contextrender.experiments``, ``analysis/`` →
``contextrender.analysis``) is parsed, and every import of a project module —
at module level or inside a function — is checked against the layer table
below. A module may import its own layer and the layers beneath it; the
service and the harness are side by side and may not import each other.
Exits 1 and lists each violation as ``file:line: importer -> imported``.

``--graph PATH`` also draws what it found, one picture of the layers and the imports between them
(``docs/import_graph.svg``, rewritten by ``make check``; a test keeps the committed one current): grep
and static import readers cannot see that ``analysis/`` imports the harness, because the folders are
imported under names that differ from their paths.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"contextrender": "contextrender", "baselines": "contextrender.baselines",
           "experiments": "contextrender.experiments", "analysis": "contextrender.analysis"}

#: (module prefix, layer, rank). The longest matching prefix decides; ranks only go down.
LAYERS: list[tuple[str, str, int]] = [
    ("contextrender", "core", 0),
    ("contextrender.selector", "policies", 1),
    ("contextrender.plus", "policies", 1),
    ("contextrender.cache_aware", "policies", 1),
    ("contextrender.registry", "policies", 1),
    ("contextrender.baselines", "policies", 1),
    ("contextrender.explain", "policies", 1),
    ("contextrender.view", "policies", 1),
    ("contextrender.service", "service", 2),
    ("contextrender.adapters", "service", 2),
    ("contextrender.wrapper", "service", 2),
    ("contextrender.experiments", "harness", 2),
    ("contextrender.analysis", "analysis", 3),
    ("contextrender.experiments.studies", "entry", 4),
    ("contextrender.cli", "entry", 4),
    ("contextrender.__main__", "entry", 4),
]
#: Layers of the same rank that must not import each other.
SIDE_BY_SIDE = {frozenset({"service", "harness"})}
#: The package's own __init__ re-exports the public API: core, policies and (lazily) the wrapper.
REEXPORTS = {"contextrender": frozenset({"core", "policies", "service"})}


def layer_of(module: str) -> tuple[str, int]:
    best = ("", "", -1)
    for prefix, name, rank in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[0]):
            best = (prefix, name, rank)
    return best[1], best[2]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    base = FOLDERS[rel.parts[0]]
    parts = [base, *rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(p for p in parts if p).replace("contextrender.contextrender", "contextrender")


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # `from pkg import submodule` names a module too
                out.append((node.lineno, f"{target}.{a.name}" if target else a.name))
    return [(line, t) for line, t in out if t == "contextrender" or t.startswith("contextrender.")]


def edges() -> dict[tuple[str, str], int]:
    """(importer layer, imported layer) → number of imports, over every module (self-edges left out)."""
    out: dict[tuple[str, str], int] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = module_name(path)
            if module in REEXPORTS:
                continue  # the package's public re-exports (lazy ones included) are not a dependency
            src = layer_of(module)[0]
            for _line, target in imports(path, module):
                dst = layer_of(target)[0]
                if dst and src and dst != src:
                    out[(src, dst)] = out.get((src, dst), 0) + 1
    return out


#: Where each layer sits in the picture (x, y): entry points on top, the core at the bottom.
POSITIONS = {"entry": (0.5, 4.0), "analysis": (0.2, 3.0), "harness": (0.2, 2.0), "service": (0.8, 2.0),
             "policies": (0.5, 1.0), "core": (0.5, 0.0)}
#: What each layer holds, under its name in the picture.
LAYER_TEXT = {"entry": "cli, studies", "analysis": "analysis/  (contextrender.analysis)",
              "harness": "experiments/  (contextrender.experiments)",
              "service": "service, wrapper, adapters", "policies": "selector, plus, cache_aware, registry, baselines/",
              "core": "graph, tfa, render, readiness, ..."}


def draw(path: Path) -> None:
    """The layers and the imports between them as an SVG, byte-identical for the same imports."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "contextrender-layers"  # stable element ids
    found = edges()
    fig, ax = plt.subplots(figsize=(7.5, 6.2))
    ax.set_xlim(-0.1, 1.1)
    ax.set_ylim(-0.6, 4.6)
    for (src, dst), n in sorted(found.items()):
        (x0, y0), (x1, y1) = POSITIONS[src], POSITIONS[dst]
        # an edge that skips a level bends around the boxes between it, on its own side
        side = 1.0 if (x0 + x1) / 2 <= 0.5 else -1.0
        rad = 0.0 if y0 - y1 <= 1 else side * 0.3
        a, b = (x0, y0 - 0.25), (x1, y1 + 0.25)
        ax.annotate("", xy=b, xytext=a,
                    arrowprops={"arrowstyle": "->", "color": "0.45", "lw": 0.8 + 0.15 * min(n, 20) ** 0.5,
                                "connectionstyle": f"arc3,rad={rad}", "shrinkA": 2, "shrinkB": 2})
        # the label at the curve's middle (arc3's control point, in display coordinates)
        (px, py), (qx, qy) = ax.transData.transform([a, b])
        mx, my = (px + qx) / 2 + 0.5 * rad * (qy - py), (py + qy) / 2 - 0.5 * rad * (qx - px)
        lx, ly = ax.transData.inverted().transform((mx, my))
        ax.text(lx, ly, str(n), fontsize=7, color="0.25", ha="center", va="center",
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none"})
    for name, (x, y) in POSITIONS.items():
        ax.text(x, y, f"{name}\n{LAYER_TEXT[name]}", ha="center", va="center", fontsize=8.5,
                bbox={"boxstyle": "round,pad=0.4", "fc": "#eef3fb", "ec": "#4a6fa5"})
    ax.axis("off")
    ax.set_title("Imports between layers (arrows: importer → imported, with counts); "
                 "scripts/check_layers.py", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def check() -> list[str]:
    problems = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = module_name(path)
            src_layer, src_rank = layer_of(module)
            allowed = REEXPORTS.get(module)
            for line, target in imports(path, module):
                dst_layer, dst_rank = layer_of(target)
                if module != "contextrender" and (target.startswith(module + ".") or module.startswith(target + ".")):
                    continue  # a package and its own submodules (the root package is checked: it re-exports)
                if allowed is not None:
                    bad = dst_layer not in allowed
                else:
                    bad = dst_rank > src_rank or (dst_rank == src_rank and dst_layer != src_layer
                                                  and frozenset({src_layer, dst_layer}) in SIDE_BY_SIDE)
                if bad:
                    problems.append(f"{path.relative_to(ROOT)}:{line}: {module} ({src_layer}) -> "
                                    f"{target} ({dst_layer})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--graph"] and len(args) == 2:
        draw(ROOT / args[1])
    elif args:
        print("usage: check_layers.py [--graph PATH]", file=sys.stderr)
        return 2
    problems = check()
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} import(s) against the layer order (scripts/check_layers.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
