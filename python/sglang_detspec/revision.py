"""Which code a run measured: the revision every result file records.

A GPU run reads a copy of the working tree without its ``.git``, so the
revision travels as a file, ``.revision`` at the repository root, written
here before the copy (``python -m sglang_detspec.revision --write``) and
ignored by git. Where ``.git`` is present the repository answers itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

REVISION_ENV = "DETSPEC_REVISION"
REVISION_FILE = ".revision"
# A change outside these (docs, run folders) does not change what a run measures.
CODE_PATHS = ("python", "test", "benchmark", "scripts", "pyproject.toml")
CHANGED = "+uncommitted"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def from_git(root: Path) -> str | None:
    """``HEAD``'s 12-digit hash, with ``+uncommitted`` where the code paths differ from it (new files
    included); None outside a git work tree (or without git)."""
    head = _git(root, "rev-parse", "--short=12", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    # New files count too: a run copies the working tree, untracked files and all.
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", *CODE_PATHS)
    changed = status is not None and status.returncode == 0 and bool(status.stdout.strip())
    return head.stdout.strip() + (CHANGED if changed else "")


def code_revision(root: str | Path | None = None) -> str | None:
    """The revision of the code at ``root`` (default: the current folder).

    Order: ``$DETSPEC_REVISION``; the repository itself where ``root`` is a git
    work tree; else ``root/.revision`` as :func:`write` left it. None where
    none of them answers (a result file then records ``null``, never a guess).

    Args:
        root: the repository root, str or Path.

    Returns:
        str like ``5ed3337a1b2c`` or ``5ed3337a1b2c+uncommitted``, or None.
    """
    env = os.environ.get(REVISION_ENV, "").strip()
    if env:
        return env
    root = Path(root) if root is not None else Path.cwd()
    found = from_git(root)
    if found:
        return found
    stamp = root / REVISION_FILE
    if stamp.is_file():
        return stamp.read_text().strip() or None
    return None


def write(root: str | Path) -> str:
    """Write ``root/.revision`` from the git repository at ``root``; returns the revision.

    Raises:
        ValueError: ``root`` is not a git work tree (nothing to stamp from).
    """
    root = Path(root)
    found = from_git(root)
    if not found:
        raise ValueError(f"root must be a git work tree to stamp its revision, got {str(root)!r}")
    (root / REVISION_FILE).write_text(found + "\n")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_detspec.revision", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {REVISION_FILE} at --root from git")
    parser.add_argument("--root", default=".", help="the repository root (default: the current folder)")
    args = parser.parse_args(argv)
    print(write(args.root) if args.write else code_revision(args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
