"""ContextRender as a separate service (docs/method.md §9).

- :mod:`~contextrender.service.sessions`: the session library (:class:`~contextrender.service.sessions.ContextService`),
  with its typed results (:mod:`~contextrender.service.results`) and errors (:mod:`~contextrender.service.errors`);
- :mod:`~contextrender.service.streams`: the forwarding rule and the assembly of streamed answers;
- :mod:`~contextrender.service.server` and :mod:`~contextrender.service.proxy`: the HTTP server and the
  OpenAI-compatible proxy over it, behind :mod:`~contextrender.service.guard` (access control).
"""
