"""The paper's baselines (docs/method.md §6), each a :class:`~contextrender.render.ContextPolicy`.

All run under the same B, tokenizer and budget scope as ContextRender; build
them from ``conf/method/<name>.yaml`` with :func:`contextrender.registry.build_policy`.

This is the checkout's ``baselines/`` folder, installed as ``contextrender.baselines``.
"""

if __name__ != "contextrender.baselines":  # the checkout's folder is importable under its own name from the repo root
    raise ImportError(f"import this package as contextrender.baselines, not {__name__} (see docs/design.md, Layout)")

from contextrender.baselines.acon import Acon
from contextrender.baselines.compact import Compact
from contextrender.baselines.full import FullHistory
from contextrender.baselines.prune import Prune
from contextrender.baselines.recency_summary import RecencySummary
from contextrender.baselines.semantic_retrieval import SemanticRetrieval

__all__ = ["Acon", "Compact", "FullHistory", "Prune", "RecencySummary", "SemanticRetrieval"]
