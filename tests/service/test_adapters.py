"""smolagents and AppWorld adapters and the HTTP client, against a live loopback server."""

from __future__ import annotations

import copy
import itertools
import re
from typing import Any

import pytest

from contextrender.adapters.appworld import ContextRenderTrimMixin, appworld_to_openai
from contextrender.adapters.http_client import ContextRenderClient, ContextRenderError, InProcessClient
from contextrender.graph import OMISSION_MARKER
from contextrender.service.server import create_app

from .conftest import PAD, history_tokens, serve


@pytest.fixture
def server_url(service):
    with serve(create_app(service=service)) as url:
        yield url


def test_http_client_round_trip(server_url):
    with ContextRenderClient(server_url) as cr:
        assert cr.health()["status"] == "ok"
        assert cr.create_session("h1")["created"] is True
        cr.append("h1", [{"role": "user", "content": "hello"}])
        out = cr.render("h1", budget=100)
        assert out.session == "h1" and out.messages == [{"role": "user", "content": "hello"}] and out.layout == [0]
        with pytest.raises(ContextRenderError) as e:
            cr.render("missing")
        assert e.value.status == 404
        with pytest.raises(ContextRenderError) as e:
            cr.sync("h1", [{"role": "user", "content": "different"}])
        assert e.value.status == 409
        assert cr.export("h1")["messages"] == [{"role": "user", "content": "hello"}]


# -- smolagents -------------------------------------------------------------------------


def test_smolagents_model_wrapper(server_url):
    pytest.importorskip("smolagents")
    from smolagents import ToolCallingAgent, tool
    from smolagents.models import (
        ChatMessage,
        ChatMessageToolCall,
        ChatMessageToolCallFunction,
        MessageRole,
        Model,
    )

    from contextrender.adapters.smolagents import ContextRenderModel, smolagents_to_openai

    counter = itertools.count()

    @tool
    def lookup(record: str) -> str:
        """Look up a record by id.

        Args:
            record: the record id, e.g. REC_1.
        """
        n = next(counter)
        return f"record {record} owner user_{n}_x next=REC_next_{n}\n{PAD}"

    class Scripted(Model):
        def __init__(self) -> None:
            super().__init__(model_id="scripted")
            self.inputs: list[list[Any]] = []

        def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kw):
            self.inputs.append(list(messages))
            n = len(self.inputs)
            texts = [str(m.content) for m in messages if str(getattr(m.role, "value", m.role)) == "tool-response"]
            found = re.findall(r"REC_next_\d+", texts[-1]) if texts else []
            target = found[-1] if found else "REC_start"
            name, args = ("final_answer", {"answer": "done"}) if n >= 9 else ("lookup", {"record": target})
            return ChatMessage(role=MessageRole.ASSISTANT, content=f"Step {n}: using {target}.", tool_calls=[
                ChatMessageToolCall(id=f"call_{n}", type="function",
                                    function=ChatMessageToolCallFunction(name=name, arguments=args))])

    inner = Scripted()
    model = ContextRenderModel(inner, ContextRenderClient(server_url), budget=900)
    agent = ToolCallingAgent(tools=[lookup], model=model, max_steps=12, verbosity_level=0)
    assert agent.run("Follow REC_start through the records.") == "done"

    assert len(inner.inputs) == 9
    last = inner.inputs[-1]
    assert all(isinstance(m, ChatMessage) for m in last)
    texts = [str(m.content) for m in last]
    assert any(OMISSION_MARKER in t for t in texts)  # the budget bit
    graph_msgs, _ = smolagents_to_openai(last)
    assert history_tokens(graph_msgs) <= 900
    assert model.last_render.tokens <= 900 and model.last_render.session.startswith("smolagents-")
    # The graph holds every step: assistant messages with the real call ids, tool results answering them.
    cr = ContextRenderClient(server_url)
    stored = cr.messages(model.last_render.session)
    calls = [c["id"] for m in stored if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    assert calls[:3] == ["call_1", "call_2", "call_3"]
    assert [m["tool_call_id"] for m in stored if m["role"] == "tool"] == calls
    assert cr.edges(model.last_render.session)["edges"]  # calls reused REC_next_* values


# -- AppWorld ---------------------------------------------------------------------------


class FakeReAct:
    """The shape of AppWorld's ReAct agent: instruction prefix, then code / Output turns."""

    def __init__(self) -> None:
        self.messages = [
            {"role": "user", "content": "You are an agent that writes code against APIs. Example task: ..."},
            {"role": "assistant", "content": "```python\nprint(apis.api_docs.show_app_descriptions())\n```"},
            {"role": "user", "content": "Task: find who owns order ORD_0 and its successors."},
        ]
        self.num_instruction_messages = 3

    def step(self, k: int) -> None:
        self.messages.append({"role": "assistant", "content": f"```python\nprint(apis.shop.order('ORD_{1000 + k}'))\n```"})
        self.messages.append({"role": "user", "content": f"Output:\n```\norder ORD_{1001 + k} owner cust_{k}_x\n{PAD}\n```\n\n"})

    @property
    def trimmed_messages(self) -> list[dict[str, Any]]:
        return self.messages


def test_appworld_mixin(server_url):
    class Agent(ContextRenderTrimMixin, FakeReAct):
        cr_budget = 800

    agent = Agent()
    agent.cr_url = server_url
    agent.cr_session_id = "appworld-task-1"
    for k in range(10):
        agent.step(k)
        trimmed = agent.trimmed_messages
        render = agent.cr_last_render
        assert render.tokens <= 800 and history_tokens(render.messages) <= 800
    before = copy.deepcopy(agent.messages)
    trimmed = agent.trimmed_messages
    assert agent.messages == before  # never mutated
    assert trimmed[:3] == agent.messages[:3]  # the instruction prefix, outside B
    assert all(m in agent.messages or m["content"] == OMISSION_MARKER for m in trimmed)
    assert any(m["content"] == OMISSION_MARKER for m in trimmed)
    assert trimmed[-1]["role"] == "user" and len(trimmed) == len(agent.cr_last_render.messages)
    stored = ContextRenderClient(server_url).messages("appworld-task-1")
    assert [m["role"] for m in stored[:4]] == ["system", "system", "user", "assistant"]
    assert sum(m["role"] == "tool" for m in stored) == 10
    assert ContextRenderClient(server_url).edges("appworld-task-1")["edges"]  # code reused ORD_ ids


def test_appworld_conversion_is_stable_and_forks(service):
    agent_cls = type("A", (ContextRenderTrimMixin, FakeReAct), {"cr_budget": 800})
    a = agent_cls()
    a.cr_client = InProcessClient(service)
    a.world = type("W", (), {"task_id": "t42"})()
    a.step(0)
    _ = a.trimmed_messages
    assert a.cr_last_render.session == "appworld-t42"
    # Conversion of a prefix equals the prefix of the conversion (append-only graph).
    a.step(1)
    full, _ = appworld_to_openai(a.messages, 3)
    part, _ = appworld_to_openai(a.messages[:5], 3)
    assert full[:5] == part
    # A re-run of the same task that goes another way continues in a fork.
    b = agent_cls()
    b.cr_client = InProcessClient(service)
    b.world = a.world
    b.messages.append({"role": "assistant", "content": "print('another approach')"})
    _ = b.trimmed_messages
    assert b.cr_last_render.session == "appworld-t42~1"
