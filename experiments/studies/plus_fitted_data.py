"""The fitted-profile study's inputs: its trace sets, their train/test split, the harness jobs that
record them, and the replay every stage measures recall with (:mod:`.plus_fitted` describes the study).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contextrender.compaction import make_compactor
from contextrender.embed import make_embedder
from contextrender.experiments.evaluation.ceiling import HindsightCeiling
from contextrender.experiments.evaluation.replay import MemoCompactor, ReplayResult, Shared, SharedEmbeddings, replay
from contextrender.experiments.evaluation.traces import Episode, read_traces
from contextrender.experiments.fixtures.synth import SynthBayes, write_synth
from contextrender.registry import build_policy, method_config

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "results" / "plus_fitted"
#: The profile this study fits and evaluates (conf/method/contextrender_plus_fitted.yaml).
PLUS = "contextrender_plus_fitted"
TRACE_SETS = {
    "bfcl": ROOT / "results/runs/table1/traces/oracle__bfcl_multi_turn_long_context__full__B2000.jsonl",
    "tau2_retail": ROOT / "results/runs/table1/traces/oracle__tau2_retail__full__B2000.jsonl",
    "tau2_airline": ROOT / "results/runs/fullsets/traces/oracle__tau2_airline__full__B2000.jsonl",
    "moqa": ROOT / "results/runs/fullsets/traces/oracle__moqa8_offline__full__B2000.jsonl",
    "synth": OUT / "traces/synth_seed0.jsonl",
    # a second moqa8_offline corpus (seed 1: other entities, other questions), never fitted on
    "moqa_fresh": ROOT / "results/runs/fresh_moqa/traces/oracle__moqa8_offline__full__B2000.jsonl",
}
#: Trace sets the fit may read (their TRAIN halves only). τ²-airline is an evaluation-only domain and
#: moqa_fresh a corpus the fit never saw (generated with another seed): both reported whole.
FIT_SETS = ("bfcl", "tau2_retail", "synth", "moqa")
EVAL_ONLY = ("tau2_airline", "moqa_fresh")
FIT_BUDGETS = (2000,)
EVAL_BUDGETS = (2000,)
#: Budgets the plus is also reported at (held-out, never fitted there), with contextrender and the bounds only.
OTHER_BUDGETS = (1000, 4000)
#: The embedder of every replay here (kind, dimension): the fit's time budget rules out MiniLM.
EMBEDDING = ("hashing", 256)
#: Overrides every harness job of the study starts with (the recorded sets and the oracle rows alike).
HARNESS_DEFAULTS = ("embedding=hashing", "progress=false")

#: name -> its trim order (trim_prose_first). The first is THE ceiling every gap is measured against (the
#: selectors' own trim); the second bounds what any selector with plus's prose-first trim could show.
CEILINGS: dict[str, bool] = {"hindsight ceiling": False, "hindsight ceiling, prose-first trim": True}
CEILING = next(iter(CEILINGS))
#: Reference rows that are not policies either, by name; SET_REFERENCES says which set gets which.
REFERENCES: dict[str, Any] = {"generator-aware causal selector": SynthBayes}
SET_REFERENCES: dict[str, tuple[str, ...]] = {"synth": ("generator-aware causal selector",)}


# -- split ---------------------------------------------------------------------------------

def is_train(task_id: str) -> bool:
    """Deterministic 50/50 split by task id (sha256, independent of order and of the method)."""
    return int(hashlib.sha256(task_id.encode()).hexdigest()[:8], 16) % 2 == 0


# -- the harness, in this process ------------------------------------------------------------

def compose_job(overrides: Sequence[str]) -> Any:
    """The job config ``python -m contextrender.experiments.run <overrides>`` would run, after
    :data:`HARNESS_DEFAULTS` (composed as :mod:`~contextrender.experiments.studies.plus` composes its runs)."""
    from hydra import compose, initialize_config_module

    from contextrender.experiments.catalogue import register_resolver

    register_resolver()  # the experiment files' sweeps name their methods through ${catalogue:...}
    with initialize_config_module(config_module="contextrender.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[*HARNESS_DEFAULTS, *overrides])


def run_harness(overrides: Sequence[str]) -> None:
    """Run one harness job (every task of one benchmark, method and budget) in this process; a rerun resumes.

    The job runs from the checkout, wherever the study was started from: a relative ``run_dir`` (the
    config's default, ``results/runs/<experiment_name>``) lands where :data:`TRACE_SETS` looks, and the
    records name it as ``python -m contextrender.experiments.run`` run from the checkout names it.
    """
    from contextrender.experiments.runtime.runner import run_job

    cfg = compose_job(overrides)
    with contextlib.chdir(ROOT):
        summary = run_job(cfg)
    log.info("%s: %d episodes done (%d run now, %d infrastructure errors to retry)", summary.records,
             summary.done, summary.ran, summary.errors)


def run_harness_jobs(jobs: Sequence[Sequence[str]], workers: int = 1) -> None:
    """Run each job of ``jobs`` (override lists) with :func:`run_harness`: in this process, one after the
    other, or with ``workers`` > 1 that many at a time, each in a worker process of its own (the oracle is
    CPU-bound Python: threads would take turns)."""
    if workers <= 1:
        for over in jobs:
            run_harness(over)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: a forked child would inherit this process's Hydra and logging state mid-use
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(run_harness, [list(over) for over in jobs]))


# -- trace sets ------------------------------------------------------------------------------

def ensure_traces() -> None:
    """Record or generate whichever trace set is missing (a fresh clone has none of them):
    the offline oracle's Full-history runs at B=2000 (the harness's runner), and the synthetic set."""
    if not (TRACE_SETS["bfcl"].is_file() and TRACE_SETS["tau2_retail"].is_file()):
        # the Full runs of `make reproduce-table1` (BFCL long-context and τ²-retail)
        run_harness_jobs([["+experiment=table1", "method=full", f"benchmark={bench}", "budget=2000"]
                          for bench in ("bfcl_multi_turn", "tau2_retail")])
    for name, extra in (("tau2_airline", ["benchmark=tau2_airline", "experiment_name=fullsets"]),
                        ("moqa", ["benchmark=moqa8_offline", "benchmark.n_tasks=200", "experiment_name=fullsets"]),
                        ("moqa_fresh", ["benchmark=moqa8_offline", "benchmark.n_tasks=100", "benchmark.seed=1",
                                        "experiment_name=fresh_moqa"])):
        if not TRACE_SETS[name].is_file():
            run_harness(["method=full", *extra, "budget=2000"])
    if not TRACE_SETS["synth"].is_file():
        write_synth(TRACE_SETS["synth"])


def load_split() -> dict[str, dict[str, list[Episode]]]:
    """Every set split by :func:`is_train`; the evaluation-only sets are test only (train empty)."""
    out: dict[str, dict[str, list[Episode]]] = {}
    for name, path in TRACE_SETS.items():
        eps = list(read_traces(path))
        if name in EVAL_ONLY:
            out[name] = {"train": [], "test": eps}
            continue
        out[name] = {"train": [e for e in eps if is_train(f"{name}:{e.task_id}")],
                     "test": [e for e in eps if not is_train(f"{name}:{e.task_id}")]}
    return out


# -- policies and replay -------------------------------------------------------------------

def _embedder() -> SharedEmbeddings:
    kind, dim = EMBEDDING
    return SharedEmbeddings(make_embedder(kind, dim=dim))


def build(specs: Mapping[str, tuple[str, Mapping[str, Any]]], shared_emb: SharedEmbeddings,
          compactor: MemoCompactor | None = None) -> dict[str, Any]:
    """name -> (method yaml, overrides) built through the Hydra registry (conf/method)."""
    from omegaconf import OmegaConf

    out = {}
    for name, (method, over) in specs.items():
        over = dict(over)
        # Whole mappings (the fit's candidates: tool -> P, tool -> word -> P) replace the config's.
        whole = {k: over.pop(k) for k in ("tool_prior", "call_prior") if k in over}
        cfg = method_config(method, over, label=name)
        for k, v in whole.items():
            OmegaConf.update(cfg, k, dict(v), merge=False)
        out[name] = build_policy(cfg, embedder=shared_emb, compactor=compactor)
    return out


def run_replay(specs: Mapping[str, tuple[str, Mapping[str, Any]]], episodes: Sequence[Episode],
               budget: int, *, with_ceilings: bool = False, references: Sequence[str] = ()) -> ReplayResult:
    """Replay ``episodes`` through the specs with the harness's offline defaults: hashing-256
    embeddings and the extractive compactor (the compaction baselines' summariser and every
    ContextRender variant's oversized-result fallback). ``with_ceilings`` adds the
    :class:`HindsightCeiling` (named as in :data:`CEILINGS`) to the same pass, ``references`` the
    named :data:`REFERENCES`."""
    emb = _embedder()
    comp = MemoCompactor(make_compactor("extractive"))
    policies = build(specs, emb, comp)
    bounds = {name: HindsightCeiling(embedder=emb, trim_prose_first=prose)
              for name, prose in CEILINGS.items()} if with_ceilings else {}
    policies.update(bounds)  # replay hands each one the episode's reuse events first (prepare_episode)
    policies.update({name: REFERENCES[name](embedder=emb) for name in references})

    with tempfile.TemporaryDirectory(prefix="cr-plus-") as tmp:
        return replay(episodes, policies, budget, os.path.join(tmp, "g.sqlite"), shared=Shared(emb, comp),
                      progress=False)


def ceilings(episodes: Sequence[Episode], budget: int) -> ReplayResult:
    """Replay ``episodes`` through the two :class:`HindsightCeiling` bounds only."""
    return run_replay({}, episodes, budget, with_ceilings=True)
