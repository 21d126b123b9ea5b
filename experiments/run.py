"""Hydra entry point: ``python -m contextrender.experiments.run [-m] key=value ...``.

Examples::

    python -m contextrender.experiments.run method=prune budget=2000
    python -m contextrender.experiments.run -m method=contextrender,prune budget=2000,6000
    python -m contextrender.experiments.run -m +experiment=table1
    python -m contextrender.experiments.run method=contextrender method.weights.reuse=0
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from contextrender import offline
from contextrender.experiments.catalogue import register_resolver
from contextrender.experiments.runtime.runner import JobConfigError, MissingPackage, missing_package_message, run_job
from contextrender.files import LockedError
from contextrender.redact import redact, redact_handlers

log = logging.getLogger(__name__)
register_resolver()  # ${catalogue:...} in conf/experiment/*.yaml, resolved when Hydra composes the sweep


def _multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _remove(out: Path, top: str) -> None:
    """Remove the run directory ``out`` and, in the default layout (``<top>/<experiment_name>/<time>``), the parents
    that held only it."""
    shutil.rmtree(out, ignore_errors=True)
    parents = list(out.parents)[:2]
    for parent in parents if len(parents) == 2 and parents[1].name == top else []:
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break


def _refused() -> None:
    """A single job refused before it ran (the reason is on stderr): remove the output directory Hydra made for it
    (its config copy and a log of that one line) and the parents that held only it, so a failed start leaves nothing
    behind. A sweep keeps its directories: its other jobs ran."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or _multirun():
        return
    out = Path(HydraConfig.get().runtime.output_dir)
    if not out.is_dir() or any(p.name != ".hydra" and not p.name.endswith(".log") for p in out.iterdir()):
        return
    _remove(out, "outputs")


def _refused_sweep() -> None:
    """A sweep stopped at its first job, before anything but Hydra's config copies and logs was written: remove its
    directory and the parents that held only it (``multirun/<experiment>``), as :func:`_refused` does for a single
    job. A sweep stopped later keeps its directory: the logs of the jobs that ran are in it."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or HydraConfig.get().job.num != 0:
        return
    hc = HydraConfig.get()
    out = Path(hc.sweep.dir)
    job = out / str(hc.sweep.subdir)
    # Only this sweep's own first job in it: a sweep directory reused across runs, or shared by a sweep started in
    # the same second, holds other entries and is left alone.
    if not out.is_dir() or {p.name for p in out.iterdir()} - {"multirun.yaml", job.name}:
        return
    if job.is_dir() and any(p.is_file() and ".hydra" not in p.relative_to(job).parts and not p.name.endswith(".log")
                            for p in job.rglob("*")):
        return
    _remove(out, "multirun")


@hydra.main(config_path="pkg://contextrender.conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    # Hydra has configured logging (console and the job's .log file) by now; make each of its
    # handlers redact, so no URL credentials or keys that a library logs (httpx logs every
    # request URL at INFO) reach the terminal or the file.
    redact_handlers()
    offline.enable()  # the harness's own settings, applied at its entry point (not on import)
    try:
        summary = run_job(cfg)
    except (JobConfigError, LockedError) as e:  # refused before it ran: the reason, no traceback
        log.error("%s", redact(str(e)))
        if _multirun():
            raise  # Hydra runs the sweep's other jobs, then fails with it (an exit here would end the sweep)
        _refused()
        sys.exit(2)
    except (MissingPackage, ModuleNotFoundError) as e:  # a package of the harness (or a benchmark's) is missing
        if isinstance(e, ModuleNotFoundError) and (not e.name or e.name.split(".")[0] == "contextrender"):
            raise  # this project's own module: a bug, with its traceback
        log.error("%s", redact(str(e)) if isinstance(e, MissingPackage) else missing_package_message(e))
        if _multirun():  # the sweep's other jobs would most likely fail the same way: stop it, with no traceback
            log.error("the sweep stops here: set up the environment named above (the harness's is `make setup`'s), "
                      "then the same command resumes (finished jobs are kept)")
            _refused_sweep()
        else:
            _refused()
        sys.exit(2)
    except KeyboardInterrupt:
        log.warning("interrupted: the episodes that finished are recorded; the same command resumes the job")
        sys.exit(130)
    log.info("%s: %d episodes done (%d run now, %d skipped, %d infrastructure errors to retry); "
             "mean score %s over all done episodes%s", summary.records, summary.done, summary.ran,
             summary.skipped, summary.errors, summary.mean_score,
             " — stopped by the sweep spend cap" if summary.stopped_by_sweep_cap else "")
    return summary.mean_score


if __name__ == "__main__":
    main()
