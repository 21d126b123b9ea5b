"""contextrender/service/responses_api.py: Responses API items to the graph's chat messages and a render back,
on hand-made renders (what no registered method produces today: an assistant message that loses one call)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contextrender.events import Usage
from contextrender.service import responses_api as ra
from contextrender.service.errors import InvalidMessages
from contextrender.service.results import ReadinessSummary, RenderResult
from contextrender.service.streams import ResponsesStreamAssembler

from .responses_upstream import default_script, pairing_problems, sse_bytes, sse_events

TASK = {"role": "user", "content": [{"type": "input_text", "text": "Find it."},
                                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}
RS = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "SECRET-BLOB"}
MSG = {"type": "message", "role": "assistant", "id": "msg_1", "content": [
    {"type": "output_text", "text": "Looking.", "annotations": []}, {"type": "refusal", "refusal": "not that"}]}
FC1 = {"type": "function_call", "call_id": "c1", "id": "fc_1", "name": "lookup", "arguments": '{"q": 1}'}
FC2 = {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "*** Begin Patch"}
OUT1 = {"type": "function_call_output", "call_id": "c1", "output": "one " * 50}
OUT2 = {"type": "custom_tool_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "patched"}]}
REF = {"type": "mcp_approval_response", "approval_request_id": "a1", "approve": True}
ITEMS: list[Any] = [TASK, RS, MSG, FC1, FC2, OUT1, OUT2, REF, {"role": "user", "content": "Next?"}]


def render_of(converted: ra.Converted, picks: list[tuple[int | None, dict[str, Any]]]) -> RenderResult:
    return RenderResult(messages=tuple(m for _, m in picks), layout=tuple(s for s, _ in picks), tokens=0,
                        readiness=ReadinessSummary((), 0, 0, 0, None), budget=100, method="hand",
                        visible=(), usage=Usage(), shortcut=None, full_tokens=0, stored=len(converted.messages),
                        next_invocation=0, session="s", created=False, added=0, forked=False)


def test_conversion_to_chat_messages():
    conv = ra.to_openai("Be brief.", ITEMS)
    assert conv.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find it."},
        {"role": "assistant", "content": "Looking.\nnot that", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "patch", "arguments": "*** Begin Patch"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one " * 50},
        {"role": "tool", "tool_call_id": "c2", "content": "patched"},
        {"role": "user", "content": "Next?"})
    # the reasoning is part of the assistant message it precedes; the client-side opaque item travels
    # with the item after it
    assert conv.origins[2] == ra.Origin(ra.ASSISTANT, (1, 2, 3, 4))
    assert conv.origins[5] == ra.Origin(ra.USER, (8,), (7,))
    # the recorded answer of a response is the same message the client's items convert to
    assert ra.assistant_message([RS, MSG, FC1, FC2]) == conv.messages[2]


def test_unchanged_render_sends_the_clients_own_items():
    conv = ra.to_openai("Be brief.", ITEMS)
    sent = ra.forwarded_input(ITEMS, conv, render_of(conv, list(enumerate(conv.messages))))
    assert sent == ITEMS and all(a is b for a, b in zip(sent, ITEMS, strict=True))


def test_changed_render_maps_back_and_pairs():
    conv = ra.to_openai(None, ITEMS)
    asst = {**conv.messages[1], "content": "Looking (short).", "tool_calls": conv.messages[1]["tool_calls"][:1]}
    marker = {**conv.messages[2], "content": "[omitted]"}
    picks = [(0, conv.messages[0]), (None, {"role": "user", "content": "Summary: earlier work."}), (1, asst),
             (2, marker), (4, conv.messages[4])]
    sent = ra.forwarded_input(ITEMS, conv, render_of(conv, picks))
    assert sent[0] is TASK
    assert sent[1] == {"type": "message", "role": "user", "content": "Summary: earlier work."}
    # the reasoning goes with the message item it preceded; the text lands in the first text part
    assert sent[2] is RS
    assert sent[3] == {**MSG, "content": [{"type": "output_text", "text": "Looking (short).", "annotations": []}]}
    assert sent[4] is FC1 and sent[5] == {**OUT1, "output": "[omitted]"}
    assert sent[6:] == [REF, ITEMS[-1]] and sent[6] is REF
    assert pairing_problems(sent) == []


def test_dropped_call_takes_its_reasoning_and_orphans_go():
    items = [TASK, RS, FC1, OUT1, {"type": "reasoning", "id": "rs_2", "summary": []}, FC2, OUT2]
    conv = ra.to_openai(None, items)
    # a render that (wrongly) keeps the second call but drops its output: repaired, not sent unpaired
    picks = [(0, conv.messages[0]), (1, conv.messages[1]), (2, conv.messages[2]), (3, conv.messages[3])]
    sent = ra.forwarded_input(items, conv, render_of(conv, picks))
    assert sent == [TASK, RS, FC1, OUT1]
    assert ra.repair_pairing([OUT1, FC1, RS, FC2, OUT2]) == [RS, FC2, OUT2]
    assert ra.pairing_errors([OUT1, FC1]) == ["input[0]: output for call_id 'c1' follows no call with that id",
                                              "input[1]: call 'c1' has no later output"]


def test_string_input_stays_a_string():
    conv = ra.to_openai("Sys.", "Do the thing.")
    assert conv.messages == ({"role": "system", "content": "Sys."}, {"role": "user", "content": "Do the thing."})
    clipped = render_of(conv, [(0, conv.messages[0]), (1, {"role": "user", "content": "Do"})])
    assert ra.forwarded_input("Do the thing.", conv, clipped) == "Do"


@pytest.mark.parametrize("bad,says", [
    ([{"role": "tool", "content": "x"}], "input[0]: a message's 'role'"),
    ([{"type": "function_call", "name": "f", "arguments": "{}"}], "call_id"),
    ([{"type": "function_call_output", "output": "x"}], "call_id"),
    ([{"role": "user", "content": 5}], "input[0].content"),
    ([{"role": "user", "content": ["x"]}], "input[0].content[0]"),
    ([7], "input[0] must be an object"),
    ({"role": "user"}, "'input' must be a string or a list"),
    ([{"type": "reasoning", "id": "rs", "summary": []}, {"type": "item_reference", "id": "x"}], None),
])
def test_refusals_name_the_item(bad, says):
    if says is None:  # opaque items alone are a conversation the graph cannot hold: nothing to render
        conv = ra.to_openai(None, bad)
        assert conv.messages == ({"role": "assistant", "content": ""},)
        assert ra.stateful_fields({"input": bad}) == ["input items of type 'item_reference'"]
        return
    with pytest.raises(InvalidMessages, match=says.replace("[", r"\[").replace("]", r"\]")):
        ra.to_openai(None, bad)


def test_stateful_fields():
    assert ra.stateful_fields({"input": "x"}) == []
    assert ra.stateful_fields({"input": "x", "previous_response_id": None, "conversation": None}) == []
    assert ra.stateful_fields({"previous_response_id": "r", "conversation": {"id": "c"}}) == [
        "previous_response_id", "conversation"]


def test_stream_assembler_matches_the_response_however_the_bytes_are_cut():
    body = {"model": "m", "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}],
            "input": "REC_start; steps=2."}
    output = default_script(body, 3)
    raw = b"".join(sse_bytes(sse_events(body, "r", output)))
    for cut in (1, 5, 64, len(raw)):
        asm = ResponsesStreamAssembler()
        for i in range(0, len(raw), cut):
            asm.feed(raw[i:i + cut])
        asm.close()
        assert asm.complete and asm.bad_events == 0 and asm.output() == output
        assert asm.message() == ra.assistant_message(output)
    # without the terminal response's output, the deltas and done items still give the answer
    events = sse_events(body, "r", output)
    events[-1]["response"]["output"] = []
    partial = [e for e in events if e["type"] != "response.output_item.done"]
    asm = ResponsesStreamAssembler()
    asm.feed(b"".join(sse_bytes(partial)))
    msg = asm.message()
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        json.loads(i["arguments"]) for i in output if i["type"] == "function_call"]
    failed = ResponsesStreamAssembler()
    failed.feed(b'data: {"type": "response.failed", "response": {}}\n\ndata: not json\n\n')
    assert not failed.complete and failed.bad_events == 1
