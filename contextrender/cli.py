"""``contextrender`` command line: run the server or the proxy, export a session.

    contextrender serve  --port 8765 [--graph PATH] [--method NAME] [--budget N] [--embedding local|hashing|litellm]
    contextrender proxy  --upstream URL --budget N --method NAME --port 8766 [--graph PATH] [--override KEY=VALUE]
    contextrender export SESSION [--graph PATH] [--out FILE]
    contextrender replay TRACES... --budget N --methods a,b [--embedding local|hashing|litellm] [--output FILE]
                         [--format markdown|json] [--lenient] [--trace-format auto|contextrender|tau2|taubench|bfcl]
                         [--benchmark NAME]
    contextrender explain SESSION --budget N [--graph PATH] [--method NAME] [--compare prune,...]
    contextrender view SESSION|TRACES --budget N [--graph PATH] [--episode ID] [--methods a,b] [--out FILE]
                       [--from T --to T | --last N]

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
``file: simulations[i]``) exit with status 2, and so do a damaged graph file (one line with SQLite's
``quick_check`` result) and a missing extra (named, with its install line). ``explain`` and ``view``
use the embedder the session's renders recorded unless ``--embedding`` names one — a local one only: a
recorded remote (LiteLLM) model is refused, exit status 2, unless ``--embedding litellm`` asks for it; ``export --out`` and
``view --out`` never write through a symlink and replace the file atomically with an owner-only one.
Every log line goes through :func:`contextrender.redact.redact`. The graph
defaults to ``$CONTEXTRENDER_GRAPH`` or ``contextrender.sqlite`` in the
working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from contextrender import offline
from contextrender.extras import EMBEDDER_EXTRAS, extra_of, missing_extra
from contextrender.files import LockedError, write_private
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


class _SubParser(argparse.ArgumentParser):
    """Every subcommand's ``--help`` shows the defaults (:class:`_DefaultsFormatter`)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kw)

    def format_help(self) -> str:
        _show_defaults(self)
        return super().format_help()


def _window_args(v: argparse.ArgumentParser) -> None:
    from contextrender.view import DEFAULT_VIEW_INVOCATIONS, MAX_VIEW_INVOCATIONS

    v.add_argument("--from", dest="start", type=_natural, default=None, metavar="T",
                   help="first invocation to draw (with --to; default: the latest "
                        f"{DEFAULT_VIEW_INVOCATIONS} invocations; at most {MAX_VIEW_INVOCATIONS} in one view)")
    v.add_argument("--to", dest="end", type=_natural, default=None, metavar="T", help="last invocation to draw")
    v.add_argument("--last", type=_positive_int, default=None, metavar="N", help="draw the latest N invocations")


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 0, got {value}")
    return value


#: ``--embedding`` of explain and view: default, the embedder the graph's renders recorded.
RECORDED = "recorded"


def _common(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: loopback only)")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--graph", default=None, help="context-graph SQLite file (default $CONTEXTRENDER_GRAPH or "
                                                 f"./{DEFAULT_GRAPH})")
    p.add_argument("--method", default="contextrender_plus", help="default policy: any conf/method/<name>.yaml")
    p.add_argument("--budget", type=_positive_int, default=6000, help="default history budget B in tokens")
    p.add_argument("--embedding", default="local", choices=["local", "sentence-transformers", "litellm", "hashing"])
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


#: A help text that already says its option's default ("(default X)", "default: X", "; default X").
_NAMES_DEFAULT = re.compile(r"\(default\b|\bdefault:|[;,] default\b")


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows every option's default: appended unless the help text already names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (_NAMES_DEFAULT.search(text) or action.default in (None, False, [], argparse.SUPPRESS)
                or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)".lstrip()


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give options without help text one (argparse prints no default for an option without help)."""
    for action in parser._actions:
        if action.help is None and action.option_strings and action.default not in (None, False, []):
            action.help = "(default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    from contextrender import __version__

    parser = argparse.ArgumentParser(prog="contextrender", description="ContextRender as a service (docs/method.md §9).",
                                     formatter_class=_DefaultsFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_SubParser)

    s = sub.add_parser("serve", help="run the ContextRender server (session API)")
    _common(s, 8765)

    _add_proxy(sub)
    _add_export(sub)
    _add_replay(sub)
    _add_explain_and_view(sub)
    return parser


def _add_proxy(sub: Any) -> None:
    p = sub.add_parser("proxy", help="run the proxy (OpenAI Chat Completions and Responses, Anthropic Messages)")
    _common(p, 8766)
    p.add_argument("--upstream", required=True,
                   help="the provider's API base URL, e.g. https://api.openai.com/v1 or https://api.anthropic.com/v1 "
                        "(every API's path is relayed under it)")
    p.add_argument("--override", type=_override, action="append", default=[], metavar="KEY=VALUE",
                   help="method config override (dotted key, JSON value), repeatable")
    p.add_argument("--api-key-env", default="CONTEXTRENDER_UPSTREAM_API_KEY",
                   help="env var holding the upstream key, sent when the client sends no Authorization")
    p.add_argument("--force-upstream-key", action="store_true",
                   help="send the env key even when the client sent its own Authorization")
    p.add_argument("--timeout", type=float, default=600.0, help="upstream read timeout in seconds")
    p.add_argument("--no-session-api", action="store_true",
                   help="do not mount the session API (/sessions/...: full transcripts) on the proxy")
    p.add_argument("--stateful-responses", choices=("refuse", "passthrough"), default="refuse",
                   help="Responses API requests that rely on upstream state (previous_response_id, conversation) "
                        "cannot be rendered: refuse them with 400 (default), or pass them through unmanaged "
                        "(logged, X-ContextRender-Managed: false)")



def _add_export(sub: Any) -> None:
    e = sub.add_parser("export", help="write a session as a replay-trace line (experiments/evaluation/traces.py format)")
    e.add_argument("session")
    e.add_argument("--graph", default=None, help="graph file holding the session (default $CONTEXTRENDER_GRAPH or "
                   "./contextrender.sqlite)")
    e.add_argument("--out", default=None, help="append the line to FILE (default: stdout)")



def _add_replay(sub: Any) -> None:
    r = sub.add_parser("replay", help="Later-Used Result Recall of methods replayed over trace files")
    r.add_argument("traces", nargs="+", metavar="TRACES",
                   help="trace file, directory (recursively) or glob; our JSONL, tau2 Results JSON, tau-bench (v1) "
                        "results or BFCL multi-turn *_result.json (recognised by content)")
    r.add_argument("--budget", type=_positive_int, required=True, help="history budget B in tokens")
    r.add_argument("--methods", type=_method_list, required=True, metavar="A,B",
                   help="comma-separated registry methods (conf/method/<name>.yaml)")
    r.add_argument("--embedding", default="local",
                   choices=["local", "sentence-transformers", "hashing", "litellm"])
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
    r.add_argument("--expand", action="store_true",
                   help="offer the expand tool to methods whose markers carry handles (contextrender_plus), as the "
                        "proxy does, and count the hidden needed values that were one expansion away")
    r.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])



def _add_explain_and_view(sub: Any) -> None:
    x = sub.add_parser("explain", help="why each tool result of a stored session is or is not rendered at B")
    x.add_argument("session")
    x.add_argument("--budget", type=_positive_int, required=True, help="history budget B in tokens")
    x.add_argument("--graph", default=None, help="graph file (read from a copy: a running service is undisturbed)")
    x.add_argument("--method", default="contextrender_plus", help="a ContextRender-family registry method")
    x.add_argument("--compare", type=_method_list, default=[], metavar="A,B",
                   help="other registry methods to show side by side (kept / omitted)")
    x.add_argument("--embedding", default=RECORDED,
                   choices=[RECORDED, "local", "sentence-transformers", "hashing", "litellm"],
                   help="the embedder; default: the one the session's renders used (recorded in the graph)")

    v = sub.add_parser("view", help="one self-contained HTML page of a session: results, reuse edges, states")
    v.add_argument("source", help="a session id in --graph, or a trace file (any format replay reads)")
    v.add_argument("--budget", type=_positive_int, required=True, help="history budget B in tokens")
    v.add_argument("--graph", default=None, help="graph file holding the session (read from a copy)")
    v.add_argument("--episode", default=None,
                   help="which episode of a trace file: its id or the file's own task id (7 picks 7/trial-0); "
                        "default the first")
    v.add_argument("--methods", type=_method_list, default=["contextrender_plus", "prune"], metavar="A[,B]",
                   help="one or two registry methods to show (default contextrender_plus,prune)")
    v.add_argument("--embedding", default=RECORDED,
                   choices=[RECORDED, "local", "sentence-transformers", "hashing", "litellm"],
                   help="the embedder; default: the one the session's renders used (recorded in the graph; local "
                        "for a trace file)")
    _window_args(v)
    v.add_argument("--out", default=None, help="HTML file to write (default <episode or session id>.view.html, in the working directory)")


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


def _snapshot(path: str) -> Any:
    """A read-only copy of the graph file ``path`` (:meth:`ContextGraph.snapshot`); GraphError names a missing,
    unreadable or damaged file (with SQLite's quick_check result)."""
    from contextrender.graph import ContextGraph

    return ContextGraph.snapshot(path)


def _export(args: argparse.Namespace) -> int:
    from contextrender.graph import GraphError
    from contextrender.trace_line import trace_line_text

    path = args.graph or _graph_default()
    if not Path(path).is_file():
        print(f"contextrender export: no graph file {path}", file=sys.stderr)
        return 2
    try:
        graph = _snapshot(path)  # a copy: never writes to (or waits on) a running service's file
    except GraphError as e:
        print(f"contextrender export: {e}", file=sys.stderr)
        return 2
    with graph:
        try:
            sid = _find_session(graph, args.session, path)
        except ValueError as e:
            print(f"contextrender export: {e}", file=sys.stderr)
            return 2
        session = graph.session(sid)
        line = trace_line_text(sid, session.openai_messages())
    if args.out:
        try:  # a transcript: a new owner-only file replaces the old atomically; a symlink is refused
            write_private(args.out, line + "\n", append=True)
        except OSError as e:
            print(f"contextrender export: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
            return 2
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
        hint = HASHING_HINT if name != "hashing" else ""
        raise ImportError(missing_extra(e, f"the {name} embedder", "local") + hint, name=e.name) from None


#: The largest ``hashing-<dim>`` a graph's recorded embedder name may ask for (the file may come from anyone).
MAX_RECORDED_HASHING_DIM = 65536
#: What a recorded LiteLLM model name may look like to be used at all (with ``--embedding litellm``).
_MODEL_NAME = re.compile(r"[A-Za-z0-9._:/@+-]{1,200}")


def _recorded_embedder(choice: str, graph: Any, sid: str | None, command: str) -> object:
    """The embedder ``--embedding`` names; by default the one the graph recorded for ``sid`` (the ``model`` of its
    stored result vectors, else of any session in the file), else the local default, saying so on stderr.

    The recorded name comes from the file, which may be anyone's: by default only a local embedder is built from
    it (:func:`embedder_named`); a recorded LiteLLM model is used only with an explicit ``--embedding litellm``.

    Raises:
        ValueError: the recorded embedder is not a local one and ``--embedding litellm`` was not given (the message
            names it and the options), or its name is not a model name.
    """
    names = (graph.embedders(sid) if sid is not None else []) or (graph.embedders() if graph is not None else [])
    if choice == "litellm":
        if names and not _local_name(names[0]):
            if not _MODEL_NAME.fullmatch(names[0]):
                raise ValueError(f"the recorded embedder {names[0][:200]!r} is not a model name; name none "
                                 "(--embedding local or hashing)")
            return _embedder("litellm", cache=False, model=names[0])
        return _embedder("litellm", cache=False)
    if choice != RECORDED:
        return _embedder(choice, cache=False)
    if not names:
        where = f"session {sid!r}" if sid is not None else "a trace file"
        print(f"contextrender {command}: {where} records no embedder (nothing of it was embedded); using the "
              "local default (all-MiniLM-L6-v2) — choose with --embedding", file=sys.stderr)
        return _embedder("local", cache=False)
    try:
        return embedder_named(names[0])
    except ValueError as e:
        where = f"session {sid!r}" if sid is not None else "the graph"
        raise ValueError(f"{where} was rendered with {e}") from None


def _local_name(name: str) -> bool:
    from contextrender.embed import LocalEmbedder

    return name == LocalEmbedder.name or re.fullmatch(r"hashing-\d+", name) is not None


def embedder_named(name: str) -> object:
    """The local embedder whose ``name`` a graph recorded: ``all-MiniLM-L6-v2`` (local) or ``hashing-<dim>`` with
    1 <= dim <= :data:`MAX_RECORDED_HASHING_DIM`.

    Raises:
        ValueError: any other name (a LiteLLM model: every tool result would go to its provider; the message
            says to ask for it with ``--embedding litellm``), or a hashing dimension out of range.
    """
    from contextrender.embed import LocalEmbedder

    if name == LocalEmbedder.name:
        return _embedder("local", cache=False)
    m = re.fullmatch(r"hashing-(\d{1,9})", name)
    if m and 1 <= int(m.group(1)) <= MAX_RECORDED_HASHING_DIM:
        return _embedder("hashing", cache=False, dim=int(m.group(1)))
    if re.fullmatch(r"hashing-\d+", name):
        raise ValueError(f"the embedder {name[:40]!r}, whose dimension is not in 1..{MAX_RECORDED_HASHING_DIM}: "
                         "choose one with --embedding (hashing gives 256 dimensions)")
    raise ValueError(f"the embedder {name[:200]!r}, which is not a local one: it is used only when asked for. Pass "
                     "--embedding litellm to embed with it (every tool result then goes to that model's provider), "
                     "or --embedding local / hashing to stay on this machine (the scores then differ from its "
                     "renders')")


def _explain(args: argparse.Namespace) -> int:
    from contextrender.graph import GraphError
    from contextrender.render import Scope

    path = args.graph or _graph_default()
    try:  # the extras first: a missing one is named, whatever else is wrong
        from contextrender.explain import cache_summary, explain_table
        from contextrender.registry import OverrideError, build_policy, method_config
    except ImportError as e:
        print(f"contextrender explain: {missing_extra(e, 'explain')}", file=sys.stderr)
        return 2
    try:
        method_config(args.method)  # an unknown name fails here, listing the known ones
        for m in args.compare:
            method_config(m)
        # an embedder named outright is built before anything is opened: a missing extra is said first
        chosen = None if args.embedding in (RECORDED, "litellm") else _embedder(args.embedding, cache=False)
        graph = _snapshot(path)
    except (ValueError, OverrideError, GraphError, ImportError) as e:
        print(f"contextrender explain: {e}", file=sys.stderr)
        return 2
    with graph:
        try:
            sid = _find_session(graph, args.session, path)
            session = graph.session(sid)
            if chosen is None and not session.results:  # nothing to embed: no embedder is loaded or named
                from contextrender.embed import HashingEmbedder

                chosen = HashingEmbedder(dim=64)
                chosen.name = "none needed (the session has no tool results)"
            embedder = chosen if chosen is not None else _recorded_embedder(args.embedding, graph, sid, "explain")
            policy = build_policy(method_config(args.method), embedder=embedder, compactor=_compactor("extractive"))
            others = {m: build_policy(method_config(m), embedder=embedder, compactor=_compactor("extractive"))
                      for m in args.compare}
            select = getattr(policy, "select", None)  # only the ContextRender family has per-result scores
            if not callable(select):
                raise ValueError(f"method {args.method!r} has no per-result scores (use a ContextRender-family "
                                 "method)")
        except (ValueError, OverrideError) as e:
            print(f"contextrender explain: {e}", file=sys.stderr)
            return 2
        except ImportError as e:  # the embedder's extra: named by _embedder
            print(f"contextrender explain: {e}", file=sys.stderr)
            return 2
        sys.stderr.write(f"contextrender explain: embedder {getattr(embedder, 'name', '?')}\n")
        sel = select(session, args.budget)
        compare = {}  # a selector's own forms where it has them (ids, tables), else its render
        for m, p in others.items():
            sel_of = getattr(p, "select", None)
            compare[m] = sel_of(session, args.budget) if callable(sel_of) else p.render(session, args.budget)
        full = Scope.of(session).full_tokens(session)
        sys.stdout.write(f"session {sid}: next invocation t = {session.next_invocation}, "
                         f"{len(session.results)} tool results, Tok(H_full) = {full}, B = {args.budget}; "
                         f"{args.method} renders {sel.rendered.tokens} tokens\n\n")
        sys.stdout.write(explain_table(sel, compare=compare) + "\n")
        sys.stdout.write("\n" + readiness_lines(session.openai_messages(), {args.method: policy, **others},
                                                 args.budget) + "\n")
        sys.stdout.write("\n" + cache_summary(session.prompt_usage_totals()) + "\n")
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


def pick_episode(episodes: list[Any], wanted: str | None, source: Path) -> Any:
    """The episode ``--episode`` names: its id, or the file's own task id (``7`` picks ``7/trial-0``, the first
    trial; a harness key ``k`` picks ``k#<attempt>``). ValueError lists the valid ids on a miss."""
    if not episodes:
        raise ValueError(f"{source}: no episodes")
    if wanted is None:
        return episodes[0]
    exact = [e for e in episodes if e.task_id == wanted]
    if exact:
        return exact[0]
    prefixed = [e for e in episodes if e.task_id.startswith((f"{wanted}/", f"{wanted}#"))]
    if prefixed:
        return prefixed[0]
    ids = [e.task_id for e in episodes]
    tasks = sorted({i.split("/trial-")[0] for i in ids}, key=lambda t: (len(t), t))
    shown = ", ".join(tasks[:20]) + (f", … ({len(tasks)} in all)" if len(tasks) > 20 else "")
    raise ValueError(f"{source}: no episode {wanted!r}; its task ids are: {shown}"
                     + (f" (episode ids such as {ids[0]!r} work too)" if ids[0] not in tasks else ""))


def _view(args: argparse.Namespace) -> int:
    from contextrender.graph import GraphError

    if not 1 <= len(args.methods) <= 2:
        print("contextrender view: --methods takes one or two methods", file=sys.stderr)
        return 2
    try:  # the extras first: a missing one is named, whatever else is wrong
        from contextrender.registry import method_config
        from contextrender.view import MAX_VIEW_BYTES, MAX_VIEW_INVOCATIONS, ViewWindow, method_view, render_html
    except ImportError as e:
        print(f"contextrender view: {missing_extra(e, 'view')}", file=sys.stderr)
        return 2
    try:
        for m in args.methods:
            method_config(m)  # an unknown name fails here, listing the known ones
        source = Path(args.source)
        with contextlib.ExitStack() as stack:
            usage = None  # a stored session's billed requests (a trace file has none)
            if args.graph is None and source.exists():  # a trace file: any format replay reads
                from contextrender.experiments.evaluation.traces import read_traces

                episode = pick_episode(list(read_traces(source)), args.episode, source)
                name, messages = episode.task_id, list(episode.messages)
                embedder = _recorded_embedder(args.embedding, None, None, "view")
            else:
                path = args.graph or _graph_default()
                if args.graph is None and not Path(path).exists():  # neither a trace file nor a graph to look in
                    raise ValueError(f"no trace file {source} (and no graph file {path} to look for a session of "
                                     "that name): give the path of an existing trace file, or a session id with "
                                     "--graph FILE")
                graph = stack.enter_context(_snapshot(path))
                try:
                    name = _find_session(graph, args.source, path)
                except ValueError as e:
                    if args.graph is not None:
                        raise
                    # No --graph: the argument may have been meant as a trace file; say that it is missing first.
                    raise ValueError(f"no trace file {source}, and {e}") from None
                usage = graph.session(name)
                messages = usage.openai_messages()
                embedder = _recorded_embedder(args.embedding, graph, name, "view")
            data = method_view(messages, args.methods, args.budget, session_id=name, embedder=embedder,
                               window=ViewWindow(args.start, args.end, args.last),
                               max_invocations=MAX_VIEW_INVOCATIONS, max_bytes=MAX_VIEW_BYTES, usage=usage)
        page = render_html(data)
        if len(page.encode("utf-8")) > MAX_VIEW_BYTES:
            raise ValueError(f"the page is over the view's {MAX_VIEW_BYTES}-byte limit: draw fewer invocations "
                             "(--from/--to or --last)")
        out = Path(args.out) if args.out else Path(re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".view.html")
        write_private(out, page)  # a transcript: a new owner-only file; a symlink is refused, never followed
    except (ValueError, GraphError, ImportError) as e:
        print(f"contextrender view: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"contextrender view: {e.strerror or e}", file=sys.stderr)
        return 2
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
        print(f"contextrender replay: {missing_extra(e, 'replay')}", file=sys.stderr)
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
                               ceiling=not args.no_ceiling, expand=args.expand)
    except (OSError, ValueError, ImportError) as e:
        from contextrender.experiments.evaluation.traces import TraceError

        hint = ("\n  --lenient replays what can be read, skipping the bad records (each named once, and counted)"
                if isinstance(e, TraceError) and not args.lenient else "")
        print(f"contextrender replay: {redact(str(e))}{hint}", file=sys.stderr)
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
    try:
        return _main(argv)
    except BrokenPipeError:  # `contextrender explain ... | head`: the reader left; nothing more to say
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout once more at exit
        except OSError:
            pass
        return 0


def _main(argv: list[str] | None = None) -> int:
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
    from contextrender.graph import GraphError

    configure_logging(args.log_level)
    access = _access(args)
    max_body = int(args.max_body_mb * 1024 * 1024)
    graph = args.graph or _graph_default()
    busy = _port_in_use(args.host, args.port)
    if busy:  # before the graph file is created: a failed start leaves nothing behind
        print(f"contextrender {args.command}: cannot listen on {args.host}:{args.port}: {busy}; pick another "
              "with --port, or stop what holds it", file=sys.stderr)
        return 2
    try:
        import uvicorn  # noqa: F401 - the server itself: a missing extra is named before anything starts

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
                                   timeout=args.timeout, session_api=not args.no_session_api, access=access,
                                   stateful_responses=args.stateful_responses)
    except ImportError as e:  # a missing extra: which one, and the line that installs it
        local = extra_of(e) in EMBEDDER_EXTRAS
        print(f"contextrender {args.command}: {missing_extra(e, args.command, 'service')}"
              f"{HASHING_HINT if local else ''}", file=sys.stderr)
        return 2
    except (ValueError, LockedError, GraphError) as e:  # a bad option, a held or damaged graph
        print(f"contextrender {args.command}: {redact(str(e))}", file=sys.stderr)
        return 2
    if args.command == "proxy":
        from contextrender.service.proxy import startup_line

        host = f"[{args.host}]" if ":" in args.host else args.host
        print(startup_line(app, f"http://{host}:{args.port}", graph), file=sys.stderr, flush=True)
    _serve(app, args)
    return 0


def _port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (in use, not permitted, no such address), or None."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            s.bind((host, port))
        except OSError as e:
            return "the port is in use" if e.errno in (98, 48, 10048) else (e.strerror or str(e))
    return None


if __name__ == "__main__":
    sys.exit(main())
