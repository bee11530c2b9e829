"""``detspec`` command line: one subcommand per module of this package.

A subcommand lives in its own module ``sglang_detspec.cli.<name>`` that
defines ``register(subparsers)``: it adds its parser with
``subparsers.add_parser(...)`` and sets ``handler=<fn>`` through
``set_defaults``, where ``fn(args) -> int`` returns the exit code, and may set
``unrecognized_hint=<str>``, added to the error for arguments its parser does
not know. Modules are found by scanning this package, so adding a subcommand
touches no other file.
Handlers import heavy dependencies (torch, transformers) themselves, so
``detspec --help`` stays fast. Arguments a subcommand does not know are
reported with that subcommand's usage; Ctrl-C ends any subcommand with one
line and exit status 130 (128 + SIGINT, the shell's convention).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from collections.abc import Sequence

from .. import __version__
from .messages import ERROR_PREFIX, PREFIX

_NOT_SUBCOMMANDS = {"main"}
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """An argument error, raised by :class:`Parser` so :func:`main` prints it once, in one format."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class Parser(argparse.ArgumentParser):
    """argparse's parser (subcommand parsers are of the same class) whose errors :func:`main` prints.

    Every error line of the CLI then starts ``detspec: error:``, whichever
    subcommand's parser found it.
    """

    def error(self, message: str):
        raise UsageError(message, self.format_usage())


def _json_to_stdout(argv: Sequence[str]) -> bool:
    """``--json -`` among the arguments (the JSON goes to standard output)."""
    return "--json=-" in argv or any(a == "--json" and b == "-" for a, b in zip(argv, argv[1:]))


# What a first run looks like; shown only while both subcommands it names are registered.
FIRST_STEPS = ("first steps: 'detspec audit' (embedded tiny models on this machine, no server, no download), "
               "then 'detspec serve --dry-run -- --model-path M ...' (the claim a server with those SGLang "
               "flags would make); 'detspec COMMAND --help' for the rest.")


def build_parser() -> argparse.ArgumentParser:
    """The ``detspec`` parser with every subcommand module registered."""
    parser = Parser(prog="detspec")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    package = importlib.import_module(__package__)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name in _NOT_SUBCOMMANDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        register = getattr(module, "register", None)
        if callable(register):
            register(subparsers)
    # Named from what registered, so the list cannot promise a command that does not exist.
    *rest, last = subparsers.choices
    names = f"{', '.join(rest)} and {last}" if rest else last
    parser.description = f"Deterministic speculative decoding for SGLang: {names}."
    parser.epilog = FIRST_STEPS if {"audit", "serve"} <= set(subparsers.choices) else None
    return parser


def _subcommand_parser(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand ``name``, or ``parser`` itself when there is none."""
    # argparse keeps its subparsers only in this action; it has no public accessor.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def _subcommand_names(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``detspec`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    Raises:
        SystemExit: code 2 on bad arguments (argparse prints the reason and
            the usage of the subcommand concerned), 0 for ``--help`` and
            ``--version``. A bad ``SGLANG_DETSPEC_*`` environment setting
            returns 2 with the reason on stderr; Ctrl-C returns 130.
    """
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(f"{PREFIX} interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _early_flags_hint(parser, argv: list[str], command: str | None, unknown: list[str]) -> str | None:
    """A hint for flags of ``command`` typed before its name (the command did not see them), or None."""
    if command is None or command not in argv:
        return None
    known = _subcommand_parser(parser, command)._option_string_actions
    before = argv[:argv.index(command)]
    early = list(dict.fromkeys(a for a in unknown if a in before and a.split("=", 1)[0] in known))
    if not early:
        return None
    return (f"{' and '.join(early)} {'is' if len(early) == 1 else 'are'} {command}'s: put "
            f"{'it' if len(early) == 1 else 'them'} after '{command}' (detspec {command} {' '.join(early)} ...)")


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            command = getattr(args, "command", None)
            hint = _early_flags_hint(parser, argv, command, unknown) or getattr(args, "unrecognized_hint", None)
            _subcommand_parser(parser, command).error(
                f"unrecognized arguments: {' '.join(unknown)}" + (f"; {hint}" if hint else "")
            )
    except UsageError as exc:
        print(exc.usage, end="", file=sys.stderr)
        print(f"{ERROR_PREFIX} {exc}", file=sys.stderr)
        if _json_to_stdout(argv):  # a reader of the JSON gets an object, not an empty stream
            print(json.dumps({"error": {"code": "usage", "message": str(exc)}}))
        raise SystemExit(2) from None
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        commands = ", ".join(_subcommand_names(parser))
        print(f"{ERROR_PREFIX} give a command ({commands}), e.g. detspec audit", file=sys.stderr)
        return 2
    from ..config import env_settings

    try:
        env_settings()  # a bad SGLANG_DETSPEC_* setting is a usage error, not a traceback later
    except ValueError as exc:
        print(f"{ERROR_PREFIX} {exc}", file=sys.stderr)
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
