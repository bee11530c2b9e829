"""``detspec serve -- <launch_server args>``: SGLang's server with the plugin on.

Runs ``python -m sglang.launch_server`` with the given arguments, adds
``--enable-deterministic-inference`` (and ``--speculative-use-rejection-sampling``
when a speculative algorithm is given) if they are missing, and makes sure
SGLang's plugin loader picks up this plugin: ``SGLANG_PLUGINS`` is a
whitelist of entry-point names, so when it is set our name is appended; when
it is unset every installed plugin loads, ours included.

SGLang parses its flags with ``argparse``, which also takes any unique prefix
of a flag (``--speculative-algo EAGLE``), so the flags above are looked for the
same way, against SGLang's own list of flags.
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence

ALGORITHM = "--speculative-algorithm"
DETERMINISTIC = "--enable-deterministic-inference"
REJECTION = "--speculative-use-rejection-sampling"

DESCRIPTION = (
    "Run SGLang's server (python -m sglang.launch_server) with the arguments given after '--', "
    f"adding {DETERMINISTIC} and, when a speculative algorithm is set, {REJECTION} if they are "
    "missing, and with this plugin admitted by SGLang's plugin loader (appended to SGLANG_PLUGINS "
    "when that whitelist is set)."
)
CHAIN_FLAGS = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
EXAMPLE = (
    "detspec serve -- --model-path M --speculative-algorithm EAGLE --speculative-draft-model-path D "
    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
)
USAGE_HINT = "put '--' before SGLang's launch_server arguments: detspec serve [--dry-run] -- --model-path M ..."


@functools.lru_cache(maxsize=1)
def sglang_flags() -> frozenset[str]:
    """Every option string of SGLang's ``launch_server`` parser (imports SGLang)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    # argparse has no public list of a parser's option strings.
    return frozenset(s for action in parser._actions for s in action.option_strings)


def resolve_flag(arg: str, flags: Collection[str]) -> str | None:
    """The flag of ``flags`` that ``argparse`` reads ``arg`` as, or None.

    ``--name`` or ``--name=value`` names a flag exactly, or by a prefix that
    starts exactly one flag (argparse's ``allow_abbrev``, on in SGLang's
    parser). A prefix of several flags is ambiguous and names none.
    """
    if not arg.startswith("--") or arg == "--":
        return None
    name = arg.split("=", 1)[0]
    if name in flags:
        return name
    matches = [f for f in flags if f.startswith(name)]
    return matches[0] if len(matches) == 1 else None


def given_flags(args: Sequence[str], flags: Collection[str]) -> set[str]:
    """The flags of ``flags`` that ``args`` sets, abbreviations resolved."""
    given = set()
    for arg in args:
        if arg == "--":
            break  # argparse reads everything after a bare '--' as positional
        flag = resolve_flag(arg, flags)
        if flag is not None:
            given.add(flag)
    return given


def server_command(
    launch_args: Sequence[str], python: str = sys.executable, flags: Collection[str] | None = None
) -> list[str]:
    """The ``launch_server`` command with the deterministic flags added if missing.

    Args:
        launch_args: SGLang's arguments, without the leading ``--``.
        python: the interpreter to run SGLang with.
        flags: SGLang's option strings, against which abbreviated flags are
            resolved; None asks SGLang (:func:`sglang_flags`).
    """
    args = list(launch_args)
    given = given_flags(args, sglang_flags() if flags is None else flags)
    added = [DETERMINISTIC] if DETERMINISTIC not in given else []
    if ALGORITHM in given and REJECTION not in given:
        added.append(REJECTION)
    # argparse reads everything after a bare '--' as positional: the flags go before it.
    cut = args.index("--") if "--" in args else len(args)
    return [python, "-m", "sglang.launch_server", *args[:cut], *added, *args[cut:]]


def launch_problems(launch_args: Sequence[str], flags: Collection[str] | None = None) -> tuple[list[str], list[str]]:
    """``(errors, notes)`` about ``launch_args`` that are known before SGLang starts.

    Errors: a speculative algorithm without all of :data:`CHAIN_FLAGS` (the
    plugin refuses that at start-up: SGLang would pick them per model, a
    tree for some). Notes: no speculative algorithm, so the plugin stays
    inactive. Anything the plugin checks on values (algorithm, top-k) is
    left to its start-up check, which reads them as SGLang resolves them.
    """
    given = given_flags(launch_args, sglang_flags() if flags is None else flags)
    errors, notes = [], []
    if ALGORITHM in given:
        missing = [f for f in CHAIN_FLAGS if f not in given]
        if missing:
            errors.append(f"{', '.join(missing)} not given: set all of {', '.join(CHAIN_FLAGS)} for a chain "
                          "draft (e.g. 3, 1, 4)")
    else:
        notes.append(f"no {ALGORITHM}: sglang-detspec stays inactive (it makes speculative decoding deterministic)")
    return errors, notes


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with ``SGLANG_PLUGINS`` admitting this plugin."""
    from ..sglang_plugin import ENTRY_POINT_NAME

    env = dict(environ)
    names = [n.strip() for n in env.get("SGLANG_PLUGINS", "").split(",") if n.strip()]
    if names and ENTRY_POINT_NAME not in names:
        env["SGLANG_PLUGINS"] = ",".join([*names, ENTRY_POINT_NAME])
    return env


def plugin_installed() -> bool:
    """True when SGLang's loader can discover the entry point (installed dist metadata)."""
    from importlib.metadata import entry_points

    from ..sglang_plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME

    return any(ep.name == ENTRY_POINT_NAME for ep in entry_points(group=ENTRY_POINT_GROUP))


def _run(args) -> int:
    launch = list(args.launch_args)
    if launch and launch[0] == "--":
        launch = launch[1:]
    if not launch:
        print(f"detspec serve: give SGLang's launch_server arguments after '--', e.g. {EXAMPLE}", file=sys.stderr)
        return 2
    if not plugin_installed():
        print("detspec serve: the 'detspec' entry point of group sglang.srt.plugins is not installed; "
              "install this package (pip install -e <checkout>) so SGLang's loader can find it", file=sys.stderr)
        return 2
    errors, notes = launch_problems(launch)
    for note in notes:
        print(f"detspec serve: note: {note}", file=sys.stderr)
    if errors:
        print("detspec serve: " + "; ".join(errors) + f"\n  example: {EXAMPLE}", file=sys.stderr)
        return 2
    cmd, env = server_command(launch), server_env(os.environ)
    if args.dry_run:
        plugins = env.get("SGLANG_PLUGINS")
        print((f"SGLANG_PLUGINS={shlex.quote(plugins)} " if plugins else "") + shlex.join(cmd))
        return 0
    return subprocess.call(cmd, env=env)


def register(subparsers) -> None:
    """Add the ``serve`` subcommand."""
    p = subparsers.add_parser(
        "serve",
        help="launch SGLang's server with sglang-detspec on",
        description=DESCRIPTION,
        epilog=f"example: {EXAMPLE}",
    )
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p.add_argument("launch_args", nargs=argparse.REMAINDER,
                   help="'--' then the arguments of python -m sglang.launch_server")
    # Without '--', argparse reads SGLang's flags as unknown flags of serve; cli.main adds this hint.
    p.set_defaults(handler=_run, unrecognized_hint=USAGE_HINT)
