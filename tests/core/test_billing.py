"""Billing arithmetic on hand-worked requests (docs/method.md §14): reads, writes, the minimum, the steps."""

from __future__ import annotations

import json

import pytest

from contextrender import billing
from contextrender.billing import (
    Block,
    Prices,
    PricesUnavailable,
    PromptCache,
    PromptUsage,
    chat_blocks,
    prices,
    profile_of,
)
from contextrender.tokens import TokenCounter


def blk(key: str, tokens: int, bp: bool = False, parts: int = 1) -> Block:
    return Block(key, tokens, parts, bp)


def test_openai_reads_the_longest_shared_prefix_from_1024_tokens_in_steps_of_128() -> None:
    cache = PromptCache("openai")
    assert cache.request([blk("sys", 1000), blk("a", 500)]) == PromptUsage(1500)  # nothing cached yet
    # 1,500 shared tokens: 1,024 + 3·128 = 1,408 read, 392 plain input
    u = cache.request([blk("sys", 1000), blk("a", 500), blk("b", 300)], output=7)
    assert (u.prompt, u.cache_read, u.cache_write, u.uncached, u.output) == (1800, 1408, 0, 392, 7)
    # a prefix under 1,024 tokens is never read
    assert cache.request([blk("sys", 1000), blk("x", 500)]).cache_read == 0
    # any earlier request's prefix counts, not only the previous one's
    assert cache.request([blk("sys", 1000), blk("a", 500), blk("b", 300), blk("c", 10)]).cache_read == 1792


def test_openai_a_changed_block_ends_the_read_even_when_later_blocks_match() -> None:
    cache = PromptCache("openai")
    cache.request([blk("sys", 2000), blk("a", 800), blk("b", 800)])
    u = cache.request([blk("sys", 2000), blk("A", 800), blk("b", 800)])
    assert u.cache_read == 1920  # 2,000 → 1,024 + 7·128


def test_anthropic_writes_at_breakpoints_and_reads_what_an_earlier_request_wrote() -> None:
    cache = PromptCache("anthropic")
    first = cache.request([blk("sys", 1200, True), blk("a", 500), blk("b", 300, True)])
    assert (first.cache_read, first.cache_write, first.uncached) == (0, 2000, 0)
    grown = cache.request([blk("sys", 1200, True), blk("a", 500), blk("b", 300), blk("c", 100, True)])
    assert (grown.cache_read, grown.cache_write, grown.uncached) == (2000, 100, 0)
    # a change after the system prompt: only the system breakpoint's entry is read, the rest written again
    changed = cache.request([blk("sys", 1200, True), blk("z", 500), blk("c", 100, True)])
    assert (changed.cache_read, changed.cache_write) == (1200, 600)


def test_anthropic_tokens_after_the_last_breakpoint_are_plain_input() -> None:
    cache = PromptCache("anthropic")
    u = cache.request([blk("sys", 1500, True), blk("a", 400), blk("q", 100)])
    assert (u.cache_read, u.cache_write, u.uncached) == (0, 1500, 500)


def test_anthropic_minimum_prefix_and_breakpoint_cap() -> None:
    cache = PromptCache("anthropic")
    small = cache.request([blk("sys", 300, True), blk("a", 500, True)])
    assert (small.cache_read, small.cache_write, small.uncached) == (0, 0, 800)  # under 1,024: not cached
    assert cache.request([blk("sys", 300, True), blk("a", 500, True)]).cache_read == 0
    with pytest.raises(ValueError, match="at most 4"):
        cache.request([blk(str(i), 10, True) for i in range(5)])


def test_anthropic_lookback_finds_an_entry_only_within_20_blocks_of_a_breakpoint() -> None:
    head = [blk("sys", 2000)]
    body = [blk(f"m{i}", 10) for i in range(30)]
    cache = PromptCache("anthropic")
    cache.request([*head, *body[:5], blk("end", 10, True)])  # writes the prefix through m4 + end
    # 25 new blocks after it, one breakpoint at the end: the entry is 26 blocks back, out of reach
    far = cache.request([*head, *body[:5], blk("end", 10), *[blk(f"n{i}", 10) for i in range(25)],
                         blk("last", 10, True)])
    assert far.cache_read == 0
    # with a breakpoint on the system prompt too (as clients place it), that prefix is found at once
    cache2 = PromptCache("anthropic")
    cache2.request([blk("sys", 2000, True), *body[:5], blk("end", 10, True)])
    near = cache2.request([blk("sys", 2000, True), *body[:5], blk("end", 10), *[blk(f"n{i}", 10) for i in range(25)],
                           blk("last", 10, True)])
    assert near.cache_read == 2000


def test_no_caching_profile_bills_everything_as_input() -> None:
    assert PromptCache("none").request([blk("a", 5000, True)], output=3) == PromptUsage(5000, 0, 0, 3)


def test_chat_blocks_place_the_breakpoints_a_client_places() -> None:
    counter = TokenCounter()
    msgs = [{"role": "system", "content": "policy " * 400}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "result"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    blocks = chat_blocks(msgs, tools, counter)
    assert [b.breakpoint for b in blocks] == [False, True, False, False, True]
    assert blocks[0].tokens == counter.text(json.dumps(tools))
    assert [b.tokens for b in blocks[1:]] == [counter.message(m) for m in msgs]
    assert blocks[3].parts == 2  # an assistant message and its tool call
    no_system = chat_blocks(msgs[1:], tools, counter)
    assert [b.breakpoint for b in no_system] == [True, False, False, True]


def test_prices_come_from_the_cost_map_and_a_missing_cache_price_is_the_input_price() -> None:
    table = {"m-cached": {"input_cost_per_token": 2e-6, "output_cost_per_token": 8e-6,
                          "cache_read_input_token_cost": 5e-7, "litellm_provider": "openai"},
             "m-plain": {"input_cost_per_token": 1e-6, "litellm_provider": "other"},
             "claude-x": {"input_cost_per_token": 3e-6, "cache_read_input_token_cost": 3e-7,
                          "cache_creation_input_token_cost": 3.75e-6, "litellm_provider": "anthropic"}}
    p = prices("openai/m-cached", table)
    assert (p.model, p.input, p.cache_read, p.cache_write, p.output) == ("m-cached", 2e-6, 5e-7, 2e-6, 8e-6)
    assert prices("m-plain", table).cache_read == 1e-6
    assert [profile_of(m, table) for m in ("m-cached", "m-plain", "claude-x", "unknown")] == \
        ["openai", "none", "anthropic", "none"]
    with pytest.raises(PricesUnavailable, match="no prices for 'nope'"):
        prices("nope", table)
    # 1,000 read, 200 written, 300 plain, 50 out at Anthropic's ratios: 0.1x, 1.25x, 1x
    u = PromptUsage(1500, 1000, 200, 50)
    claude = prices("claude-x", table)
    assert claude.cost(u) == pytest.approx(1000 * 3e-7 + 200 * 3.75e-6 + 300 * 3e-6)


def test_the_shipped_snapshot_is_the_pinned_litellm_map_cut_to_the_billed_fields() -> None:
    # An install without litellm bills from the snapshot: it must give the same dollars as litellm's map.
    pytest.importorskip("litellm")
    source = billing.litellm_cost_map_path()
    assert source is not None
    shipped = billing.load_snapshot()
    assert shipped["litellm"] == billing.litellm_version(), "regenerate: python scripts/cost_map_snapshot.py"
    assert shipped == billing.snapshot_of(billing._load_cost_map(source), billing.litellm_version()), \
        "regenerate: python scripts/cost_map_snapshot.py"
    for model in ("claude-sonnet-4-5", "gpt-4.1", "gpt-5", "gpt-4o"):
        assert prices(model, billing._load_cost_map(billing.SNAPSHOT)) == prices(model, billing._load_cost_map(source))


def test_without_litellm_or_an_override_the_snapshot_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(billing.COST_MAP_ENV, raising=False)
    monkeypatch.setattr(billing, "litellm_cost_map_path", lambda: None)
    assert billing.cost_map_path() == billing.SNAPSHOT
    assert profile_of("claude-sonnet-4-5") == "anthropic" and profile_of("gpt-4.1") == "openai"
    own = tmp_path / "costs.json"
    own.write_text(json.dumps({"my-model": {"input_cost_per_token": 1e-6, "litellm_provider": "mine"}}))
    monkeypatch.setenv(billing.COST_MAP_ENV, str(own))
    assert prices("my-model").input == 1e-6
    broken = tmp_path / "broken.json"
    broken.write_text('{"my-model": {')
    monkeypatch.setenv(billing.COST_MAP_ENV, str(broken))
    with pytest.raises(PricesUnavailable, match=r"not JSON \(line 1, column"):
        prices("my-model")


def test_shipped_cost_map_prices_the_profiles_default_models() -> None:
    sonnet, gpt = prices("claude-sonnet-4-5"), prices("gpt-4.1")
    assert sonnet.cache_read == pytest.approx(0.1 * sonnet.input)
    assert sonnet.cache_write == pytest.approx(1.25 * sonnet.input)
    assert gpt.cache_read == pytest.approx(0.25 * gpt.input)
    assert isinstance(gpt, Prices) and profile_of("gpt-4.1") == "openai" and profile_of("claude-sonnet-4-5") == "anthropic"


def test_a_request_that_changed_a_message_marks_the_last_one_it_kept() -> None:
    """docs/method.md §14: the unchanged prefix is looked up where it ends, not 20 blocks back from the end."""
    counter = TokenCounter()
    sys = {"role": "system", "content": "policy " * 1500}
    turns = [{"role": "user", "content": f"turn {i} " * 30} for i in range(30)]
    first = [sys, *turns]
    changed = [sys, *turns[:5], {"role": "user", "content": "rewritten"}, *turns[6:]]
    blocks = chat_blocks(changed, None, counter, previous=first)
    assert [i for i, b in enumerate(blocks) if b.breakpoint] == [0, 5, len(blocks) - 1]
    assert [i for i, b in enumerate(chat_blocks(first + turns[:1], None, counter, previous=first))
            if b.breakpoint] == [0, len(first)]  # only appended: nothing changed, no third breakpoint
    # billed: a request that ended at turn 4 wrote that prefix; the changed request finds it from its new breakpoint,
    # 26 blocks before its end (the breakpoint at the end alone looks back 20)
    cache = PromptCache("anthropic")
    for n in (6, 31):
        cache.request(chat_blocks([sys, *turns[:n - 1]], None, counter))
    u = cache.request(blocks)
    assert u.cache_read == sum(b.tokens for b in blocks[:6])
