"""The litellm model layer against a scripted custom provider (real litellm, no network)."""

from __future__ import annotations

import litellm
import pytest
from litellm import CustomLLM
from litellm.types.utils import ModelResponse

from contextrender.experiments.runtime.models import LiteLLMModel, TransientModelError


class Scripted(CustomLLM):
    """Answers from a script; can fail the first ``fail`` calls with a rate limit."""

    def __init__(self, fail: int = 0, error=None) -> None:  # noqa: ANN001
        super().__init__()
        self.calls = 0
        self.fail = fail
        self.error = error
        self.seen: list[dict] = []

    def completion(self, *args, **kwargs):  # noqa: ANN002, ANN003
        self.calls += 1
        self.seen.append(kwargs)
        if self.calls <= self.fail:
            if self.error is not None:
                raise self.error("bad request")
            raise litellm.RateLimitError("slow down", llm_provider="scripted", model="m")
        return ModelResponse(
            choices=[{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "calling",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "search", "arguments": '{"q": "x"}'}}]}}],
            usage={"prompt_tokens": 1500, "completion_tokens": 7, "total_tokens": 1507,
                   "prompt_tokens_details": {"cached_tokens": 1024}})


@pytest.fixture
def scripted():
    def install(handler: Scripted) -> Scripted:
        litellm.custom_provider_map = [{"provider": "scripted", "custom_handler": handler}]
        litellm.utils.custom_llm_setup()
        return handler
    yield install
    litellm.custom_provider_map = []


MSGS = [{"role": "user", "content": "find x"}]


def test_usage_tool_calls_and_decoding_params(scripted, tmp_path):
    h = scripted(Scripted())
    m = LiteLLMModel("scripted/m", cache_path=tmp_path / "c.sqlite")
    c = m.complete(MSGS, tools=[{"type": "function", "function": {"name": "search", "parameters": {}}}])
    assert c.usage.input == 1500 and c.usage.output == 7 and c.usage.cached == 1024
    assert c.message["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "x"}'}
    # docs/method.md §8: temperature 0, top-p 1, seed 42 reach the provider
    sent = h.seen[0]
    assert sent["optional_params"].get("temperature") == 0.0 or sent.get("temperature") == 0.0


def test_cache_second_run_makes_no_call(scripted, tmp_path):
    h = scripted(Scripted())
    path = tmp_path / "c.sqlite"
    first = LiteLLMModel("scripted/m", cache_path=path).complete(MSGS)
    again = LiteLLMModel("scripted/m", cache_path=path)  # a new process would see the same file
    second = again.complete(MSGS)
    assert h.calls == 1 and again.calls == 0
    assert second == first  # same message and the recorded usage (costs do not depend on the cache)
    LiteLLMModel("scripted/m", cache_path=path, seed=7).complete(MSGS)
    assert h.calls == 2  # a different request is not a hit


def test_retries_rate_limits_with_backoff(scripted, tmp_path):
    h = scripted(Scripted(fail=2))
    m = LiteLLMModel("scripted/m", cache=False, backoff_s=0.01)
    assert m.complete(MSGS).usage.output == 7
    assert h.calls == 3


def test_gives_up_after_max_retries(scripted):
    scripted(Scripted(fail=10))
    with pytest.raises(TransientModelError):
        LiteLLMModel("scripted/m", cache=False, backoff_s=0.001, max_retries=2).complete(MSGS)


def test_non_transient_errors_are_not_retried(scripted):
    def bad_request(msg: str) -> Exception:
        return litellm.BadRequestError(msg, model="m", llm_provider="scripted")

    h = scripted(Scripted(fail=5, error=bad_request))
    with pytest.raises(litellm.BadRequestError):
        LiteLLMModel("scripted/m", cache=False, backoff_s=0.001).complete(MSGS)
    assert h.calls == 1


class ScriptedAnthropicUsage(Scripted):
    """Reports usage as litellm gives an Anthropic answer: every prompt token, of them the cache reads and writes."""

    def completion(self, *args, **kwargs):  # noqa: ANN002, ANN003
        resp = super().completion(*args, **kwargs)
        resp.usage = litellm.types.utils.Usage(prompt_tokens=3000, completion_tokens=9, total_tokens=3009,
                                               cache_read_input_tokens=2000, cache_creation_input_tokens=800)
        return resp


def test_a_providers_cache_reads_and_writes_are_recorded(scripted, tmp_path):
    """docs/method.md §14: a live answer's usage carries the provider's own cache reads and writes."""
    scripted(ScriptedAnthropicUsage())
    u = LiteLLMModel("scripted/m", cache=False).complete(MSGS).usage
    assert (u.input, u.cached, u.cache_write, u.output) == (3000, 2000, 800, 9)
    assert u.to_dict()["cache_write"] == 800
