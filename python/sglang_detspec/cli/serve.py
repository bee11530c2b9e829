"""``detspec serve -- <launch_server args>``: SGLang's server with the plugin on.

Runs ``python -m sglang.launch_server`` with the given arguments, adds
``--enable-deterministic-inference`` if it is missing, and makes sure SGLang's
plugin loader picks up this plugin: ``SGLANG_PLUGINS`` is a whitelist of
entry-point names, so when it is set our name is appended; when it is unset
every installed plugin loads, ours included.

Before anything starts, the arguments are read by SGLang's own
``launch_server`` parser (so abbreviated flags, ``--config`` files and
argument errors are SGLang's), and the plugin's start-up check
(:meth:`sglang_detspec.config.DetSpecConfig.refusals`) runs on the
config bag built from them, as the server's first check does with the flags
as typed, beside the refusal SGLang's own resolution makes of an
``--attention-backend`` outside its deterministic set
(:func:`sglang_detspec.sglang_plugin.resolve.sglang_refusals`). A
combination the server would refuse stops here with the same messages and
exit status 2. The server checks again after SGLang resolved
its flags (which needs the model), so ``--dry-run`` passing is necessary,
not sufficient. What ``--dry-run`` prints of the server the flags give is
:func:`sglang_detspec.cli.dry_run.report`'s.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .dry_run import (FAILED_CHECK, PREFILL_GRAPH_OFF_RUNS, PREFILL_GRAPH_SUITES, missing_model_paths, report,
                      unresolved_line)
from .messages import fail, say

if TYPE_CHECKING:
    from ..config import DetSpecConfig

DETERMINISTIC = "--enable-deterministic-inference"
HELP_FLAGS = ("-h", "--help")
SHUTDOWN_GRACE_S = 30  # after Ctrl-C, before the server is sent SIGTERM

# The width of the help's hand-wrapped paragraphs, for the ones built from the names above.
HELP_WIDTH = 76
# Lines broken at flag boundaries, with shell continuations, so the example can be copied as is.
EXAMPLE = """\
  detspec serve -- --model-path M --speculative-algorithm EAGLE \\
      --speculative-draft-model-path D --speculative-num-steps 3 \\
      --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \\
      --attention-backend fa3"""
# What the claims mean and where the rule is spelled out; the dry run gives the claim of any flags, with its reasons.
CLAIM_NOTE = """\
Claims. The server's start-up line claims logits='bitwise' (speculative
decoding on gives the logits of decoding without it, bit for bit) or
logits='tokens' (the same tokens, except where a draw is a near-tie inside
one bf16 rounding step).

  bitwise   by default for chains and trees of dense targets with
            unquantized weights on triton and fa3 attention at KV page
            size 1 and --kv-cache-dtype auto, as in the example above,
            and for the mixture-of-experts and MLA targets the README's
            claim table lists, within its limits (head sizes, draft
            tokens, target families, parallelism).
  tokens    past those limits (but triton chains, which stay 'bitwise'
            on the one-pass decode at KV page size 1 and
            --kv-cache-dtype auto), on other backends, and in a dry run
            without --attention-backend (SGLang picks the backend on the
            GPU, so the dry run cannot know it).

detspec serve --dry-run -- <flags> prints the claim for your flags, the
attention path and draft shape that serve, and what has and has not been
measured for them. The claims by target family (MoE, MLA, FP8), the
settings (SGLANG_DETSPEC_*) and their measured cost: README.md "What it
guarantees" and docs/usage.md.

""" + textwrap.fill(
    "Prefill CUDA graphs: SGLang's default, kept in the example. They were on in the serving benchmark (where the "
    "coupled chain served 19-27% more tokens/s with them at 8 and 32 concurrent requests, two back-to-back "
    f"commands) and in {PREFILL_GRAPH_SUITES}, {PREFILL_GRAPH_OFF_RUNS}.", HELP_WIDTH,
    break_on_hyphens=False, break_long_words=False)
DESCRIPTION = f"""\
Run SGLang's server (python -m sglang.launch_server) with the arguments given
after '--', adding {DETERMINISTIC} if it is missing, with this
plugin admitted by SGLang's plugin loader (appended to SGLANG_PLUGINS when that
whitelist is set).

First SGLang's own launch_server parser reads the arguments and the plugin's
start-up check runs on them, with SGLang's refusal of attention backends it
does not admit under deterministic inference: a combination the server would
refuse stops here with the server's message and exit status 2 (an assert of
SGLang's that fails on the flags is a warning: an assert may test the machine).

example:
{EXAMPLE}"""
# The claims come after the options: the example and the usage line are what a first reader needs.
EPILOG = CLAIM_NOTE
# detspec serve's own flags (its parser's), which go before the '--' that starts SGLang's.
SERVE_FLAGS = ("--dry-run", "--verbose")
USAGE_HINT = "put '--' before SGLang's launch_server arguments: detspec serve [--dry-run] -- --model-path M ..."


class _Refused(Exception):
    """SGLang's parser refused the arguments; the message is argparse's."""


class _RefusingParser(argparse.ArgumentParser):
    # argparse prints and exits on bad arguments; serve reports them in its own words instead.
    def error(self, message):
        raise _Refused(message)


@functools.lru_cache(maxsize=1)

def sglang_parser() -> argparse.ArgumentParser:
    """SGLang's ``launch_server`` parser, raising instead of exiting (imports SGLang).

    Built without ``-h``: help is left to SGLang itself (see :func:`_run`).
    """
    from sglang.srt.server_args import ServerArgs

    parser = _RefusingParser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def read_launch_args(launch_args: Sequence[str]) -> argparse.Namespace:
    """``launch_args`` as SGLang's ``launch_server`` reads them.

    A ``--config`` YAML file is merged in first, as SGLang does.

    Raises:
        ValueError: SGLang's parser refuses the arguments, or the ``--config``
            file cannot be read; the message is SGLang's.
    """
    parser, argv = sglang_parser(), list(launch_args)
    try:
        if "--config" in argv:
            from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        return parser.parse_args(argv)
    except (_Refused, OSError, ValueError) as exc:
        ours = list(dict.fromkeys(a for a in argv if a.split("=", 1)[0] in SERVE_FLAGS))
        hint = (f" ({' and '.join(ours)} {'is' if len(ours) == 1 else 'are'} detspec serve's own: put "
                f"{'it' if len(ours) == 1 else 'them'} before '--': detspec serve --dry-run --verbose -- "
                "--model-path M ...)") if ours else ""
        raise ValueError(f"SGLang's launch_server refuses these arguments: {exc}{hint}") from None


def server_command(launch_args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The ``launch_server`` command, with ``--enable-deterministic-inference`` added if missing.

    Args:
        launch_args: SGLang's arguments, without the leading ``--``.
        python: the interpreter to run SGLang with.

    Raises:
        ValueError: SGLang's parser refuses ``launch_args`` (see :func:`read_launch_args`).
    """
    args = list(launch_args)
    if not read_launch_args(args).enable_deterministic_inference:
        args.append(DETERMINISTIC)
    return [python, "-m", "sglang.launch_server", *args]


def startup_check(launch_args: Sequence[str], environ: Mapping[str, str], *,
                  check_hooks: bool = True) -> tuple[DetSpecConfig, list[str]]:
    """``(bag, problems)``: the plugin's start-up check on ``launch_args`` as typed.

    The bag is built as the server's first start-up check builds it (from
    the flags before SGLang resolves them, with the top-k SGLang gives NGRAM
    (``resolve.resolved_eagle_topk``), and the ``SGLANG_DETSPEC_*`` settings
    of ``environ``), except for the attention backend of an FA3 server with
    an ``fp8_e5m2`` KV cache: the one SGLang's resolution switches it to, as
    the server's resolved bag sees it (``resolve.sglang_backend_switch``); ``problems`` is what SGLang's own resolution
    refuses among these flags under deterministic inference
    (``resolve.sglang_refusals``: an ``--attention-backend`` outside SGLang's
    deterministic set, even with the plugin disabled), its
    :meth:`~sglang_detspec.config.DetSpecConfig.refusals` (``--tokenizer-worker-num``
    above 1 among them) and, with ``check_hooks`` for a run that is ours, the
    required SGLang symbols the plugin would not find: one message per
    problem, empty when the server would start.

    Raises:
        ValueError: SGLang's parser refuses ``launch_args``, or a bad
            ``SGLANG_DETSPEC_*`` setting in ``environ``.
    """
    from ..sglang_plugin.resolve import bag_from, sglang_backend_switch, sglang_refusals

    ns = read_launch_args(launch_args)
    switched = sglang_backend_switch(ns)
    view = ns if switched is None else argparse.Namespace(**{**vars(ns), "attention_backend": switched})
    bag = bag_from(view, ns.enable_deterministic_inference, "raw_args", environ)
    problems = sglang_refusals(ns) + bag.refusals()
    if bag.ours and check_hooks:
        problems += _hooks_not_in_place()
    return bag, problems


def _hooks_not_in_place() -> list[str]:
    """The required SGLang symbols the plugin would not find (the server's own check also sees unpatched ones)."""
    from ..sglang_plugin import hook_problems

    return hook_problems(applied=False)


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with ``SGLANG_PLUGINS`` admitting this plugin."""
    from ..sglang_plugin import ENTRY_POINT_NAME

    env = dict(environ)
    names = [n.strip() for n in env.get("SGLANG_PLUGINS", "").split(",") if n.strip()]
    if names and ENTRY_POINT_NAME not in names:
        env["SGLANG_PLUGINS"] = ",".join([*names, ENTRY_POINT_NAME])
    return env


def dry_run_command(cmd: list[str], env: Mapping[str, str]) -> str:
    """The shell line ``--dry-run`` prints: the ``SGLANG_PLUGINS`` and ``SGLANG_DETSPEC_*`` settings checked, then ``cmd``."""
    from ..config import ENV_PREFIX

    names = sorted(n for n in env if n.startswith(ENV_PREFIX))
    if env.get("SGLANG_PLUGINS"):
        names.insert(0, "SGLANG_PLUGINS")
    return "".join(f"{n}={shlex.quote(env[n])} " for n in names) + shlex.join(cmd)


def plugin_installed() -> bool:
    """True when SGLang's loader can discover the entry point (installed dist metadata)."""
    from importlib.metadata import entry_points

    from ..sglang_plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME

    return any(ep.name == ENTRY_POINT_NAME for ep in entry_points(group=ENTRY_POINT_GROUP))


def _why_inactive(bag: DetSpecConfig, env: Mapping[str, str]) -> str:
    from ..config import DISABLE_ENV

    if bag.disabled:
        return f"{DISABLE_ENV}={env.get(DISABLE_ENV, '')} is set"
    if not bag.deterministic:
        return "--enable-deterministic-inference is off"
    return "; ".join(bag.refusals())


def _run(args) -> int:
    if args.verbose and not args.dry_run:
        return fail("--verbose needs --dry-run: it prints the dry run's notes whole (a server's start-up log always "
                    "has them whole)")
    launch = list(args.launch_args)
    if launch and launch[0] == "--":
        launch = launch[1:]
    if not launch:
        return fail(f"give SGLang's launch_server arguments after '--', e.g.\n{EXAMPLE}")
    if importlib.util.find_spec("sglang") is None:
        return fail("SGLang is not installed in this environment (make demo's light venv has none): run "
                     "`make setup` and use .venv/bin/detspec, or pip install sglang==0.5.23")
    if not plugin_installed():
        return fail("the 'detspec' entry point of group sglang.srt.plugins is not installed; "
                     "install this package (pip install -e <checkout>) so SGLang's loader can find it")
    env = server_env(os.environ)
    if any(a in HELP_FLAGS for a in launch):
        cmd = [sys.executable, "-m", "sglang.launch_server", *launch]  # SGLang prints its own help
    else:
        try:
            cmd = server_command(launch)
            # A dry run may run on another machine than the server's: there a missing path is only noted.
            missing = [] if args.dry_run else missing_model_paths(read_launch_args(cmd[3:]))
            if missing:
                return fail("; ".join(missing))
            # The symbol check imports every hooked SGLang module (about half a minute on a CPU):
            # --dry-run runs it; a real start leaves it to the server's own start-up check.
            bag, problems = startup_check(cmd[3:], env, check_hooks=args.dry_run)
        except ValueError as exc:
            return fail(str(exc))
        if problems:
            lines = [f"{p} [refusal: {p.code}]" if hasattr(p, "code") else p for p in problems]
            return fail("this server would stop at start-up:\n  - " + "\n  - ".join(lines))
        unresolved = record = None
        if args.dry_run:
            refusal, unresolved, record = _sglang_verdict(cmd[3:])
            if refusal:
                # SGLang's rules that read the GPU: its backend pick when none is named, fa4's architecture check
                # (on the typed --attention-backend, whatever the prefill / decode flags add).
                typed = getattr(read_launch_args(cmd[3:]), "attention_backend", None)
                hedge = (" (only a rule that reads the GPU, such as fa4's for an absorbed-MLA target or SGLang's "
                         "pick of a backend, can decide otherwise on the server's GPU)"
                         if typed in (None, "fa4") else "")
                return fail(f"SGLang's own argument resolution, run here as on a CUDA device, refuses these flags: "
                             f"{refusal}{hedge}")
        if not bag.active:
            say(f"note: sglang-detspec stays inactive ({_why_inactive(bag, env)}): SGLang's own sampling runs")
            if unresolved:
                say(unresolved_line(unresolved))
        elif args.dry_run:
            report(bag, record, unresolved, read_launch_args(cmd[3:]), env, verbose=args.verbose)
    if args.dry_run:
        print(dry_run_command(cmd, env))
        return 0
    return _serve(cmd, env)


def _sglang_verdict(launch_args: list[str]):
    """What SGLang's own argument resolution, run here, says of the flags: (its refusal or None, why it did not
    run or finish here or None, the resolved ``ServerArgs`` or None)."""
    from ..sglang_plugin.resolve import sglang_resolution

    try:
        refusal, record = sglang_resolution(read_launch_args(launch_args))
        return refusal, None, record
    except LookupError as exc:
        return None, f"SGLang's own argument resolution not run here ({exc}); the server runs it at start-up", None
    except Exception as exc:  # SGLang's resolution, on a machine that is not the server's
        said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        where = _failed_line(exc)
        if isinstance(exc, AssertionError) and where:
            # An assert of SGLang's own on the flags: the server most likely stops on it too.
            return None, (f"{FAILED_CHECK} ({said}{where}): the server will most likely stop on it at start-up; "
                          "the claim below assumes it does not"), None
        return None, (f"SGLang's own argument resolution did not finish here ({said}{where}); the "
                      "server runs it at start-up"), None


def _failed_line(exc: BaseException) -> str:
    """Where in SGLang ``exc`` was raised, with its source line (a bare ``assert`` has no message): ``" at ..."``.

    Only frames inside SGLang's package count, named from the package (``sglang/srt/...``); "" where none is.
    """
    import linecache
    import traceback

    import sglang

    root = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))
    package = os.path.join(root, "sglang") + os.sep
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename).startswith(package)]
    if not frames:
        return ""
    last = frames[-1]
    where = os.path.relpath(os.path.abspath(last.filename), root).replace(os.sep, "/")
    source = (last.line or linecache.getline(last.filename, last.lineno)).strip()
    return f" at {where}:{last.lineno}: {source}" if source else f" at {where}:{last.lineno}"


def _serve(cmd: list[str], env: Mapping[str, str]) -> int:
    """Run the server; its exit status, or 130 (128 + SIGINT) after Ctrl-C."""
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # Ctrl-C reached the server too (same process group): give it time to stop its
        # scheduler processes itself (subprocess.call would SIGKILL it and orphan them).
        try:
            proc.wait(timeout=SHUTDOWN_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.terminate()
            proc.wait()
        return 130


def register(subparsers) -> None:
    """Add the ``serve`` subcommand."""
    p = subparsers.add_parser(
        "serve",
        help="launch SGLang's server with sglang-detspec on",
        # argparse's own usage line would hide the '--' that every run needs.
        usage="%(prog)s [-h] [--dry-run [--verbose]] -- LAUNCH_SERVER_ARGS ...",
        description=DESCRIPTION,
        epilog=EPILOG,
        # Keeps the line breaks above: the default formatter would wrap inside the example's flags.
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(SERVE_FLAGS[0], action="store_true",
                   help="run the checks and print the command instead of running it")
    p.add_argument(SERVE_FLAGS[1], action="store_true",
                   help="with --dry-run: print each note whole, with the runs and figures behind it (by default a "
                        "note keeps its first clause and what is not measured)")
    p.add_argument("launch_args", nargs=argparse.REMAINDER,
                   help="'--' then the arguments of python -m sglang.launch_server")
    # Without '--', argparse reads SGLang's flags as unknown flags of serve; cli.main adds this hint.
    p.set_defaults(handler=_run, unrecognized_hint=USAGE_HINT)
