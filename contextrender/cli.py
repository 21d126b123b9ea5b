"""``contextrender`` command line: run the server or the proxy, export a session.

    contextrender serve  --port 8765 [--graph PATH] [--method NAME] [--budget N] [--embedding local|hashing|litellm]
    contextrender proxy  --upstream URL --budget N --method NAME --port 8766 [--graph PATH] [--override KEY=VALUE]
    contextrender export SESSION [--graph PATH] [--out FILE]
    contextrender replay TRACES... --budget N --methods a,b [--embedding local|hashing|litellm] [--output FILE]
                         [--format markdown|json] [--lenient] [--trace-format auto|contextrender|tau2|taubench|bfcl]
                         [--benchmark NAME]
    contextrender explain SESSION --budget N [--graph PATH] [--method NAME] [--compare prune,...]
    contextrender view SESSION|TRACES --budget N [--graph PATH] [--episode ID] [--methods a,b] [--out FILE]

Both servers bind 127.0.0.1 unless ``--host`` says otherwise, accept only
loopback ``Host`` names (plus ``--allow-host``) and no browser origin (unless
``--allow-origin``), and require an access token when one is configured
(``$CONTEXTRENDER_TOKEN`` or ``--token-file``; see contextrender/guard.py).
``replay`` measures Later-Used Result Recall on trace files — files,
directories or globs; the format ``export`` writes, τ² Results, τ-bench (v1)
results or BFCL multi-turn result files, recognised by content or forced with
``--trace-format`` — with any registry methods; it needs the ``[service]``
extra and prints the recall table (``--output`` also writes the JSON).
Errors in the arguments or the trace files (``file:line`` or
``file: simulations[i]``) exit with status 2.
Every log line goes through :func:`contextrender.redact.redact`. The graph
defaults to ``$CONTEXTRENDER_GRAPH`` or ``contextrender.sqlite`` in the
working directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from contextrender import offline
from contextrender.files import LockedError, open_private
from contextrender.redact import configure_logging, redact, register_secret
from contextrender.service.guard import TOKEN_ENV

DEFAULT_GRAPH = "contextrender.sqlite"


def _graph_default() -> str:
    return os.environ.get("CONTEXTRENDER_GRAPH", DEFAULT_GRAPH)


def _override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with a JSON scalar value; the method's tunable keys are checked at start-up."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{key}: value {raw!r} is not a number or true/false") from None
    return key, value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _method_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated method names, got {text!r}")
    return names


def _common(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--graph", default=None, help="context-graph SQLite file (default $CONTEXTRENDER_GRAPH or "
                                                 f"./{DEFAULT_GRAPH})")
    p.add_argument("--method", default="contextrender", help="default policy: any conf/method/<name>.yaml")
    p.add_argument("--budget", type=_positive_int, default=6000, help="default history budget B in tokens")
    p.add_argument("--embedding", default="local", choices=["local", "litellm", "hashing"])
    p.add_argument("--compactor", default="extractive", choices=["extractive", "llm"],
                   help="oversized-result fallback (docs/method.md §5 step 5)")
    p.add_argument("--max-body-mb", type=float, default=20.0, help="request body limit (413 above)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="accept this Host name besides loopback and the bound address (repeatable; '*' = any, "
                        "only behind a reverse proxy that checks Host)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="accept browser requests from this origin, e.g. http://localhost:3000 (repeatable)")
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help=f"require this access token (file content) on every request but /health; "
                        f"default: ${TOKEN_ENV} if set")


def build_parser() -> argparse.ArgumentParser:
    from contextrender import __version__

    parser = argparse.ArgumentParser(prog="contextrender", description="ContextRender as a service (docs/method.md §9).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the ContextRender server (session API)")
    _common(s, 8765)

    p = sub.add_parser("proxy", help="run the OpenAI-compatible proxy")
    _common(p, 8766)
    p.add_argument("--upstream", required=True, help="upstream OpenAI base URL, e.g. https://api.openai.com/v1")
    p.add_argument("--override", type=_override, action="append", default=[], metavar="KEY=VALUE",
                   help="method config override (dotted key, JSON value), repeatable")
    p.add_argument("--api-key-env", default="CONTEXTRENDER_UPSTREAM_API_KEY",
                   help="env var holding the upstream key, sent when the client sends no Authorization")
    p.add_argument("--force-upstream-key", action="store_true",
                   help="send the env key even when the client sent its own Authorization")
    p.add_argument("--timeout", type=float, default=600.0, help="upstream read timeout in seconds")
    p.add_argument("--no-session-api", action="store_true",
                   help="do not mount the session API (/sessions/...: full transcripts) on the proxy")

    e = sub.add_parser("export", help="write a session as a replay-trace line (experiments/evaluation/traces.py format)")
    e.add_argument("session")
    e.add_argument("--graph", default=None)
    e.add_argument("--out", default=None, help="append the line to FILE (default: stdout)")

    r = sub.add_parser("replay", help="Later-Used Result Recall of methods replayed over trace files")
    r.add_argument("traces", nargs="+", metavar="TRACES",
                   help="trace file, directory (recursively) or glob; our JSONL, tau2 Results JSON, tau-bench (v1) "
                        "results or BFCL multi-turn *_result.json (recognised by content)")
    r.add_argument("--budget", type=_positive_int, required=True, help="history budget B in tokens")
    r.add_argument("--methods", type=_method_list, required=True, metavar="A,B",
                   help="comma-separated registry methods (conf/method/<name>.yaml)")
    r.add_argument("--embedding", default="local", choices=["local", "hashing", "litellm"])
    r.add_argument("--compactor", default="extractive", choices=["extractive", "llm"])
    r.add_argument("--output", default=None, metavar="FILE", help="also write the result as JSON to FILE")
    r.add_argument("--format", default="markdown", choices=["markdown", "json"], help="what to print on stdout")
    r.add_argument("--lenient", action="store_true",
                   help="skip malformed trace records (counted) instead of failing")
    r.add_argument("--trace-format", default="auto", choices=["auto", "contextrender", "tau2", "taubench", "bfcl"],
                   help="format of the trace files (default: recognised by content)")
    r.add_argument("--benchmark", default=None, metavar="NAME",
                   help="the traces' benchmark, for settings that depend on it (ACON's thresholds: moqa8* uses "
                        "2048/400); default: the one the trace files record")
    r.add_argument("--no-ceiling", action="store_true",
                   help="leave out the hindsight ceilings (the most reuse events any selector with the same "
                        "budget scope and verbatim trim could cover, and the same under the prose-first trim "
                        "when a method uses it; reported beside the methods, not policies)")
    r.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])

    x = sub.add_parser("explain", help="why each tool result of a stored session is or is not rendered at B")
    x.add_argument("session")
    x.add_argument("--budget", type=_positive_int, required=True, help="history budget B in tokens")
    x.add_argument("--graph", default=None, help="graph file (read from a copy: a running service is undisturbed)")
    x.add_argument("--method", default="contextrender", help="a ContextRender-family registry method")
    x.add_argument("--compare", type=_method_list, default=[], metavar="A,B",
                   help="other registry methods to show side by side (kept / omitted)")
    x.add_argument("--embedding", default="local", choices=["local", "hashing", "litellm"])

    v = sub.add_parser("view", help="one self-contained HTML page of a session: results, reuse edges, states")
    v.add_argument("source", help="a session id in --graph, or a trace file (any format replay reads)")
    v.add_argument("--budget", type=_positive_int, required=True, help="history budget B in tokens")
    v.add_argument("--graph", default=None, help="graph file holding the session (read from a copy)")
    v.add_argument("--episode", default=None, help="which episode of a trace file (task id; default the first)")
    v.add_argument("--methods", type=_method_list, default=["contextrender", "prune"], metavar="A[,B]",
                   help="one or two registry methods to show (default contextrender,prune)")
    v.add_argument("--embedding", default="local", choices=["local", "hashing", "litellm"])
    v.add_argument("--out", default=None, help="HTML file to write (default <episode or session id>.view.html, in the working directory)")
    return parser


def _serve(app: Any, args: argparse.Namespace) -> None:
    import uvicorn

    # log_config=None: uvicorn's loggers propagate to the root handler, which redacts every line.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, log_config=None)


def _access(args: argparse.Namespace) -> Any:
    from contextrender.service.guard import AccessPolicy

    token = None
    if args.token_file:
        token = Path(args.token_file).read_text(encoding="utf-8").strip()
        if not token:
            raise SystemExit(f"contextrender: token file {args.token_file} is empty")
    elif os.environ.get(TOKEN_ENV):
        token = os.environ[TOKEN_ENV].strip()
    try:
        policy = AccessPolicy.for_bind(args.host, allowed_hosts=args.allow_host, allowed_origins=args.allow_origin,
                                       token=token)
    except ValueError as e:
        raise SystemExit(f"contextrender: {e}") from None
    register_secret(token)  # masked in every log line, whatever query name or header carried it
    if args.command == "proxy":
        register_secret(os.environ.get(args.api_key_env))
    exposed = args.host not in ("127.0.0.1", "localhost", "::1") or policy.any_host
    if exposed and token is None:
        logging.getLogger("contextrender").warning(
            "listening on %s%s without an access token: anyone who can reach the port can read transcripts%s",
            args.host, " for any Host name" if policy.any_host else "",
            " and spend the upstream key" if args.command == "proxy" else "")
    return policy


def _find_session(graph: Any, name: str, path: str) -> str:
    """The session ``name`` names in ``graph``: the id itself, or a harness record key's latest attempt
    (the runner names an episode's session ``<record key>#<attempt>``). ValueError lists some that exist."""
    from contextrender.graph import attempt_of

    ids = graph.session_ids()
    if name in ids:
        return name
    attempts = [(a[1], s) for s in ids if (a := attempt_of(s)) is not None and a[0] == name]
    if attempts:
        return max(attempts)[1]
    some = ", ".join(repr(s) for s in sorted(ids)[:3])
    listed = f"; it holds {len(ids)}, e.g. {some}" if ids else "; it holds none"
    raise ValueError(f"no session {name!r} in {path}{listed} (a harness run's graph names each episode "
                     "'<record key>#<attempt>'; its record key alone picks the latest attempt)")


def _export(args: argparse.Namespace) -> int:
    from contextrender.graph import ContextGraph
    from contextrender.trace_line import trace_line_text

    path = args.graph or _graph_default()
    if not Path(path).is_file():
        print(f"contextrender export: no graph file {path}", file=sys.stderr)
        return 2
    with ContextGraph.snapshot(path) as graph:  # a copy: never writes to (or waits on) a running service's file
        try:
            sid = _find_session(graph, args.session, path)
        except ValueError as e:
            print(f"contextrender export: {e}", file=sys.stderr)
            return 2
        session = graph.session(sid)
        line = trace_line_text(sid, session.openai_messages())
    if args.out:
        with open_private(args.out, "a") as f:  # a transcript: owner-only, like the graph
            f.write(line + "\n")
    else:
        sys.stdout.write(line + "\n")
    return 0


#: Appended to a missing-extra error of the default embedder: every command that embeds takes --embedding.
HASHING_HINT = " (or use --embedding hashing: lexical, no model)"


def _embedder(name: str, **kw: object) -> object:
    """make_embedder, its missing-extra error naming the dependency-free alternative too."""
    from contextrender.embed import make_embedder

    try:
        return make_embedder(name, **kw)  # type: ignore[arg-type]
    except ImportError as e:
        raise ImportError(f"{e}{HASHING_HINT}") from None


def _explain(args: argparse.Namespace) -> int:
    from contextrender.graph import ContextGraph, GraphError
    from contextrender.render import Scope

    path = args.graph or _graph_default()
    try:
        from contextrender.explain import explain_table
        from contextrender.registry import OverrideError, build_policy, method_config

        embedder = _embedder(args.embedding, cache=False)
        policy = build_policy(method_config(args.method), embedder=embedder, compactor=_compactor("extractive"))
        others = {m: build_policy(method_config(m), embedder=embedder, compactor=_compactor("extractive"))
                  for m in args.compare}
        select = getattr(policy, "select", None)  # only the ContextRender family has per-result scores
        if not callable(select):
            raise ValueError(f"method {args.method!r} has no per-result scores (use a ContextRender-family method)")
        graph = ContextGraph.snapshot(path)
    except (ValueError, OverrideError, GraphError, ImportError) as e:
        print(f"contextrender explain: {e}", file=sys.stderr)
        return 2
    with graph:
        try:
            sid = _find_session(graph, args.session, path)
        except ValueError as e:
            print(f"contextrender explain: {e}", file=sys.stderr)
            return 2
        session = graph.session(sid)
        sel = select(session, args.budget)
        compare = {m: p.render(session, args.budget) for m, p in others.items()}
        full = Scope.of(session).full_tokens(session)
        sys.stdout.write(f"session {sid}: next invocation t = {session.next_invocation}, "
                         f"{len(session.results)} tool results, Tok(H_full) = {full}, B = {args.budget}; "
                         f"{args.method} renders {sel.rendered.tokens} tokens\n\n")
        sys.stdout.write(explain_table(sel, compare=compare) + "\n")
        sys.stdout.write("\n" + readiness_lines(session.openai_messages(), {args.method: policy, **others},
                                                 args.budget) + "\n")
    return 0


def readiness_lines(messages: list[dict], policies: dict[str, object], budget: int) -> str:
    """Call readiness of a session's recorded calls under each policy (docs/method.md, "Call readiness")."""
    from contextrender.readiness import replay_readiness

    lines = []
    for name, policy in policies.items():
        stats, calls = replay_readiness(messages, policy, budget)
        hid = [(c, miss) for c, miss in calls if miss]
        pct = "–" if stats.call_pct is None else f"{stats.call_pct:.1f} %"
        lines.append(f"call readiness under {name} at B = {budget}: {pct} ({stats.ready} of {stats.needing} calls "
                     "that needed a value only an earlier tool result held had it in the render before them)"
                     + "".join(f"\n  turn {c.j} {c.name}: hidden {', '.join(miss)}" for c, miss in hid[:10])
                     + (f"\n  ... and {len(hid) - 10} more" if len(hid) > 10 else ""))
    lines.append("(replayed on this session alone: a method that learns from the file's other sessions sees none)")
    return "\n".join(lines)


def _view(args: argparse.Namespace) -> int:
    from contextrender.graph import ContextGraph, GraphError

    if not 1 <= len(args.methods) <= 2:
        print("contextrender view: --methods takes one or two methods", file=sys.stderr)
        return 2
    try:
        from contextrender.registry import method_config
        from contextrender.view import method_view, render_html

        for m in args.methods:
            method_config(m)  # an unknown name fails here, listing the known ones
        embedder = _embedder(args.embedding, cache=False)
        source = Path(args.source)
        if args.graph is None and source.exists():  # a trace file: any format replay reads
            from contextrender.experiments.evaluation.traces import read_traces

            episodes = list(read_traces(source))
            if args.episode is not None:
                episodes = [e for e in episodes if e.task_id == args.episode]
            if not episodes:
                raise ValueError(f"{source}: no episode {args.episode!r}" if args.episode else f"{source}: no episodes")
            name, messages = episodes[0].task_id, list(episodes[0].messages)
        else:
            path = args.graph or _graph_default()
            with ContextGraph.snapshot(path) as graph:
                name = _find_session(graph, args.source, path)
                messages = graph.session(name).openai_messages()
        data = method_view(messages, args.methods, args.budget, session_id=name, embedder=embedder)
    except (ValueError, GraphError, ImportError, OSError) as e:
        print(f"contextrender view: {e}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".view.html")
    with open_private(out, "w") as f:  # a transcript: owner-only
        f.write(render_html(data))
    print(out)
    return 0


def _compactor(name: str) -> Any:
    from contextrender.compaction import make_compactor

    return make_compactor(name)


def _replay(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    try:
        from contextrender.experiments.evaluation.replay import (
            check_replay_args,
            markdown_table,
            replay_traces,
            write_json,
        )
    except ImportError as e:
        print(f"contextrender replay: needs the [service] extra ({e}): pip install 'contextrender[service]'",
              file=sys.stderr)
        return 2
    from contextrender.compaction import make_compactor

    traces = args.traces[0] if len(args.traces) == 1 else args.traces
    trace_format = None if args.trace_format == "auto" else args.trace_format
    try:
        found = check_replay_args(traces, args.budget, args.methods, trace_format=trace_format,
                                  strict=not args.lenient)
        if not args.lenient:
            found.load()  # a bad record fails now, not after the records before it; the replay reads no file again
        embedder = _embedder(args.embedding)  # a missing extra: ImportError, reported below
        result = replay_traces(found, args.budget, args.methods, embedder=embedder,
                               compactor=make_compactor(args.compactor), strict=not args.lenient,
                               progress=sys.stderr.isatty(), trace_format=trace_format, benchmark=args.benchmark,
                               ceiling=not args.no_ceiling)
    except (OSError, ValueError, ImportError) as e:
        print(f"contextrender replay: {redact(str(e))}", file=sys.stderr)
        return 2
    out = result.to_json()
    if args.output:
        write_json(args.output, out)
    if args.format == "json":
        sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(markdown_table(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    offline.enable()  # the command's own process: offline model loading and tokenizers
    if args.command == "export":
        return _export(args)
    if args.command == "replay":
        return _replay(args)
    if args.command == "explain":
        return _explain(args)
    if args.command == "view":
        return _view(args)
    configure_logging(args.log_level)
    access = _access(args)
    max_body = int(args.max_body_mb * 1024 * 1024)
    graph = args.graph or _graph_default()
    try:
        if args.command == "serve":
            from contextrender.service.server import create_app

            app = create_app(graph, args.method, args.budget, args.embedding, compactor=args.compactor,
                             max_body_bytes=max_body, access=access)
        else:
            from contextrender.service.proxy import create_proxy_app

            app = create_proxy_app(args.upstream, graph, budget=args.budget, method=args.method,
                                   overrides=dict(args.override) or None, embedding=args.embedding,
                                   compactor=args.compactor, api_key_env=args.api_key_env,
                                   force_env_key=args.force_upstream_key, max_body_bytes=max_body,
                                   timeout=args.timeout, session_api=not args.no_session_api, access=access)
    except (ValueError, LockedError, ImportError) as e:  # a bad option, a held graph, a missing extra
        hint = HASHING_HINT if isinstance(e, ImportError) and "[local]" in str(e) else ""
        print(f"contextrender {args.command}: {redact(str(e))}{hint}", file=sys.stderr)
        return 2
    _serve(app, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
