"""``contextrender.wrap`` for the OpenAI Responses API: ``client.responses.create`` of ``openai.OpenAI`` and
``AsyncOpenAI``.

    client = contextrender.wrap(OpenAI(), budget=6000)
    client.responses.create(model=..., instructions=..., input=items, tools=tools)  # as before

What the proxy's ``POST /v1/responses`` does, without the HTTP hop
(:mod:`contextrender.service.responses_api`): each ``responses.create`` converts ``instructions`` and
``input`` to the OpenAI-format history the graph stores, syncs and renders it under B like a chat
completion, sends the render as the caller's own input items (kept items untouched, so reasoning items
and their encrypted content go as given; calls and outputs kept paired) with every other argument
unchanged, and records the answer (the response's output, as one assistant message). A stream
(``stream=True``) yields the SDK's events unchanged and is recorded at ``response.completed``, before
that event reaches the caller. Each response's ``usage`` as billed (a stream's from ``response.completed``) is
recorded too: ``client.contextrender.last.usage`` and ``client.contextrender.usage()``. With a method whose markers
carry handles (``contextrender_plus``) the call offers the ``contextrender_expand`` tool and answers it in the
wrapper's bounded loop (:class:`~contextrender.wrapper._Expanding`; docs/service.md, "The expand tool").

A call that relies on state the API keeps (``previous_response_id``, ``conversation``, ``item_reference``
items) holds a history the wrapper never sees: it raises ``ValueError`` naming the argument, unless
:func:`contextrender.wrap` was given ``stateful_responses="passthrough"``, which sends such calls unchanged
and unrendered (logged once). ``responses.stream``/``parse``/``retrieve`` and the raw-response views are the
client's own, not rendered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from contextrender.billing import PromptUsage
from contextrender.events import MessageError
from contextrender.service import responses_api
from contextrender.service.errors import InvalidMessages
from contextrender.service.results import RenderResult
from contextrender.service.streams import ResponsesStreamAssembler
from contextrender.wrapper import (
    AsyncRecordingStream,
    ContextRenderState,
    ExpandingCall,
    LastRender,
    RecordingStream,
    _Expanding,
    _is_async,
    _plain,
    _Recorder,
    usage_object,
)

log = logging.getLogger(__name__)

#: The arguments of ``responses.create`` that make the API supply history from its own state.
STATEFUL_ARGS = ("previous_response_id", "conversation")


def _given(value: Any) -> bool:
    return value is not None and type(value).__name__ not in ("Omit", "NotGiven")  # the SDK's sentinels


def _stateful(kwargs: Mapping[str, Any], plain_input: Any) -> list[str]:
    body = {name: kwargs[name] for name in STATEFUL_ARGS if _given(kwargs.get(name))}
    body["input"] = plain_input
    return responses_api.stateful_fields(body)


def _plain_input(input_: Any) -> Any:
    """``input`` as the API reads it: a string as it is, a list's SDK item objects as dicts."""
    if isinstance(input_, str) or not _given(input_):
        return input_ if _given(input_) else None
    if isinstance(input_, (list, tuple)):
        return [_plain(item) for item in input_]
    return input_  # refused, naming it, by the conversion


def prepare(state: ContextRenderState, instructions: Any, input_: Any) -> tuple[str, Any]:
    """Sync and render a Responses API conversation; return (session id, the ``input`` to send).

    Raises:
        MessageError: ``instructions`` or ``input`` are not the Responses API's (nothing stored or sent).
    """
    res, sent = _prepare(state, instructions, input_)
    return res.session, sent


def _prepare(state: ContextRenderState, instructions: Any, input_: Any, *, offer_expand: bool = False,
             budget: int | None = None) -> tuple[RenderResult, Any]:
    """:func:`prepare`, returning the render; ``offer_expand``: this call answers the expand tool (the expand loop),
    ``budget``: the one to render at (default B)."""
    plain = _plain_input(input_)
    if not plain:
        raise MessageError("'input' must be a non-empty string or a non-empty list of input items")
    instructions = instructions if _given(instructions) else None
    asked: list[str] = []  # calls after outputs: whether they are the same model turn's, the stored answers say

    def unknown(call_id: str) -> frozenset[str]:
        asked.append(call_id)
        return frozenset()

    try:
        converted = responses_api.to_openai(instructions, plain, unknown)
        if asked:
            together = state.answered_together(list(converted.messages))
            converted = responses_api.to_openai(instructions, plain,
                                                lambda call_id: together.get(call_id, frozenset()))
    except InvalidMessages as e:
        raise MessageError(e.message) from None
    res = state.render(list(converted.messages), offer_expand=offer_expand, budget=budget)
    sent = responses_api.forwarded_input(plain, converted, res)
    if isinstance(plain, list):  # back to the caller's own objects where an item was an SDK object
        own = {id(p): item for p, item in zip(plain, input_, strict=True)}
        sent = [own.get(id(item), item) for item in sent]
    state.remember(res, sent if isinstance(sent, list) else [sent])
    return res, sent


def _as_items(sent: Any) -> list[Any]:
    """``input`` as a list of items (a string is the one user message it stands for), for rounds to follow it."""
    return list(sent) if isinstance(sent, (list, tuple)) else [{"role": "user", "content": sent}]


def _answer(out: Any) -> dict[str, Any] | None:
    """The OpenAI-format assistant message of a response (an SDK ``Response`` or a dict), None without output."""
    output = out.get("output") if isinstance(out, Mapping) else getattr(out, "output", None)
    if not isinstance(output, list) or not output:
        return None
    try:
        return responses_api.assistant_message([_plain(item) for item in output])
    except InvalidMessages as e:
        log.warning("answer not recorded: %s", e.message)
        return None


def _record_usage(state: ContextRenderState, render: LastRender | None, out: Any) -> None:
    """A whole response's usage (an SDK ``Response``'s or a dict's ``usage``) as billed, recorded for its call."""
    state.record_usage(render, "responses", responses_api.prompt_usage(usage_object(out)), streamed=False)


class WrappedResponses:
    """``client.responses``: ``create`` is rendered, everything else is the client's."""

    def __init__(self, inner: Any, state: ContextRenderState) -> None:
        self._inner = inner
        self._state = state

    def _refuse_or_pass(self, kwargs: Mapping[str, Any]) -> bool:
        """Whether the call relies on the API's state and is to go through unmanaged; raises if refused."""
        stateful = _stateful(kwargs, _plain_input(kwargs.get("input")))
        if not stateful:
            return False
        if self._state.stateful_responses != "passthrough":
            raise ValueError(f"this call relies on conversation state the API keeps ({', '.join(stateful)}): "
                             "contextrender never sees that history, so it cannot hold it under the budget. Pass "
                             "the whole conversation as 'input' instead, or wrap the client with "
                             "stateful_responses='passthrough' to send such calls unmanaged")
        if not self._state.warned_stateful:
            self._state.warned_stateful = True
            log.warning("responses.create relies on the API's state (%s): sent unmanaged, its history is not held "
                        "under B (stateful_responses='passthrough'; further ones are sent without this warning)",
                        ", ".join(stateful))
        return True

    def create(self, *args: Any, **kwargs: Any) -> Any:
        """The client's ``responses.create`` with ``input`` rendered under the budget; same arguments, same result.

        Returns:
            What the client returned (for an async client, a coroutine to await); a stream comes back as a
            :class:`~contextrender.wrapper.RecordingStream` / :class:`~contextrender.wrapper.AsyncRecordingStream`
            yielding the client's events.

        Raises:
            MessageError: ``input`` is not the Responses API's (nothing is stored or sent).
            ValueError: the call relies on the API's stored state and the wrapper refuses such calls.
            GraphError: the wrapper is closed, or another writer holds the session.
        """
        fn = self._inner.create
        if _is_async(fn):
            return self._acreate(fn, args, kwargs)
        if self._refuse_or_pass(kwargs):
            return fn(*args, **kwargs)
        res, sent = _prepare(self._state, kwargs.get("instructions"), kwargs.get("input"),
                             offer_expand=self._state.offers_expand(kwargs))
        loop = self._expand_loop(res, sent, kwargs)
        if loop is not None:
            return _Expanding(self._state, loop, fn, args, kwargs, self._expanding(loop, kwargs)).run()
        render = self._state.render_of(res.session)
        return self._finish(fn(*args, **{**kwargs, "input": sent}), res.session, kwargs.get("stream") is True, render)

    async def _acreate(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._refuse_or_pass(kwargs):
            return await fn(*args, **kwargs)
        # Syncing and rendering may embed results (CPU): off the event loop.
        res, sent = await asyncio.to_thread(_prepare, self._state, kwargs.get("instructions"), kwargs.get("input"),
                                            offer_expand=self._state.offers_expand(kwargs))
        loop = self._expand_loop(res, sent, kwargs)
        if loop is not None:
            return await _Expanding(self._state, loop, fn, args, kwargs, self._expanding(loop, kwargs)).arun()
        render = self._state.render_of(res.session)
        out = await fn(*args, **{**kwargs, "input": sent})
        return await self._afinish(out, res.session, kwargs.get("stream") is True, render)

    def _finish(self, out: Any, sid: str, stream: bool, render: LastRender | None) -> Any:
        """The caller's result: a recording stream, or the response after recording its answer and usage."""
        if stream:
            return RecordingStream(out, _Recorder(self._state, sid, ResponsesStreamAssembler, "responses", render))
        msg = _answer(out)
        if msg is not None:
            self._state.record(sid, msg)
        _record_usage(self._state, render, out)
        return out

    async def _afinish(self, out: Any, sid: str, stream: bool, render: LastRender | None) -> Any:
        if stream:
            return AsyncRecordingStream(out, _Recorder(self._state, sid, ResponsesStreamAssembler, "responses",
                                                       render))
        msg = _answer(out)
        if msg is not None:
            await asyncio.to_thread(self._state.record, sid, msg)
        await asyncio.to_thread(_record_usage, self._state, render, out)
        return out

    # -- the expand tool (docs/service.md, "The expand tool") -----------------------------

    def _expand_loop(self, res: RenderResult, sent: Any, kwargs: Mapping[str, Any]) -> Any:
        return self._state.expand_loop(res, responses_api.WIRE, _as_items(sent), kwargs)

    def _expanding(self, loop: Any, kwargs: Mapping[str, Any]) -> ExpandingCall:
        """The Responses API side of the expand loop (:class:`~contextrender.wrapper.ExpandingCall`)."""
        stream, sid, state = kwargs.get("stream") is True, loop.res.session, self._state

        def whole(out: Any) -> tuple[dict[str, Any] | None, Any, PromptUsage | None]:
            return _answer(out), responses_api.answer_output(_plain(out)), \
                responses_api.prompt_usage(usage_object(out))

        def rerender(budget: int) -> tuple[RenderResult, list[Any]]:
            res, sent = _prepare(state, kwargs.get("instructions"), kwargs.get("input"), offer_expand=True,
                                 budget=budget)
            return res, _as_items(sent)

        return ExpandingCall(
            streaming=lambda out: stream, whole=whole, assembler=ResponsesStreamAssembler,
            finish=lambda out, render: self._finish(out, sid, stream, render),
            afinish=lambda out, render: self._afinish(out, sid, stream, render),
            rerender=rerender, api="responses", stream=stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


__all__ = ["STATEFUL_ARGS", "WrappedResponses", "prepare"]
