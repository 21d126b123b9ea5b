"""render.py's shared helpers: assemble's sources, the task message x and the focus text f_t (docs/method.md §4)."""

from __future__ import annotations

import pytest

from contextrender import ContextRender, HashingEmbedder
from contextrender.baselines.semantic_retrieval import SemanticRetrieval
from contextrender.render import Rendered, Scope, assemble, first_user, fit_verbatim, focus_text, latest_assistant

from ._helpers import Transcript, filler


class RecordingEmbedder(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(dim=64)
        self.queries: list[str] = []

    def embed_query(self, text: str):  # type: ignore[override]
        self.queries.append(text)
        return super().embed_query(text)


def _session():
    t = Transcript(task="Find the invoice of ACME_42.")
    t.call("search", {"q": "ACME_42"}, filler("r1", 40), content="searching")
    t.say("found a candidate")
    t.call("read", {"id": 7}, filler("r2", 40))
    t.user("And its due date?")
    return t.into()


# -- assemble and Rendered.sources --------------------------------------------------------


def test_assemble_records_the_source_of_every_message():
    s = _session()  # 0 system, 1 task, 2 asst+call, 3 result, 4 asst, 5 asst+call, 6 result, 7 current user
    scope = Scope.of(s)
    summary = {"role": "user", "content": "[Summary]\nearlier"}
    note = {"role": "user", "content": "[note]"}
    msgs, sources = assemble(s, scope, [1, 2, 3, 5, 6], bodies={3: "[omitted]"}, inserts={-1: [summary], 5: [note]})
    assert sources == [0, None, 1, 2, 3, None, 5, 6, 7]
    assert msgs[1] is summary and msgs[5] is note
    assert msgs[4]["content"] == "[omitted]" and msgs[4]["tool_call_id"] == s.message(3).tool_call_id
    for m, src in zip(msgs, sources, strict=True):
        if src is not None and src != 3:
            assert m == s.message(src).to_openai()


def test_assemble_without_system_prompt_or_current_user():
    t = Transcript(task="Only the task.", system=None)
    t.say("working")
    s = t.into()
    scope = Scope.of(s)
    assert scope.system == () and scope.current == 0
    assert assemble(s, scope, scope.history).sources == [0, 1]


def test_rendered_refuses_sources_of_the_wrong_length():
    with pytest.raises(ValueError, match="sources"):
        Rendered(({"role": "user", "content": "x"},), 1, frozenset(), sources=(0, 1))
    assert Rendered(({"role": "user", "content": "x"},), 1, frozenset()).sources == ()  # hand-built: unknown


# -- x and f_t --------------------------------------------------------------------------------


def test_first_user_skips_system_and_developer_messages():
    t = Transcript(task="The task.", system=None)
    t.messages.insert(0, {"role": "developer", "content": "rules"})
    s = t.into()
    seq, msg = first_user(s)
    assert seq == 1 and msg.content == "The task."
    empty = Transcript(system="sys only")
    empty.messages.pop()  # no user message at all
    assert first_user(empty.into()) is None


def test_focus_text_is_current_user_plus_latest_visible_assistant():
    s = _session()
    scope = Scope.of(s)
    latest = s.message(5)
    assert focus_text(s, scope, scope.history) == "And its due date?\n" + latest.text()
    # the same from a set (Semantic Retrieval's kept seqs) as from the ordered tuple
    assert focus_text(s, scope, set(scope.history)) == focus_text(s, scope, scope.history)
    # the latest *visible* one: without seq 5 (trimmed), seq 4 is the latest rendered assistant message
    kept = tuple(q for q in scope.history if q not in (5, 6))
    assert latest_assistant(s, kept) == 4
    assert focus_text(s, scope, kept) == "And its due date?\nfound a candidate"


def test_focus_text_is_none_without_either_message_and_empty_text_otherwise():
    t = Transcript(task="", system=None)
    s = t.into()
    scope = Scope.of(s)
    assert focus_text(s, scope, scope.history) == ""  # an empty current user message is still a message
    t2 = Transcript(task="x", system=None)
    t2.messages.pop()
    t2.say("assistant only")
    s2 = t2.into()
    assert Scope.of(s2).current is None and focus_text(s2, Scope.of(s2), ()) is None


def test_the_selector_and_semantic_retrieval_use_the_one_focus_text():
    s = _session()
    budget = fit_verbatim(s, Scope.of(s), 10_000).base_tokens + 20  # over budget: relevance is scored
    emb = RecordingEmbedder()
    ContextRender(embedder=emb).render(s, budget)
    scope = Scope.of(s)
    trim = fit_verbatim(s, scope, budget)
    assert emb.queries == [first_user(s)[1].content[:2000], focus_text(s, scope, trim.kept)]
    sr = SemanticRetrieval(embedder=HashingEmbedder(dim=64))
    assert sr.retrieval_input(s, scope, set(trim.kept)) == focus_text(s, scope, trim.kept)


def test_the_selector_embeds_an_empty_focus_text():
    """An empty current user message with no visible assistant message gives f_t = "", which q_t
    embeds (as it did before the helper): the text is empty, the message is not missing."""
    t = Transcript(task="Reconcile ORDER_1.")
    t.call("lookup", {"id": 1}, filler("ORDER_1", 80))
    t.user("")
    s = t.into()
    scope = Scope.of(s)
    emb = RecordingEmbedder()
    ContextRender(embedder=emb)._query(s, scope, ())  # the assistant message trimmed away
    assert emb.queries == ["Reconcile ORDER_1.", ""]
