"""The typed task stays in every render under the CLIs people run (docs/method.md §5, "The task"): Codex and
Claude Code, the real CLIs from npm, two turns each through the proxy against a scripted upstream on 127.0.0.1,
at budgets below the user text they send (the typed task plus the AGENTS.md / CLAUDE.md and context blocks
each CLI wraps around it). Skips without the CLIs (``npm ci --prefix tests/clients/codex``,
``npm ci --prefix tests/clients/claude-code``)."""

from __future__ import annotations

from contextrender import TokenCounter
from contextrender.service.anthropic_messages import alternating

from .anthropic_upstream import history_tokens, pairing_problems
from .client_turns import FOLLOW_UP, TASK, TASK_HEAD, adjacent_same_role, claude_two_turns, codex_two_turns, user_texts
from .responses_upstream import request_history_tokens
from .test_anthropic_claude_code import claude_cli
from .test_codex_cli import codex_bin

B = 1500


def _user_text_tokens(body: dict) -> int:
    counter = TokenCounter()
    return sum(counter.text(t) for t in user_texts(body))


def test_codex_keeps_the_typed_task_not_its_environment_context(tmp_path):
    run = codex_two_turns(codex_bin(), tmp_path, B)
    last_client = run["client"][-1]
    assert _user_text_tokens(last_client) > B  # the user text alone is above B
    assert any("<environment_context>" in t for t in user_texts(last_client))
    follow = [b for b in run["upstream"] if any(FOLLOW_UP in t for t in user_texts(b))]
    assert len(run["upstream"]) == 4 and len(follow) == 2
    for body in run["upstream"]:
        assert request_history_tokens(body) <= B
        assert any(TASK in t for t in user_texts(body))  # the whole task: its words fit B
    for body in follow:  # the AGENTS.md and environment message went first
        assert not any("<environment_context>" in t or "Rule 1:" in t for t in user_texts(body))


def test_claude_code_keeps_the_typed_task_and_alternates(tmp_path):
    budget = B
    run = claude_two_turns(claude_cli(), tmp_path, budget)
    first = run["client"][-1]["messages"][0]
    assert "<system-reminder>" in first["content"][0]["text"] and "Rule 1:" in str(first["content"])
    assert _user_text_tokens(run["client"][-1]) > budget
    assert len(run["upstream"]) == 4
    for body in run["upstream"]:
        msgs = body["messages"]
        assert history_tokens(body) <= budget and pairing_problems(msgs) == []
        assert adjacent_same_role(msgs) == []
        texts = user_texts(body)
        assert any(TASK_HEAD in t for t in texts)
        if budget == B:  # the words fit: all of them stay
            assert any(TASK in t for t in texts)
        if FOLLOW_UP in texts[-1]:  # the task is history now: the CLI's reminders around it went first
            assert not any("Rule 1:" in t for t in texts)


def test_alternating_merges_adjacent_messages_of_one_role():
    a, b, c = {"role": "user", "content": "task"}, {"role": "user", "content": [{"type": "text", "text": "next"}]}, \
        {"role": "assistant", "content": "ok"}
    out = alternating([a, b, c])
    assert [m["role"] for m in out] == ["user", "assistant"] and out[1] is c
    assert out[0]["content"] == [{"type": "text", "text": "task"}, b["content"][0]] and out[0]["content"][1] is b["content"][0]
