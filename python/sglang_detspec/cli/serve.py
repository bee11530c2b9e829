"""``detspec serve -- <launch_server args>``: SGLang's server with the plugin on.

Runs ``python -m sglang.launch_server`` with the given arguments, adds
``--enable-deterministic-inference`` (and ``--speculative-use-rejection-sampling``
when a speculative algorithm is given) if they are missing, and makes sure
SGLang's plugin loader picks up this plugin: ``SGLANG_PLUGINS`` is a
whitelist of entry-point names, so when it is set our name is appended; when
it is unset every installed plugin loads, ours included.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence

DETERMINISTIC = "--enable-deterministic-inference"
REJECTION = "--speculative-use-rejection-sampling"


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def server_command(launch_args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The ``launch_server`` command with the deterministic flags added if missing."""
    args = list(launch_args)
    if not _has_flag(args, DETERMINISTIC):
        args.append(DETERMINISTIC)
    if _has_flag(args, "--speculative-algorithm") and not _has_flag(args, REJECTION):
        args.append(REJECTION)
    return [python, "-m", "sglang.launch_server", *args]


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
        print("detspec serve: give SGLang's launch_server arguments after '--', e.g. "
              "detspec serve -- --model-path M --speculative-algorithm EAGLE ...", file=sys.stderr)
        return 2
    if not plugin_installed():
        print("detspec serve: the 'detspec' entry point of group sglang.srt.plugins is not installed; "
              "install this package (pip install sglang-detspec) so SGLang's loader can find it", file=sys.stderr)
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
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p.add_argument("launch_args", nargs=argparse.REMAINDER,
                   help="'--' then the arguments of python -m sglang.launch_server")
    p.set_defaults(handler=_run)
