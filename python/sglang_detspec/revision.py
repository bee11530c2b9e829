"""Which code a run measured: the revision every result file records.

A GPU run reads a copy of the working tree, without a ``.git`` or with the
``.git`` of an older commit under the newer files, so the revision travels
as a file, ``.revision`` at the repository root, written before the copy
(``python -m sglang_detspec.revision --write``) and ignored by git. Where
``.git`` holds the commit the file names (or there is no file) the
repository answers itself. The
servers of a run import the plugin as installed beside SGLang, which a later
command may leave in place while its working copy moves on: the install
scripts stamp the installed package with the revision they installed
(``--stamp-install``), and :func:`run_revision`, what result files record,
reads that stamp wherever the imported package is not in a git checkout.
``$DETSPEC_REVISION`` overrides all of them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REVISION_ENV = "DETSPEC_REVISION"
REVISION_FILE = ".revision"
# Beside this module in an installed copy of the package (git-ignored in the repository).
INSTALLED_STAMP = "_revision"
# A change outside these (docs, run folders) does not change what a run measures.
CODE_PATHS = ("python", "test", "benchmark", "scripts", "pyproject.toml")
CHANGED = "+uncommitted"
UNKNOWN = "+unknown"  # git named HEAD but could not say whether the code paths differ from it


def _from_env() -> str | None:
    return os.environ.get(REVISION_ENV, "").strip() or None


def _git(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def from_git(root: Path) -> str | None:
    """The revision of the git work tree at ``root``.

    Args:
        root: a folder inside the work tree.

    Returns:
        ``HEAD``'s 12-digit hash, with ``+uncommitted`` where the code paths
        (:data:`CODE_PATHS`) differ from it, new files included, or
        ``+unknown`` where ``git status`` failed; None outside a git work
        tree or without git.
    """
    head = _git(root, "rev-parse", "--short=12", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    # New files count too: a run copies the working tree, untracked files and all.
    # ":(top)": the code paths from the work tree's top, whichever folder inside it ``root`` is.
    paths = (f":(top){p}" for p in CODE_PATHS)
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", *paths)
    if status is None or status.returncode != 0:
        return head.stdout.strip() + UNKNOWN
    return head.stdout.strip() + (CHANGED if status.stdout.strip() else "")


def code_revision(root: str | Path | None = None) -> str | None:
    """The revision of the code at ``root`` (default: the current folder).

    Order: ``$DETSPEC_REVISION``; ``root/.revision`` where ``root`` is a git
    work tree that does not hold the commit it names (a copy laid over an
    older ``.git``); the repository itself where ``root`` is a git work tree;
    else ``root/.revision`` as :func:`write` left it. None where none of them
    answers (a result file then records ``null``, never a guess).

    Args:
        root: the repository root, str or Path.

    Returns:
        str like ``5ed3337a1b2c`` or ``5ed3337a1b2c+uncommitted``, or None.
    """
    if _from_env():
        return _from_env()
    root = Path(root) if root is not None else Path.cwd()
    stamped = _stamp_of_a_newer_tree(root)
    if stamped:
        return stamped
    found = from_git(root)
    if found:
        return found
    stamp = root / REVISION_FILE
    if stamp.is_file():
        return stamp.read_text().strip() or None
    return None


def _stamp_of_a_newer_tree(root: Path) -> str | None:
    """``root/.revision`` where a git work tree at ``root`` does not hold the commit it names, else None.

    A copy of the working tree may come with a ``.git`` of an older commit (the files of the newer one laid
    over it): its git would name that older commit. The stamp, written where the named commit exists, is then
    the one that knows; where git holds the commit (the repository the stamp was written in, later commits
    or not) git answers, so a stale stamp is never read over it.
    """
    stamp = root / REVISION_FILE
    text = stamp.read_text().strip() if stamp.is_file() else ""
    if not text:
        return None
    known = _git(root, "cat-file", "-e", f"{text.split('+')[0]}^{{commit}}")
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if known is None or inside is None or inside.returncode != 0:
        return None  # no git here: the callers read the stamp themselves
    return text if known.returncode != 0 else None


def run_revision() -> str | None:
    """The revision of the plugin this process imports, which a run's servers import too.

    ``$DETSPEC_REVISION``; else, where the package is imported from a git
    checkout (a source or editable install), that checkout's ``.revision``
    where its git does not hold the commit named there (a copy laid over an
    older ``.git``), else its :func:`from_git`; else the stamp of the installed copy
    (:func:`stamp_install`; none or an empty one: None, never a working
    copy's revision, which may be newer than the install).

    Returns:
        str or None, as :func:`code_revision`.
    """
    if _from_env():
        return _from_env()
    here = Path(__file__).resolve()
    checkout = here.parents[2]  # <root>/python/sglang_detspec/revision.py in a source checkout
    stamped = _stamp_of_a_newer_tree(checkout) if (checkout / "python").is_dir() else None
    if stamped:
        return stamped
    found = from_git(here.parent)
    if found:
        return found
    installed = here.with_name(INSTALLED_STAMP)
    return (installed.read_text().strip() or None) if installed.is_file() else None


def write(root: str | Path) -> str:
    """Write ``root/.revision`` from the git repository at ``root``.

    Args:
        root: the repository root, str or Path.

    Returns:
        str: the revision written (:func:`from_git`).

    Raises:
        ValueError: ``root`` is not a git work tree (nothing to stamp from).
    """
    root = Path(root)
    found = from_git(root)
    if not found:
        raise ValueError(f"root must be a git work tree to stamp its revision, got {str(root)!r}")
    (root / REVISION_FILE).write_text(found + "\n")
    return found


def stamp_install(package_dir: str | Path, root: str | Path) -> str | None:
    """Stamp an installed copy of the package with the revision of the tree it was installed from.

    Args:
        package_dir: the installed ``sglang_detspec`` folder, str or Path.
        root: the tree the install read, str or Path (its :func:`code_revision`).

    Returns:
        str: the revision stamped; None where the tree has none, and then the
        stamp is left empty, so a run records ``null`` rather than an older
        install's revision or its working copy's.

    Raises:
        ValueError: ``package_dir`` is not a folder.
    """
    package_dir = Path(package_dir)
    if not package_dir.is_dir():
        raise ValueError(f"package_dir must be the installed sglang_detspec folder, got {str(package_dir)!r}")
    found = code_revision(root)
    (package_dir / INSTALLED_STAMP).write_text(f"{found}\n" if found else "")
    return found


def main(argv: list[str] | None = None) -> int:
    """``python -m sglang_detspec.revision [--write | --stamp-install DIR] [--root ROOT]``: print the revision of
    the plugin this Python imports, what result files record (exit 1 where none is found); or write ``ROOT/.revision``
    from git; or stamp an installed package with ROOT's revision."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_detspec.revision",
        description="Print the revision of the plugin this Python imports (what result files record, with the "
                    "package's folder on stderr); or write --root's .revision from git; or stamp an installed package.")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help=f"write {REVISION_FILE} at --root from git")
    what.add_argument("--stamp-install", metavar="DIR",
                      help="stamp the installed sglang_detspec folder DIR with --root's revision")
    parser.add_argument("--root", default=".", help="the repository root --write and --stamp-install read "
                                                      "(default: the current folder)")
    args = parser.parse_args(argv)
    if args.root != "." and not (args.write or args.stamp_install):
        parser.error("--root goes with --write or --stamp-install: the revision printed is the imported plugin's")
    if args.write:
        print(write(args.root))
        return 0
    if args.stamp_install:
        found = stamp_install(args.stamp_install, args.root)
        why = (f"{Path(args.root).resolve()} is no git work tree and holds no {REVISION_FILE} (write one with "
               "--write where the repository is)")
    else:
        found = run_revision()
        why = (f"the plugin imported from {Path(__file__).resolve().parent} is in no git work tree and carries no "
               f"stamp ({INSTALLED_STAMP})")
    if found is None:
        print(f"no revision: {why}, and {REVISION_ENV} is unset", file=sys.stderr)
        return 1
    if not args.stamp_install:
        print(f"the plugin imported from {Path(__file__).resolve().parent}", file=sys.stderr)
    print(found)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
