"""Adapters that put ContextRender in front of an agent's model calls (docs/method.md §9).

- :mod:`.http_client` — a small client for the server API (``contextrender serve``);
  :class:`~.http_client.InProcessClient` offers the same calls without HTTP.
- :mod:`.smolagents` — :class:`ContextRenderModel`, a wrapper around any smolagents Model.
- :mod:`.anthropic_client` — :func:`contextrender.wrap` for ``anthropic.Anthropic`` / ``AsyncAnthropic``.
- :mod:`.appworld` — :class:`ContextRenderTrimMixin`, overriding AppWorld ReAct's ``trimmed_messages``.
- ``integrations/opencode/`` (repository root) — the opencode plugin.
- :mod:`contextrender.service.proxy` — for runtimes that only speak the OpenAI or the Anthropic API.

Submodules are imported on demand, so using one never imports another's framework.
"""
