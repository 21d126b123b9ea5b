"""The OPTIONAL fitted profile of contextrender_plus (NOT the paper's method, and not the plus's default):
how ``conf/method/contextrender_plus_fitted.yaml`` was fitted and evaluated — results/plus_fitted/plus.md.

The default contextrender_plus names no tool and learns from the user's own graph file
(:mod:`~contextrender.experiments.studies.plus`); this profile carries per-tool and call priors fitted on
this project's benchmarks, which do nothing for another agent's tools. It is kept to reproduce those
figures. (The committed results/plus_fitted/ files were written when this profile was the plus itself:
their method key ``contextrender_plus`` is this profile.)

    make plus-fitted  (= python -m contextrender.experiments.studies.plus_fitted)   # every stage
    python -m contextrender.experiments.studies.plus_fitted --stage fit      # traces, split, fit on TRAIN only
    python -m contextrender.experiments.studies.plus_fitted --stage select   # prior_min_age: TRAIN recall + task ids
    python -m contextrender.experiments.studies.plus_fitted --stage eval     # recall on held-out traces + ceiling
    python -m contextrender.experiments.studies.plus_fitted --stage oracle   # oracle task score at B=2000
    python -m contextrender.experiments.studies.plus_fitted --stage report   # plus.md, plus.json, plus.png

Trace sets (Full-history transcripts of the offline oracle at B=2000, recorded by the harness's runner,
in this process, when missing; recall is docs/method.md §7's, computed by
contextrender.experiments.evaluation.replay):
- ``bfcl``, ``tau2_retail``: results/runs/table1/traces (the Full runs of ``make reproduce-table1``);
- ``tau2_airline``, ``moqa``: results/runs/fullsets/traces (τ²-airline's 50 tasks; 200 moqa8_offline tasks);
- ``synth``: synthetic support/ops-agent transcripts with long-range reuse, generated with a fixed
  seed (:func:`~contextrender.experiments.fixtures.synth.synth_episode`). WRITTEN BY THE SAME AUTHOR AS
  THE METHOD: weaker evidence than the recorded sets, reported separately.

Each set is split by task id with a deterministic hash (:func:`~.plus_fitted_data.is_train`, 50/50), except
τ²-airline, an evaluation-only domain reported whole. The per-tool reuse prior, the call prior
(P(tool, word of the call)) and the grid (W_prior, W_lex) are fitted on the TRAIN halves of
:data:`~.plus_fitted_data.FIT_SETS` only (BFCL, τ²-retail, synth, moqa8_offline); the fitted values are carried by
conf/method/contextrender_plus_fitted.yaml (the eval stage refuses to run if it differs from
results/plus_fitted/fit.json). ``prior_min_age`` is then chosen with
the fitted values fixed (:func:`~.plus_fitted_fit.select_min_age`): the largest TRAIN recall among the choices whose
oracle pass^1 on τ²-retail's TRAIN task ids is not below contextrender's. Held-out traces are
replayed once, after fitting, with one ablation per switch.

Each replay also reports the hindsight ceiling (:class:`~contextrender.experiments.evaluation.ceiling.HindsightCeiling`, not a policy): the
most reused results any selector with the same scope, verbatim trim and markers could have
shown; "gap covered" is (plus − contextrender) / (ceiling − contextrender). The synthetic set also
gets a causal reference (:class:`~contextrender.experiments.fixtures.synth.SynthBayes`): a selector that knows the generator's own reuse
probabilities but nothing of the future — what any selector that sees only the past can expect there.

Where each part lives (sibling modules, so the installed package needs no new subpackage):

- :mod:`~contextrender.experiments.fixtures.synth`: the synthetic set's generator and its causal reference;
- :mod:`.plus_fitted_data`: the trace sets, the split, the harness jobs that record them, the replay;
- :mod:`.plus_fitted_fit`: the priors, the grid, ``prior_min_age``, the config check;
- :mod:`.plus_fitted_evaluate`: the held-out replays and the gap shares read from them;
- :mod:`.plus_fitted_oracle`: the oracle's task score, every job run by the harness's runner in this process;
- :mod:`.plus_fitted_report`: plus.md (its notes generated from the data) and plus.png;
- this module: the stages, in order.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence

from contextrender import offline
from contextrender.experiments.evaluation.replay import write_json
from contextrender.experiments.studies.plus_fitted_data import OUT, ensure_traces, load_split
from contextrender.experiments.studies.plus_fitted_evaluate import evaluate, evaluate_other_budgets
from contextrender.experiments.studies.plus_fitted_fit import check_config, config_block, fit, select_min_age
from contextrender.experiments.studies.plus_fitted_oracle import oracle
from contextrender.experiments.studies.plus_fitted_report import write_outputs

STAGES = ("all", "fit", "select", "eval", "oracle", "report")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the study's stages (``--stage``, every one by default) and write results/plus_fitted/."""
    offline.enable()
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", choices=list(STAGES), default="all")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1,
                    help="oracle jobs at a time (default 1: in this process; more: one worker process each)")
    ap.add_argument("--print-config", action="store_true",
                    help="print results/plus_fitted/fit.json's values as YAML for conf/method/contextrender_plus_fitted.yaml, then exit")
    a = ap.parse_args(argv)
    if a.print_config:
        print(config_block(json.loads((OUT / "fit.json").read_text())), end="")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    OUT.mkdir(parents=True, exist_ok=True)
    ensure_traces()
    split = load_split()
    write_json(OUT / "split.json", {k: {p: sorted(e.task_id for e in v[p]) for p in v} for k, v in split.items()})
    if a.stage in ("all", "fit"):
        write_json(OUT / "fit.json", fit(split, a.rounds))
    fitted = json.loads((OUT / "fit.json").read_text())
    if a.stage in ("all", "select"):
        check_config({k: v for k, v in fitted.items() if k != "prior_min_age"})
        fitted = {**fitted, **select_min_age(split, workers=a.workers)}
        write_json(OUT / "fit.json", fitted)
    if a.stage in ("all", "eval"):
        check_config(fitted)
        write_json(OUT / "plus_recall.json", evaluate(split))
        write_json(OUT / "plus_budgets.json", evaluate_other_budgets(split))
    if a.stage in ("all", "oracle"):
        write_json(OUT / "oracle.json", oracle(workers=a.workers))
    if a.stage in ("all", "eval", "oracle", "report"):
        write_outputs(OUT, fitted)


if __name__ == "__main__":
    main()
