"""What ``detspec audit``'s modules share: defaults, the ``--json -`` marker and the one way to fail.

A leaf module (it imports nothing of the CLI but its messages' prefix), so ``audit.py`` and its parts
(``_audit_local``, ``_audit_server``, ``_audit_report``) import it without an
import cycle.
"""

from __future__ import annotations

import json
import sys

from .messages import ERROR_PREFIX

DEFAULT_NUM_DRAFT_TOKENS = 3
DEFAULT_CONCURRENCY = 1
STDOUT = "-"  # --json -: the JSON goes to standard output, the human report to standard error


def error_object(code: str, message: str) -> dict:
    """The JSON ``--json -`` prints on standard output when the audit stops with an error."""
    return {"error": {"code": code, "message": message}}


def fail(message: str, *, code: str = "error", usage=None, json_out: bool = False) -> int:
    """Print ``message`` as the CLI's error (after ``usage()`` where given); returns exit status 2.

    With ``json_out`` (``--json -``) standard output also gets
    :func:`error_object`, so a reader of the JSON never sees an empty stream.
    ``code`` is stable (``usage``, ``server``, ``error``); the message is for people.
    """
    # Plain print, not rich: server messages may hold [brackets] rich would eat.
    if usage is not None:
        print(usage(), end="", file=sys.stderr)
    print(f"{ERROR_PREFIX} {message}", file=sys.stderr)
    if json_out:
        print(json.dumps(error_object(code, message)))
    return 2
