"""Write docs/plugin.md's hook table from ``sglang_plugin.hook_table()`` (``make docs-hooks``).

The table sits between two marker lines; everything else in the file is left
as it is. ``--check`` exits 1 when the file differs from the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "plugin.md"
BEGIN = "<!-- hook table: generated from sglang_plugin.hook_table() by `make docs-hooks`; do not edit by hand -->"
END = "<!-- end of generated hook table -->"


def splice(text: str, table: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced by ``table``.

    Raises:
        ValueError: a marker is missing or they are out of order.
    """
    head, sep, rest = text.partition(BEGIN + "\n")
    body, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"{DOC.name} must hold the two marker lines {BEGIN!r} and {END!r}, in that order")
    return head + BEGIN + "\n" + table + END + tail


def main(argv: list[str]) -> int:
    from sglang_detspec.sglang_plugin import hook_table_markdown

    text = DOC.read_text()
    new = splice(text, hook_table_markdown())
    if "--check" in argv:
        if new != text:
            print(f"{DOC} differs from sglang_plugin.hook_table(): run `make docs-hooks`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
