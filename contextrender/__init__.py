"""ContextRender: execution dependencies → agent context (arXiv:2609.37743).

Quick use from any agent loop::

    from contextrender import ContextGraph, ContextRender

    graph = ContextGraph("run.sqlite")          # persistent, append-only
    session = graph.session("task-42")          # create or resume
    session.sync(messages)                      # the agent's full OpenAI-format list
    rendered = ContextRender().render(session, budget=6000)
    response = client.chat.completions.create(model=..., messages=list(rendered.messages))

Or wrap the client once and keep the agent as it is (needs the ``[service]`` extra)::

    client = contextrender.wrap(OpenAI(), budget=6000, method="contextrender", graph="run.sqlite")
"""

from typing import TYPE_CHECKING, Any

from contextrender.compaction import Compactor, ExtractiveCompactor, LLMCompactor, make_compactor
from contextrender.embed import (
    CachedEmbedder,
    HashingEmbedder,
    LiteLLMEmbedder,
    LocalEmbedder,
    SentenceTransformersEmbedder,
    make_embedder,
)
from contextrender.events import Completion, Message, MessageError, ToolCall, Usage
from contextrender.graph import ContextGraph, GraphError, Session, ToolResult
from contextrender.render import BudgetExceeded, ContextPolicy, Rendered, Scope, check_budget
from contextrender.scoring import ScoringParams, Weights
from contextrender.selector import ContextRender, ResultScore, Selection
from contextrender.tfa import FlowIndex, ReuseEdge, extract_values, match_tokens
from contextrender.tokens import TokenCounter

if TYPE_CHECKING:
    from contextrender.wrapper import wrap

__all__ = [
    "BudgetExceeded", "CachedEmbedder", "Completion", "Compactor", "ContextGraph", "ContextPolicy",
    "ContextRender", "ExtractiveCompactor", "FlowIndex", "GraphError", "HashingEmbedder", "LLMCompactor",
    "LiteLLMEmbedder", "LocalEmbedder", "Message", "MessageError", "Rendered", "ResultScore", "ReuseEdge",
    "Scope", "ScoringParams", "Selection", "SentenceTransformersEmbedder", "Session", "TokenCounter", "ToolCall", "ToolResult", "Usage",
    "Weights", "check_budget", "extract_values", "make_compactor", "make_embedder", "match_tokens", "wrap",
]
__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    # `wrap` lives in the service layer (the method registry, ContextService): imported on first use,
    # so `import contextrender` stays numpy + tiktoken.
    if name == "wrap":
        from contextrender.wrapper import wrap as fn

        globals()["wrap"] = fn
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
