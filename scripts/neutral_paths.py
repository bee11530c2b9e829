#!/usr/bin/env python3
"""Machine paths in run artifacts, rewritten to neutral placeholders.

Logs, JUnit files and JSON results written on a GPU machine name that machine's
folders: the interpreter, its site-packages, the CUDA and GCC installs, caches,
the checkout and the folder the run wrote into. Committed artifacts carry a
placeholder for the folder and keep what follows it, so a traceback line such as
``<site-packages>/sglang/srt/managers/scheduler.py:123`` still reads. The first
rule that matches a path wins, in this order:

===================  =============================================================
``<results>``        the run's own result folders (``--results``)
``<python>``         an interpreter: any absolute ``.../bin/python``, ``python3``, ``python3.12``
``<site-packages>``  a ``site-packages`` or ``dist-packages`` folder, or the wheel kit's
                     ``pip --target`` folder (:data:`KIT_SITE`)
``<repo>``           the checkout (``--repo``; by default the one holding this file)
``<cuda>``           the CUDA toolkit, ``/usr/local/cuda`` or ``/usr/local/cuda-<version>``
``<cache>``          a user's ``.cache`` (``/root/.cache``, ``/home/<user>/.cache``)
``<home>``           anything else in a home folder
``<kit>``            the wheel kit's folder (:data:`KIT`, ``scripts/h200/README.md``)
``<tmp>`` ...        anything else under ``/tmp``, ``/usr``, ``/opt``, ``/work`` or ``/home``:
                     ``<tmp>``, ``<usr>``, ``<opt>``, ``<work>``, ``<home>`` for the root folder
===================  =============================================================

Two kinds of path stay: the project's own folders (``/tmp/detspec-*``, the defaults of its
scripts, e.g. the models of ``benchmark/serving/serving_run.py``) and ``#!/usr/bin/env``.
The rewrite is idempotent (no placeholder is a path) and keeps JSON and JSON Lines valid
(a path never holds a quote or a backslash, so a rewrite stays inside its string; the file is
parsed again before it is written), and XML (JUnit) files valid: there each placeholder is
written escaped (``&lt;repo&gt;``) and the file parsed again before it is written. Files ending
in ``.gz`` are rewritten inside; binary files
(any NUL byte: images, the tar inside a ``.tgz``) are left alone, so rewrite a folder before
packing it.

    python3 scripts/neutral_paths.py [--results DIR]... [--repo DIR]... [--check] PATH...

rewrites every file under each PATH in place; ``--check`` rewrites nothing, lists the
machine paths left (``file:line: path``) and exits 1 if there is one.
"""

import argparse
import gzip
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The wheel kit of scripts/h200/README.md: its transfers unpack into KIT, install.sh installs
# SGLang and this tree into KIT_SITE (pip --target), and env.sh preloads the libraries KIT_PRELOAD lists.
KIT = "/tmp/e2e"
KIT_SITE = "/tmp/site"
KIT_PRELOAD = "/tmp/ld_preload"
KIT_PATHS = (KIT, KIT_SITE, KIT_PRELOAD)
# Folders the project's own scripts choose (their defaults), which a reader can recreate.
PROJECT_PREFIX = "/tmp/detspec-"
SHEBANG = "#!/usr/bin/env"

# Where "anything else under a root" goes: "/usr/lib" becomes "<usr>/lib".
ROOTS = ("tmp", "usr", "opt", "work", "home")
PLACEHOLDERS = tuple(dict.fromkeys(("<results>", "<python>", "<site-packages>", "<repo>", "<cuda>", "<cache>",
                                     "<home>", "<kit>", *(f"<{root}>" for root in ROOTS))))


def xml_escaped(text: str) -> str:
    """``text`` with ``<`` and ``>`` as XML character references: a placeholder's form inside an XML file."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


# In XML files (JUnit) the placeholders are written escaped, so the file still parses.
XML_PLACEHOLDERS = tuple(xml_escaped(p) for p in PLACEHOLDERS)

# A path starts at a "/" that no path character precedes (so "/tmp" inside "a/tmp/b" is no
# path), that follows an XML tag's ">" (JUnit files), a JSON / C string escape such as "\n"
# or a compiler flag's letter ("-B/opt/gcc/bin"), and that no placeholder precedes: the
# rest of "<repo>/tmp/x" is the checkout's own folder, and a second rewrite changes nothing.
# Each pattern opens with the "/" itself, which lets the regular expression engine skip to the
# next "/" instead of trying every position (20 s against 0.4 s for docs/).
_START = (r"/(?:(?<=\\[nrt]/)|(?<=-[A-Za-z]/)|(?<![\w.+\-/~)}]/))"
          + "".join(f"(?<!{re.escape(p)}/)" for p in (*PLACEHOLDERS, *XML_PLACEHOLDERS)))
_END = r"(?![\w.+\-])"  # a whole folder name: "/tmp/e2e" is not "/tmp/e2e-r1"
_NAME = r"[\w.+\-]+"
_HOME = rf"(?:root|home/{_NAME})"


def _path(body: str) -> re.Pattern:
    """A path: a starting "/" (see _START), then ``body``, a pattern for the rest."""
    return re.compile(_START + body)


# A machine path as the committed-file check sees it: under one of these roots.
MACHINE_PATH = _path(rf"(?:{'|'.join((*ROOTS, 'root'))})/[\w.+\-/]*")

_FIXED_RULES = (
    (_path(rf"(?:{_NAME}/)+bin/python(?:\d+(?:\.\d+)*)?" + _END), "<python>"),
    (_path(rf"(?:(?:{_NAME}/)*(?:site|dist)-packages|{re.escape(KIT_SITE[1:])})" + _END), "<site-packages>"),
)
_SYSTEM_RULES = (
    (_path(r"usr/local/cuda(?:-[\d.]+)?" + _END), "<cuda>"),
    (_path(_HOME + r"/\.cache" + _END), "<cache>"),
    (_path(_HOME + _END), "<home>"),
    (_path(re.escape(KIT[1:]) + _END), "<kit>"),
    (_path(rf"(?<!#!/)(?!{re.escape(PROJECT_PREFIX[1:])})({'|'.join(ROOTS)})(?=/)"), r"<\1>"),
)


def _folder_rule(folders, placeholder):
    roots = {os.path.normpath(os.path.abspath(f)) for f in folders}
    roots = sorted((r for r in roots if r != "/"), key=len, reverse=True)  # a nested folder first
    if not roots:
        return ()
    return ((_path("(?:" + "|".join(re.escape(r[1:]) for r in roots) + ")" + _END), placeholder),)


def rules(results=(), repos=(REPO,)):
    """The rewrite rules in order: (compiled pattern, replacement)."""
    return (*_folder_rule(results, "<results>"), *_FIXED_RULES, *_folder_rule(repos, "<repo>"), *_SYSTEM_RULES)


def neutralise(text: str, results=(), repos=(REPO,), *, xml: bool = False) -> str:
    """``text`` with every machine path's folder replaced by its placeholder (module docstring).

    ``xml``: the text is an XML file's, so each placeholder goes in escaped (``&lt;repo&gt;``).
    """
    for pattern, placeholder in rules(results, repos):
        text = pattern.sub(xml_escaped(placeholder) if xml else placeholder, text)
    return text


def machine_paths(text: str) -> list[tuple[int, str]]:
    """(line number, path) of each machine path in ``text``, the project's folders and shebangs aside."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in MACHINE_PATH.finditer(line):
            path = m.group()
            shebang = line[:m.start()].endswith("#!") and "#!" + path == SHEBANG
            if not (path.startswith(PROJECT_PREFIX) or shebang):
                found.append((number, path))
    return found


def read_text(path: Path) -> str | None:
    """The file's text (inside a ``.gz``), or None for a binary file (one with a NUL byte)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return None
    if b"\0" in data:
        return None
    # A log cut at a byte limit can end inside a character: such bytes go through unchanged.
    return data.decode("utf-8", "surrogateescape")


def _check_json(path: Path, before: str, after: str) -> None:
    kind = Path(path.name.removesuffix(".gz")).suffix
    if kind not in (".json", ".jsonl"):
        return
    docs = (lambda s: [s]) if kind == ".json" else (lambda s: [ln for ln in s.splitlines() if ln.strip()])
    try:
        for doc in docs(before):
            json.loads(doc)
    except ValueError:
        return  # a file cut short by a time limit was no JSON to begin with
    for doc in docs(after):
        json.loads(doc)  # raises ValueError: the file is not written


def _check_xml(path: Path, before: str, after: str) -> None:
    if Path(path.name.removesuffix(".gz")).suffix != ".xml":
        return
    import xml.etree.ElementTree as ElementTree

    try:
        ElementTree.fromstring(before)
    except ElementTree.ParseError:
        return  # a file cut short was no XML to begin with
    ElementTree.fromstring(after)  # raises ParseError: the file is not written


def rewrite_file(path: Path, results=(), repos=(REPO,)) -> bool | None:
    """Rewrite ``path`` in place: True if it changed, False if not, None if binary (left alone)."""
    text = read_text(path)
    if text is None:
        return None
    new = neutralise(text, results, repos, xml=Path(path.name.removesuffix(".gz")).suffix == ".xml")
    if new == text:
        return False
    _check_json(path, text, new)
    _check_xml(path, text, new)
    data = new.encode("utf-8", "surrogateescape")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return True


def files_under(root: Path):
    """Every regular file under ``root`` (or ``root`` itself), symbolic links left out."""
    if root.is_file() and not root.is_symlink():
        yield root
        return
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                yield path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", type=Path, help="files or folders, rewritten in place")
    p.add_argument("--results", action="append", default=[], help="a result folder of the run (<results>)")
    p.add_argument("--repo", action="append", default=None, help=f"a checkout (<repo>; default {REPO})")
    p.add_argument("--check", action="store_true", help="rewrite nothing; list machine paths, exit 1 if any")
    args = p.parse_args(argv)
    repos = args.repo or [REPO]
    counts = {True: 0, False: 0, None: 0}
    left = refused = 0
    for root in args.paths:
        for path in files_under(root):
            if args.check:
                text = read_text(path)
                for number, found in machine_paths(text or ""):
                    print(f"{path}:{number}: {found}")
                    left += 1
                continue
            try:
                counts[rewrite_file(path, args.results, repos)] += 1
            except ValueError as exc:  # the rewrite would break the file's JSON: the rest still gets done
                print(f"neutral_paths: {path} left as it was: {exc}", file=sys.stderr)
                refused += 1
    if args.check:
        return 1 if left else 0
    print(f"neutral_paths: {counts[True]} files rewritten, {counts[False]} unchanged, "
          f"{counts[None]} binary left alone" + (f", {refused} left as they were" if refused else ""))
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
