"""The agent's search tool: a client for any Search-R1-style ``/retrieve`` server.

:class:`RetrieverClient` posts ``{"queries", "topk", "return_scores": true}``
and reads either response shape (entries ``{"document": {...}, "score"}`` or
bare documents). Documents in Search-R1's Wikipedia dump carry
``contents = '"Title"\\nText'``; the title is split off for display.
:class:`WikipediaSearchTool` is the ``wikipedia_search(query, n_results=3)``
tool the smolagents agent calls from its code.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
from smolagents import Tool

MAX_RESULTS = 10


class RetrieverError(RuntimeError):
    """The retriever could not be reached or answered in an unknown shape."""


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    score: float | None = None


def retrieve_url(url: str) -> str:
    """Accept a base URL (``http://host:port``) or the full ``…/retrieve`` endpoint."""
    url = url.rstrip("/")
    return url if url.endswith("/retrieve") else url + "/retrieve"


def split_title(contents: str) -> tuple[str, str]:
    """Search-R1 stores ``"Title"\\ntext``; anything else has no title."""
    head, sep, rest = contents.partition("\n")
    if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        return head[1:-1], rest.strip()
    return "", contents.strip()


def _passage(entry: Any, where: str) -> Passage:
    score = None
    doc = entry
    if isinstance(entry, dict) and isinstance(entry.get("document"), dict):
        doc, score = entry["document"], entry.get("score")
    if not isinstance(doc, dict):
        raise RetrieverError(f"{where}: expected a document object, got {type(doc).__name__}")
    contents = doc.get("contents")
    if contents is not None:
        title, text = split_title(str(contents))
    else:
        title, text = str(doc.get("title") or ""), str(doc.get("text") or "")
    if not title and doc.get("title"):
        title = str(doc["title"])
    return Passage(str(doc.get("id", doc.get("_id", ""))), title, text,
                   float(score) if isinstance(score, (int, float)) else None)


class RetrieverClient:
    """Batch client for ``POST /retrieve`` with a few retries on connection errors."""

    def __init__(self, url: str, *, timeout_s: float = 60.0, retries: int = 3) -> None:
        self.url = retrieve_url(url)
        self.timeout_s = timeout_s
        self.retries = retries
        self._http = httpx.Client(timeout=timeout_s, trust_env=False)

    def search(self, queries: list[str], topk: int) -> list[list[Passage]]:
        body = {"queries": list(queries), "topk": int(topk), "return_scores": True}
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.post(self.url, json=body)
                resp.raise_for_status()
                data = resp.json()
                break
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                last = exc
                if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code < 500:
                    raise RetrieverError(f"{self.url}: HTTP {exc.response.status_code}: {exc.response.text[:300]}") from exc
                time.sleep(0.5 * 2 ** attempt)
        else:
            raise RetrieverError(f"{self.url}: no answer after {self.retries + 1} tries: {last}") from last
        result = data.get("result") if isinstance(data, dict) else data
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrieverError(f"{self.url}: expected {{'result': [one list per query]}}, got {str(data)[:300]}")
        return [[_passage(e, f"{self.url} result[{i}][{j}]") for j, e in enumerate(per_query)]
                for i, per_query in enumerate(result)]

    def close(self) -> None:
        self._http.close()


def format_passages(passages: list[Passage]) -> str:
    """What the agent sees: numbered passages with their titles."""
    if not passages:
        return "No results found."
    blocks = []
    for i, p in enumerate(passages, start=1):
        head = f"[{i}] {p.title}" if p.title else f"[{i}]"
        blocks.append(f"{head}\n{p.text}")
    return "\n\n".join(blocks)


class WikipediaSearchTool(Tool):
    name = "wikipedia_search"
    description = ("Searches Wikipedia and returns the passages that best match the query, each with its "
                   "article title. Use short keyword queries naming the entity and what you look for.")
    inputs = {
        "query": {"type": "string", "description": "The search query."},
        "n_results": {"type": "integer", "description": "How many passages to return (default 3).",
                      "nullable": True},
    }
    output_type = "string"

    def __init__(self, client: RetrieverClient, default_n: int = 3) -> None:
        super().__init__()
        self.client = client
        self.default_n = default_n

    def forward(self, query: str, n_results: int | None = 3) -> str:
        n = self.default_n if n_results is None else max(1, min(int(n_results), MAX_RESULTS))
        return format_passages(self.client.search([str(query)], n)[0])
