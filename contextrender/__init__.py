"""ContextRender: execution dependencies → agent context (arXiv:2609.37743).

Quick use from any agent loop::

    from contextrender import ContextGraph, ContextRender

    graph = ContextGraph("run.sqlite")          # persistent, append-only
    session = graph.session("task-42")          # create or resume
    session.sync(messages)                      # the agent's full OpenAI-format list
    rendered = ContextRender().render(session, budget=6000)
    response = client.chat.completions.create(model=..., messages=list(rendered.messages))
"""

from . import _offline

_offline.apply()

from .compaction import Compactor, ExtractiveCompactor, LLMCompactor, make_compactor  # noqa: E402
from .embed import CachedEmbedder, HashingEmbedder, LiteLLMEmbedder, LocalEmbedder, make_embedder  # noqa: E402
from .events import Completion, Message, MessageError, ToolCall, Usage  # noqa: E402
from .graph import ContextGraph, GraphError, Session, ToolResult  # noqa: E402
from .render import BudgetExceeded, ContextPolicy, Rendered, Scope, check_budget  # noqa: E402
from .scoring import ScoringParams, Weights  # noqa: E402
from .selector import ContextRender, ResultScore, Selection  # noqa: E402
from .tfa import FlowIndex, ReuseEdge, extract_values, match_tokens  # noqa: E402
from .tokens import TokenCounter  # noqa: E402

__all__ = [
    "BudgetExceeded", "CachedEmbedder", "Completion", "Compactor", "ContextGraph", "ContextPolicy",
    "ContextRender", "ExtractiveCompactor", "FlowIndex", "GraphError", "HashingEmbedder", "LLMCompactor",
    "LiteLLMEmbedder", "LocalEmbedder", "Message", "MessageError", "Rendered", "ResultScore", "ReuseEdge",
    "Scope", "ScoringParams", "Selection", "Session", "TokenCounter", "ToolCall", "ToolResult", "Usage",
    "Weights", "check_budget", "extract_values", "make_compactor", "make_embedder", "match_tokens",
]
__version__ = "0.1.0"
