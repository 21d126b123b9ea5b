"""Tool-Flow Analysis: docs/method.md §3 extraction rules, matching, attribution, counting, Eq. 1."""

from __future__ import annotations

import json

import pytest

from contextrender import ContextGraph, extract_values, match_tokens, tfa
from contextrender import graph as graph_mod

from ._helpers import Transcript, result_seq

# ---------------------------------------------------------------------------------------------
# Extraction rules 1–5
# ---------------------------------------------------------------------------------------------

SEPARATORS = ['"', "'", "`", "(", ")", "[", "]", "{", "}", "<", ">", ",", ":", "/", "\\", " ", "\t", "\n", "\r"]


@pytest.mark.parametrize("sep", SEPARATORS)
def test_rule1_separators_split_values(sep):
    assert extract_values(f"alpha_1{sep}beta_22{sep}gamma_333") == {"alpha_1", "beta_22", "gamma_333"}


@pytest.mark.parametrize("sep", ["@", "=", ";", "|", "?", "!", "#", "+", "*", "&", "%", "$", "~"])
def test_rule2_any_character_outside_the_class_ends_a_candidate(sep):
    assert extract_values(f"alpha_1{sep}beta_22") == {"alpha_1", "beta_22"}


def test_rule2_email_splits_into_user_part_and_domain():
    assert extract_values("troy_solo@gmail.com") == {"troy_solo", "gmail.com"}
    # The user part alone must qualify on its own (here it is pure lowercase: dropped).
    assert extract_values("kathrynmaldonado@gmail.com") == {"gmail.com"}


def test_rule2_candidate_is_a_maximal_run():
    # Class characters glue: the whole run is one value, never its pieces.
    assert extract_values("a1-b2.c3_d4") == {"a1-b2.c3_d4"}
    assert extract_values("order-2024-07-01.final") == {"order-2024-07-01.final"}


def test_rule3_strips_leading_and_trailing_dot_dash_underscore():
    assert extract_values("__._-value_9-._") == {"value_9"}
    assert extract_values("...config.yaml.") == {"config.yaml"}
    assert extract_values("--flag-name--") == {"flag-name"}
    # Inner characters are kept.
    assert extract_values("_a__b_c_") == {"a__b_c"}


def test_rule3_length_at_least_six_after_stripping():
    assert extract_values("abc_12") == {"abc_12"}  # exactly 6
    assert extract_values("ab_12") == set()  # 5
    # 6-char runs that shrink below 6 once stripped are dropped.
    assert extract_values("abcd1_") == set()
    assert extract_values("_abcd1") == set()
    assert extract_values("ab.c1.") == set()
    assert extract_values("__init__") == set()
    # A 7-char run stripped to 6 survives.
    assert extract_values("abcd12_") == {"abcd12"}


@pytest.mark.parametrize(
    "token, kept",
    [
        ("lowercase", False),  # nothing that qualifies
        ("kathrynmaldonado", False),
        ("has_underscore", True),
        ("camelCase", True),
        ("ALLCAPS", True),
        ("KATHRYN", True),
        ("digits123", True),
        ("123456", True),
        ("with-hyphen", True),
        ("with.period", True),
        ("Kathryn", False),  # Titlecase word
        ("Maldonado", False),
        ("Sixsix", False),
        ("McDonald", True),  # inner capital: not a plain Titlecase word
        ("Kathryn_1", True),  # not pure alphabetic
        ("Kathryn-Ann", True),
    ],
)
def test_rule4_character_filter_and_titlecase(token, kept):
    assert (extract_values(f"[{token}]") == {token}) is kept
    assert tfa.qualifies(token) is kept


def test_rule5_file_paths_are_split_by_slashes_and_each_segment_tested():
    path = "/usr/local/lib/python3.11/site-packages/numpy_core/config.yaml"
    assert extract_values(path) == {"python3.11", "site-packages", "numpy_core", "config.yaml"}
    assert extract_values(r"C:\Users\Data\report_2024.csv") == {"report_2024.csv"}
    assert "usr/local" not in extract_values(path)


def test_worked_example_values_of_the_contacts_result():
    # docs/method.md §3.1: Turn 8 search_contacts(relationship="roommate").
    assert extract_values(CONTACTS) == {"troy_solo", "nancy.ritter", "gmail.com"}
    assert "Kathryn" not in extract_values(CONTACTS)  # Titlecase
    assert not {"Troy", "Nancy"} & extract_values(CONTACTS)  # too short
    assert "kathrynmaldonado" not in extract_values(CONTACTS)  # character filter


CONTACTS = json.dumps([
    {"name": "Kathryn Maldonado", "email": "kathrynmaldonado@gmail.com", "relationship": "roommate"},
    {"name": "Troy Solomon", "email": "troy_solo@gmail.com", "relationship": "roommate"},
    {"name": "Nancy Ritter", "email": "nancy.ritter@gmail.com", "relationship": "roommate"},
], indent=1)

# ---------------------------------------------------------------------------------------------
# Matching: whole token, case-sensitive
# ---------------------------------------------------------------------------------------------


def test_match_whole_token_inside_email_with_trailing_period():
    toks = match_tokens("Please write to troy_solo@gmail.com.")
    assert "gmail.com" in toks and "troy_solo" in toks


def test_match_never_substrings():
    assert "roommate_1" not in match_tokens("roommate_12")
    assert "roommate_1" not in match_tokens("xroommate_1")
    assert "gmail.com" not in match_tokens("mail.gmail.com")
    assert "roommate_1" in match_tokens("(roommate_1)")


def test_match_is_case_sensitive():
    assert "gmail.com" not in match_tokens("GMAIL.COM Gmail.com")
    assert "roommate_1" not in match_tokens("Roommate_1 ROOMMATE_1")


def _use_edges(session, value):
    return [e for e in session.reuse_edges() if e.value == value]


def test_session_matching_is_whole_token_and_case_sensitive():
    t = Transcript()
    c = t.call("list_rooms", {}, "rooms: roommate_1, alpha.beta")
    t.call("open", {"room": "roommate_12"}, "ok")
    t.call("open", {"room": "ROOMMATE_1"}, "ok")
    t.call("open", {"room": "Alpha.Beta"}, "ok")
    s = t.into()
    assert s.reuse_edges() == []
    assert s.reuse_score(result_seq(s, c)) == 0.0
    t.call("open", {"room": "roommate_1", "note": "alpha.beta."}, "ok")
    s2 = t.into()
    assert {e.value for e in s2.reuse_edges()} == {"roommate_1", "alpha.beta"}
    assert all(e.source == result_seq(s2, c) for e in s2.reuse_edges())


def test_gmail_domain_is_used_inside_a_full_address():
    t = Transcript()
    c = t.call("whoami", {}, "domain: gmail.com")
    t.call("send_email", {"to": "troy_solo@gmail.com."}, "sent")
    s = t.into()
    assert [(e.source, e.value) for e in s.reuse_edges()] == [(result_seq(s, c), "gmail.com")]

# ---------------------------------------------------------------------------------------------
# Attribution
# ---------------------------------------------------------------------------------------------


def test_attribution_to_first_tool_result_even_if_task_or_assistant_had_it_earlier():
    t = Transcript(task="Refund order order_778899 please.")
    t.say("I will look up order_778899 first.")
    r1 = t.call("get_order", {"q": "latest"}, "id: order_778899 status: shipped")
    r2 = t.call("get_order", {"id": "order_778899"}, "id: order_778899 status: shipped")
    t.call("refund", {"id": "order_778899"}, "done")
    s = t.into()
    edges = _use_edges(s, "order_778899")
    # Two uses after r1 (the 2nd and 3rd get_order/refund calls); the assistant's earlier text
    # had no earlier result to credit and the user task is never an operation.
    assert [e.source for e in edges] == [result_seq(s, r1)] * 2
    assert s.reuse_score(result_seq(s, r2)) == 0.0


def test_copies_in_model_outputs_never_become_sources():
    t = Transcript()
    t.say("Let me define batch_id_42 for later.")
    t.call("run", {"batch": "batch_id_42"}, "ran")
    t.say("Again batch_id_42.")
    s = t.into()
    assert s.reuse_edges() == []
    assert s.flow.first_source.get("batch_id_42") is None


def test_value_first_seen_in_model_output_is_credited_to_the_later_result():
    t = Transcript()
    t.say("Maybe token_abc9 exists.")
    r = t.call("search", {}, "found token_abc9")
    t.say("Using token_abc9 now.")
    s = t.into()
    assert [(e.source, e.op_seq) for e in s.reuse_edges()] == [(result_seq(s, r), len(s) - 1)]


def test_tool_result_mentioning_a_value_is_not_an_operation():
    t = Transcript()
    r1 = t.call("a", {}, "key: cfg_value_1")
    t.call("b", {}, "echo cfg_value_1")  # a later *result* with the value is not a use
    s = t.into()
    assert s.reuse_edges() == []
    assert s.reuse_score(result_seq(s, r1)) == 0.0

# ---------------------------------------------------------------------------------------------
# Counting (once per operation) and Eq. 1
# ---------------------------------------------------------------------------------------------


def test_operation_choice_is_documented():
    doc = (graph_mod.Session.add.__doc__ or "") + (tfa.ReuseEdge.__doc__ or "")
    assert "operation" in doc and "tool call" in doc
    assert "once per operation" in (tfa.FlowIndex.add_operation.__doc__ or "")


def test_value_repeated_in_one_tool_call_counts_once():
    t = Transcript()
    r = t.call("get", {}, "user_id_77")
    t.call("send", {"to": "user_id_77", "cc": ["user_id_77", "user_id_77"], "body": "user_id_77 user_id_77"}, "ok")
    s = t.into()
    assert len(s.reuse_edges()) == 1
    assert s.reuse_score(result_seq(s, r)) == pytest.approx(1.0)


def test_value_repeated_in_one_assistant_text_counts_once():
    t = Transcript()
    r = t.call("get", {}, "user_id_77")
    t.say("user_id_77, user_id_77 and again user_id_77.")
    s = t.into()
    assert s.reuse_score(result_seq(s, r)) == pytest.approx(1.0)


def test_text_and_each_tool_call_of_one_message_are_separate_operations():
    t = Transcript()
    r = t.call("get", {}, "user_id_77")
    t.turn(("send", {"to": "user_id_77"}, "ok"), ("log", {"who": "user_id_77"}, "ok"),
           content="Sending to user_id_77.")
    s = t.into()
    edges = s.reuse_edges()
    assert sorted(e.part for e in edges) == [-1, 0, 1]
    assert len({e.op_seq for e in edges}) == 1
    assert s.reuse_score(result_seq(s, r)) == pytest.approx(3.0)


def test_different_values_in_one_operation_count_separately():
    t = Transcript()
    r = t.call("get", {}, "first_val_1 second_val_2 third_val_3")
    t.call("use", {"a": "first_val_1", "b": "second_val_2"}, "ok")
    s = t.into()
    assert {e.value for e in s.reuse_edges()} == {"first_val_1", "second_val_2"}
    assert s.reuse_score(result_seq(s, r)) == pytest.approx(2.0)


def test_eq1_shared_value_weighting_evolves_with_later_results():
    t = Transcript()
    g = ContextGraph()
    s = g.session("s")
    r1 = t.call("get", {}, "shared_id_42 and again shared_id_42; own_val_9")
    s.sync(t.messages)
    seq1 = result_seq(s, r1)
    assert s.flow.n_results["shared_id_42"] == 1  # many occurrences in one result count once

    r2 = t.call("use", {"id": "shared_id_42"}, "echo shared_id_42 shared_id_42")
    s.sync(t.messages)
    # one use, credited to r1; now two results contain the value: n = 2
    assert s.reuse_score(seq1) == pytest.approx(1 / 2)
    assert s.reuse_score(result_seq(s, r2)) == 0.0

    t.call("use", {"id": "shared_id_42", "other": "own_val_9"}, "ok")
    s.sync(t.messages)
    assert s.reuse_score(seq1) == pytest.approx(2 / 2 + 1 / 1)

    t.call("list", {}, "shared_id_42")  # a third result containing the value, no new use
    s.sync(t.messages)
    assert s.flow.n_results["shared_id_42"] == 3
    assert s.reuse_score(seq1) == pytest.approx(2 / 3 + 1.0)


def test_worked_example_turn16_credits_turn8_result():
    t = Transcript(task="Send my roommates the rent reminder.")
    results = {}
    for k in range(18):
        if k == 8:
            results[k] = t.call("search_contacts", {"relationship": "roommate"}, CONTACTS)
        elif k == 16:
            results[k] = t.call("send_email", {"to": "troy_solo@gmail.com", "subject": "Rent"}, "sent")
        else:
            results[k] = t.call("read_note", {"n": k}, f"note {k} lorem ipsum")
    s = t.into()
    contacts = result_seq(s, results[8])
    assert s.result(contacts).invocation == 8
    edges = s.reuse_edges()
    assert {(e.source, e.value) for e in edges} == {(contacts, "troy_solo"), (contacts, "gmail.com")}
    assert all(s.invocation_of(e.op_seq) == 16 for e in edges)
    assert s.reuse_score(contacts) == pytest.approx(2.0)
    assert "nancy.ritter" not in s.flow.uses  # never used, yet kept by its result's score (see selector tests)
