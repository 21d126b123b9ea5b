"""The task and a client's wrapped blocks (docs/method.md §5, "The task"): recognition by shape, the task
message chosen past a wrapped-only message, its blocks shortened first, its words kept when it is clipped."""

from __future__ import annotations

from contextrender.render import Scope, first_user, fit_verbatim, is_client_boilerplate, own_words, task_text

from ._helpers import Transcript

ENV = ("<environment_context>\n  <cwd>/work</cwd>\n  <shell>bash</shell>\n</environment_context>")
AGENTS = "# AGENTS.md instructions for /work\n\n<INSTRUCTIONS>\n" + "Run the tests. " * 200 + "\n</INSTRUCTIONS>"
REMINDER = "<system-reminder>\n" + "Context the CLI adds. " * 300 + "\n</system-reminder>"
WORDS = "Fix the failing parser test in src/parse.py and explain the cause."


def test_wrapped_blocks_are_recognised_by_their_shape():
    assert is_client_boilerplate(ENV) and is_client_boilerplate(AGENTS + "\n" + ENV)
    assert is_client_boilerplate("<any-tag k=\"v\">\nx\n</any-tag>\n\n<other>\ny\n</other>\n")
    assert own_words(REMINDER + "\n" + REMINDER + "\n" + WORDS) == WORDS
    assert own_words(WORDS + "\n" + REMINDER) == WORDS
    for text in (WORDS, "", "<b>bold</b> words", "Fix <x>\n<code>\nz\n</code>\nplease", "<a>\nunclosed"):
        assert not is_client_boilerplate(text) and own_words(text) == text  # nothing wrapped around the words


def _session(first_users, turns=3):
    t = Transcript(task=first_users[0])
    for u in first_users[1:]:
        t.user(u)
    for k in range(turns):
        t.say(f"Step {k}: I looked at part {k} and will continue with the next one. " * 6)
        t.user(f"Go on with part {k + 1}.")
    return t.into()


def test_the_task_is_the_first_user_message_that_is_not_only_wrapped_blocks():
    s = _session([AGENTS + "\n" + ENV, WORDS])
    seq, msg = first_user(s)
    assert msg.content == WORDS and s.messages[seq - 1].content.startswith("# AGENTS.md")
    plain = _session([WORDS, "Another message."])
    assert first_user(plain)[1].content == WORDS  # without wrapped blocks: the first user message, as before
    only = _session([ENV], turns=0)
    assert first_user(only)[1].content == ENV  # nothing but wrapped blocks: the first one still
    assert task_text(first_user(_session([REMINDER + "\n" + WORDS]))[1]) == WORDS


def test_codex_shape_drops_the_environment_message_and_keeps_the_task():
    s = _session([AGENTS + "\n" + ENV, WORDS])
    trim = fit_verbatim(s, Scope.of(s), 300)
    seq = first_user(s)[0]
    assert seq in trim.kept and seq - 1 not in trim.kept and trim.base_tokens <= 300
    assert trim.clipped_first_user is None


def test_claude_code_shape_loses_its_reminders_first_and_clips_the_words():
    s = _session([REMINDER + "\n" + REMINDER + "\n" + WORDS])
    scope = Scope.of(s)
    trim = fit_verbatim(s, scope, 500)  # the reminders are far above B; the words and the turns fit
    assert trim.clipped_first_user == WORDS and len(trim.kept) == len(scope.history)
    tiny = fit_verbatim(s, scope, 12)  # below the words: their start stays, none of the reminder
    assert tiny.clipped_first_user and WORDS.startswith(tiny.clipped_first_user) and tiny.base_tokens <= 12
