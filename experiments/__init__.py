"""The harness: Hydra entry points, the episode runtime, records, benchmarks, offline evaluation, studies.

The checkout's ``experiments/`` folder, installed as ``contextrender.experiments``:

- ``runtime/``: the runner (resumable jobs), the episode loop, the model layer, the oracle;
- ``records/``: the record schema, the JSONL store and the cost model (docs/method.md §7);
- ``evaluation/``: trace files, Later-Used Result Recall, replay, the hindsight ceiling;
- ``benchmarks/``: BFCL, AppWorld, 8-objective QA (and τ²-bench);
- ``fixtures/``: hand-built scenarios (the paper's dinner bill);
- ``studies/``: one-off studies and benchmarks that drive the harness through its public functions;
- ``run.py``: ``python -m contextrender.experiments.run`` (Hydra), ``paper.py``: the paper's numbers.
"""

if __name__ != "contextrender.experiments":  # the checkout's folder is importable under its own name from the repo root
    raise ImportError(f"import this package as contextrender.experiments, not {__name__} (see docs/design.md, Layout)")
