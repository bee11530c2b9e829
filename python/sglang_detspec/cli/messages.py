"""How ``detspec`` commands speak to their user: one prefixed message per call on stderr.

A leaf module (it imports nothing of the CLI): every command and ``main``
take the prefixes from here.

On a terminal a message wraps to the terminal's width (the dry run's notes
run long); piped or logged it is written as built, so each message stays
whole for scripts and logs.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap

PREFIX = "detspec:"  # every line the CLI prints to stderr starts with it
ERROR_PREFIX = f"{PREFIX} error:"  # every error line of the CLI starts with it


def stderr_columns() -> int:
    """The width of the terminal stderr writes to: ``COLUMNS`` where set, else stderr's own (stdout may be a file
    the printed command goes to), else 80."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's stand-in) or not a terminal
        return shutil.get_terminal_size().columns


def _write(line: str) -> None:
    if sys.stderr.isatty():
        width = max(40, stderr_columns() - 1)
        line = "\n".join(textwrap.fill(part, width, subsequent_indent="    ", break_on_hyphens=False,
                                        break_long_words=False) for part in line.split("\n"))
    print(line, file=sys.stderr)


def say(message: str) -> None:
    """One message on stderr after :data:`PREFIX`; on a terminal wrapped to its width (the notes run to a few
    hundred words), elsewhere written as built (one line, or the lines of a list) so logs and scripts keep each
    message whole."""
    _write(f"{PREFIX} {message}")


def fail(message: str) -> int:
    """Print ``message`` after :data:`ERROR_PREFIX`, as :func:`say` prints; exit status 2."""
    _write(f"{ERROR_PREFIX} {message}")
    return 2
