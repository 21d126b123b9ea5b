"""The paper's baselines (spec §6), each a :class:`~contextrender.render.ContextPolicy`.

All run under the same B, tokenizer and budget scope as ContextRender; build
them from ``conf/method/<name>.yaml`` with :func:`contextrender.config.build_policy`.
"""

from .acon import Acon
from .compact import Compact
from .full import FullHistory
from .prune import Prune
from .recency_summary import RecencySummary
from .semantic_retrieval import SemanticRetrieval

__all__ = ["Acon", "Compact", "FullHistory", "Prune", "RecencySummary", "SemanticRetrieval"]
