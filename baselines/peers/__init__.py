"""Peer context strategies: what the agent frameworks our users run do with an overlong history.

Each peer is a :class:`~contextrender.render.ContextPolicy` built from ``conf/method/<name>.yaml``,
following its upstream project's rule and shipped defaults (every class docstring names the
project, file and defaults, and its deviations):

====================  ==========================================================================
policy                upstream
====================  ==========================================================================
openhands_masking     OpenHands ``ObservationMaskingCondenser`` (window 5, ``<MASKED>``)
openhands_summary     OpenHands ``LLMSummarizingCondenser`` (keep_first 1, newest half, summary)
openhands_forgetting  OpenHands ``AmortizedForgettingCondenser`` (keep_first 1, newest half)
inspect_edit          inspect_ai ``CompactionEdit`` (keep_tool_uses 3, ``(Tool result removed)``)
inspect_trim          inspect_ai ``CompactionTrim`` (preserve 0.8)
clear_tool_uses       Anthropic ``clear_tool_uses`` / LangChain ``ClearToolUsesEdit`` (keep 3, ``[cleared]``)
opencode_prune        opencode ``prune`` (protect 40K, minimum 20K, ``[Old tool result content cleared]``)
swe_last_n            SWE-agent ``last_n_observations`` (n 5, ``Old environment output: (N lines omitted)``)
langchain_trim        LangChain ``trim_messages`` (strategy "last", no partial messages)
tail_compaction       opencode / Codex compaction (summary, then the recent tail)
====================  ==========================================================================

What every peer shares with every other method of the harness (docs/method.md §1, §5, §6):

- **Budget scope and counter**: the leading system prompt and the current user message are
  outside B and always rendered; the rest (H_t) is counted with the session's one token
  counter, placeholders and summaries included; the one budget check
  (:func:`~contextrender.render.check_budget`) runs on the assembled prompt, so no peer ever
  renders above B.
- **Trigger**: what a peer triggers on in its framework (a share of the context window, an
  event count, 100K input tokens, the end of an agent loop) is replaced by "the history
  exceeds B". While the full history fits B it is returned unchanged. A stateful peer acts
  when the history *as it currently keeps it* (its compacted view) exceeds B.
- **Pairing**: every rendered tool call keeps its tool message (a placeholder counts) and no
  tool message is rendered without its call; a peer rule that would cut a unit (an assistant
  message and its results) keeps or drops it whole.
- **Placeholders** are written exactly as the peer writes them; a peer without one (the
  trimming and summarising peers) uses the project's omission marker (docs/method.md §5).
- **Summaries** go through the compaction model layer of the summary baselines
  (:class:`~contextrender.compaction.ExtractiveCompactor` offline,
  :class:`~contextrender.compaction.LLMCompactor` live), with prompts filled by
  :func:`~contextrender.compaction.fill`, placed where the peer places them.
- **State** (what a peer cleared, forgot or summarised) is a graph artifact keyed by policy
  name and budget, so a reopened graph renders identically and a repeated render at the same
  invocation changes nothing.

**Budget-scaled sizes.** Where a peer ships a size in tokens (opencode's PRUNE_PROTECT 40,000
and PRUNE_MINIMUM 20,000, opencode's 2K–15K tail, Codex's 20K of user messages) the default
is its budget-scaled form s·B/200,000 — the shipped size for a 200,000-token reference context
window (:data:`~contextrender.baselines.peers._shared.REFERENCE_CONTEXT`, the Claude models
these tools default to), scaled to B; a share of the window becomes the same share of B.
``scale_to_budget: false`` restores the shipped absolute values. Sizes in events or messages
(windows, keep-N, preserve shares) are kept as shipped.

**The shared fallback** (:func:`~contextrender.baselines.peers._shared.enforce_budget`). A
peer's window is in events or messages, not tokens, so its own rule can leave the history above
B. Then, for that render only (the peer's state is not changed):

1. the oldest results still shown in full are replaced by the peer's own placeholder (or the
   project's marker), oldest first, one at a time, until the history fits;
2. if every result is a placeholder and it still does not fit, the verbatim-overflow rule of
   every method (:func:`~contextrender.render.fit_verbatim`, docs/method.md §5) drops the oldest turns —
   never the task's first user message, which it clips if that alone is too long.
"""

from contextrender.baselines.peers.context_editing import ClearToolUses
from contextrender.baselines.peers.inspect_compaction import InspectEdit, InspectTrim
from contextrender.baselines.peers.langchain import LangChainTrim
from contextrender.baselines.peers.opencode import OpencodePrune
from contextrender.baselines.peers.openhands import OpenHandsForgetting, OpenHandsMasking, OpenHandsSummary
from contextrender.baselines.peers.swe_agent import SweLastN
from contextrender.baselines.peers.tail_compaction import TailCompaction

__all__ = ["ClearToolUses", "InspectEdit", "InspectTrim", "LangChainTrim", "OpenHandsForgetting", "OpenHandsMasking",
           "OpenHandsSummary", "OpencodePrune", "SweLastN", "TailCompaction"]
