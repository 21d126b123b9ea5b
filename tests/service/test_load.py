"""Bounded load test of the proxy on loopback: 8 concurrent sessions x 10 turns.

Checks that no message is lost and every session's graph matches its client's
history, then records throughput and the latency the proxy adds over calling
the fake upstream directly (``results/bench/proxy_load.json`` when
CONTEXTRENDER_PROXY_LOAD_OUT points there). Everything
(client, proxy, fake upstream) shares one process and its GIL, so the numbers
are an upper bound on the proxy's overhead, not a provider benchmark.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from contextrender import HashingEmbedder
from contextrender.service.proxy import create_proxy_app
from contextrender.service.sessions import ContextService

from .conftest import SYSTEM, history_tokens, serve, sse_message, tool_result
from .test_proxy import TOOLS

REPO = Path(__file__).resolve().parents[2]
# The committed numbers are refreshed on request only: a test run must not edit tracked files.
OUT = Path(os.environ["CONTEXTRENDER_PROXY_LOAD_OUT"]) if os.environ.get("CONTEXTRENDER_PROXY_LOAD_OUT") else None
N_SESSIONS, TURNS, BUDGET = 8, 10, 1500


async def agent(client: httpx.AsyncClient, url: str, k: int, stream: bool, tag: str) -> tuple[list[dict], list[float]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"Load {tag} session {k}: follow REC_start."}]
    lat = []
    for turn in range(TURNS):
        body = {"model": "fake-model", "messages": messages, "tools": TOOLS, "user": f"{tag}{k}", "stream": stream}
        headers = {"X-ContextRender-Session": f"{tag}-{k}"}
        t0 = time.perf_counter()
        if stream:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status_code == 200
                raw = b"".join([c async for c in r.aiter_raw()])
            msg = sse_message(raw)
        else:
            r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
        lat.append(time.perf_counter() - t0)
        messages.append(msg)
        for j, call in enumerate(msg.get("tool_calls") or []):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_result(f"{tag}{k}", turn, j, call)})
    return messages, lat


async def run_all(url: str, stream: bool, tag: str, n: int = N_SESSIONS) -> tuple[list[list[dict]], list[float], float]:
    limits = httpx.Limits(max_connections=2 * N_SESSIONS)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.wait_for(
            asyncio.gather(*(agent(client, url, k, stream, tag) for k in range(n))), timeout=300)
        wall = time.perf_counter() - t0
    return [m for m, _ in results], [x for _, lat in results for x in lat], wall


def summary(lat: list[float], wall: float) -> dict[str, float]:
    ms = sorted(1e3 * x for x in lat)
    return {"requests": len(ms), "wall_s": round(wall, 3), "requests_per_s": round(len(ms) / wall, 1),
            "latency_ms_mean": round(statistics.fmean(ms), 2), "latency_ms_p50": round(ms[len(ms) // 2], 2),
            "latency_ms_p95": round(ms[int(0.95 * (len(ms) - 1))], 2), "latency_ms_max": round(ms[-1], 2)}


def check_graph(service: ContextService, histories: list[list[dict]], tag: str) -> None:
    for k, msgs in enumerate(histories):
        stored = list(service.transcript(f"{tag}-{k}").messages)
        n_tail = len(list(itertools.takewhile(lambda m: m["role"] == "tool", reversed(msgs))))  # never sent
        expected = msgs[:len(msgs) - n_tail]
        assert len(stored) == len(expected) == 2 + 2 * TURNS - 1
        for s, e in zip(stored, expected, strict=True):
            assert s["role"] == e["role"] and (s["content"] or "") == (e["content"] or "")
            assert s.get("tool_calls") == e.get("tool_calls") and s.get("tool_call_id") == e.get("tool_call_id")


def test_proxy_load(fake_upstream, tmp_path):
    fake, up_url = fake_upstream
    # One session alone: the per-request overhead without queueing behind other sessions.
    _, seq_direct, seq_direct_wall = asyncio.run(run_all(up_url, False, "seqdirect", n=1))
    direct_hist, direct_lat, direct_wall = asyncio.run(run_all(up_url, False, "direct"))
    assert len(fake.requests) == N_SESSIONS * TURNS + TURNS
    fake.requests.clear()

    service = ContextService(str(tmp_path / "load.sqlite"), embedder=HashingEmbedder(dim=256), default_budget=BUDGET)
    results: dict[str, Any] = {}
    with serve(create_proxy_app(f"{up_url}/v1", service=service, budget=BUDGET)) as url:
        _, seq_proxy, seq_proxy_wall = asyncio.run(run_all(url, False, "seqproxy", n=1))
        fake.requests.clear()
        for stream in (False, True):
            tag = "stream" if stream else "plain"
            hist, lat, wall = asyncio.run(run_all(url, stream, tag))
            got = list(fake.requests)
            fake.requests.clear()
            assert len(got) == N_SESSIONS * TURNS  # no request lost or duplicated
            assert max(history_tokens(r["body"]["messages"]) for r in got) <= BUDGET
            check_graph(service, hist, tag)
            results[tag] = summary(lat, wall)
    service.close()
    assert max(history_tokens(h) for h in direct_hist) > BUDGET  # the load exercised selection

    direct = summary(direct_lat, direct_wall)
    seq = {"direct": summary(seq_direct, seq_direct_wall), "proxy": summary(seq_proxy, seq_proxy_wall)}
    report = {
        "schema": 1,
        "what": "loopback proxy load: concurrent sessions x turns, fake OpenAI upstream in the same process",
        "config": {"sessions": N_SESSIONS, "turns": TURNS, "budget": BUDGET, "method": "contextrender",
                   "embedding": "hashing-256", "tool_result_tokens": history_tokens(
                       [{"role": "tool", "tool_call_id": "x", "content": tool_result("s", 0, 0, {"function": {
                           "arguments": json.dumps({"record": "REC_x"})}})}])},
        "single_session": seq,
        "direct": direct,
        "proxy_non_streaming": results["plain"],
        "proxy_streaming": results["stream"],
        "added_latency_ms": {
            "single_session_mean": round(seq["proxy"]["latency_ms_mean"] - seq["direct"]["latency_ms_mean"], 2),
            "single_session_p50": round(seq["proxy"]["latency_ms_p50"] - seq["direct"]["latency_ms_p50"], 2),
            "non_streaming_mean": round(results["plain"]["latency_ms_mean"] - direct["latency_ms_mean"], 2),
            "non_streaming_p50": round(results["plain"]["latency_ms_p50"] - direct["latency_ms_p50"], 2),
            "streaming_mean": round(results["stream"]["latency_ms_mean"] - direct["latency_ms_mean"], 2),
            "streaming_p50": round(results["stream"]["latency_ms_p50"] - direct["latency_ms_p50"], 2),
        },
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "git_sha": _git_sha(),
    }
    out = OUT or tmp_path / "proxy_load.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def _git_sha() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
