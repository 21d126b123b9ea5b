"""Semantic Retrieval (docs/method.md §6): recent results first, then the most similar ones.

At invocation t, when Tok(H_full) > B:

1. user and assistant messages are kept verbatim and charged first
   (:func:`~contextrender.render.fit_verbatim`, docs/method.md §5 project rule); every
   tool result starts as its omission marker;
2. results from the ``recent_turns`` (3) most recent turns — produced by
   invocations t−1, t−2, t−3 — are visited newest first and kept while
   their full messages total at most ``recent_share`` (60%) of B and the
   assembled history fits B; one that does not fit is skipped, the next is
   tried;
3. every other result (including recent ones step 2 skipped) is ranked by
   cosine similarity between its stored embedding (docs/method.md §2) and the
   retrieval input — the latest user message plus the latest rendered
   assistant message (text and tool calls) — highest first, ties to the
   older result, and added while it fits B (skip and continue).

The policy is stateless: nothing is deleted, so a result omitted now can be
retrieved at any later invocation. When the full history fits B it is returned
unchanged and nothing is embedded; result embeddings are computed once and
stored in the graph, the retrieval input is embedded at every budgeted render
(both counted in ``usage.embedding``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from contextrender.baselines._common import StatelessPolicy, fill, finish, selection_bodies, trim_candidates
from contextrender.embed import LazyEmbedder, checked_output
from contextrender.events import Usage
from contextrender.graph import Session
from contextrender.render import Rendered, Scope, check_int, check_share, fit_verbatim, focus_text


class SemanticRetrieval(LazyEmbedder, StatelessPolicy):
    """Recency quota (60% of B over the last 3 turns), then cosine ranking."""

    def __init__(self, *, embedder: Any = None, recent_turns: int = 3, recent_share: float = 0.6,
                 name: str = "semantic_retrieval") -> None:
        self.name = name
        self._embedder = embedder
        self.recent_turns = check_int("recent_turns", recent_turns)
        self.recent_share = check_share("recent_share", recent_share)

    def compose(self, session: Session, scope: Scope, budget: int, state: None) -> Rendered:
        """Steps 1–3 of the module docstring (the full history before them is the template's shortcut)."""
        trim = fit_verbatim(session, scope, budget)
        cands = trim_candidates(session, trim)
        usage = Usage()

        # Step 2: the recent turns, newest first, within recent_share·B.
        t = session.next_invocation
        recent = [s for s in reversed(cands) if t - session.result(s).invocation <= self.recent_turns]
        quota = int(self.recent_share * budget)
        chosen: list[int] = []
        spent, current = 0, trim.base_tokens
        for s in recent:
            r = session.result(s)
            ntok, d = r.ntok, r.ntok - r.marker_ntok
            if spent + ntok <= quota and current + d <= budget:
                chosen.append(s)
                spent += ntok
                current += d

        # Step 3: the rest by cosine similarity to the retrieval input.
        taken = set(chosen)
        rest = [s for s in cands if s not in taken]
        if rest:
            sims, u = self.similarities(session, scope, set(trim.kept), rest)
            usage += u
            # Stable sort on −similarity: ties keep transcript order (older first).
            ranked = [rest[i] for i in np.argsort(-sims, kind="stable")]
            chosen, current = fill(session, ranked, current, budget, chosen)

        bodies = selection_bodies(session, trim, chosen)
        return finish(self.name, session, scope, budget, trim.kept, visible=chosen, usage=usage, bodies=bodies)

    def retrieval_input(self, session: Session, scope: Scope, kept: set[int]) -> str:
        """Latest user message + latest rendered assistant message (docs/method.md §6): ContextRender's f_t
        (docs/method.md §4, :func:`~contextrender.render.focus_text`); "" when there is neither."""
        return focus_text(session, scope, kept) or ""

    def similarities(self, session: Session, scope: Scope, kept: set[int],
                     seqs: list[int]) -> tuple[np.ndarray, Usage]:
        """cos(emb(r), emb(retrieval input)) for ``seqs`` (embeddings are unit vectors)."""
        embs, usage = session.result_embeddings(self.embedder, seqs)
        text = self.retrieval_input(session, scope, kept)
        if not text:
            return np.zeros(len(seqs)), usage
        q, u = checked_output(self.embedder.embed_query(text), self.embedder, "embed_query", None)
        return embs.astype(np.float64) @ np.asarray(q, dtype=np.float64), usage + u
