"""What the docs and the package point a reader to exists in the repository.

Start-up notes, ``--help`` texts and comments cite run folders (``docs/e2e/<run>/``,
``docs/benchmarks/.../<run>/``) as the evidence for a claim, and the Markdown files link
to each other and to those folders. A renamed or never-committed folder would leave a
server log or a README pointing at nothing; these tests name every such reference.
"""

import re
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "python" / "sglang_detspec"
# A repository path inside a string or comment: docs/ then path characters; a '#' starts an anchor.
DOC_PATH = re.compile(r"docs/[A-Za-z0-9_./-]+")
# An inline Markdown link's target: ](target).
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
TRAILING = ".,;:)/`'\""


def cited_doc_paths(text: str) -> list[str]:
    """Every ``docs/...`` path in ``text``, without an anchor or the punctuation that closes a sentence."""
    return [m.group(0).rstrip(TRAILING) for m in DOC_PATH.finditer(text)]


def relative_link_targets(text: str) -> list[str]:
    """Targets of ``text``'s inline Markdown links that are files in the repository (no scheme, no bare anchor)."""
    targets = []
    for m in MD_LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#")[0])
    return targets


def _markdown_files() -> list[Path]:
    return [p for p in ROOT.rglob("*.md")
            if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)]


def test_the_helpers_find_what_they_should():
    text = ("see docs/e2e/2026-12-06-h100-triton-split/, and docs/usage.md#what-holds. "
            "[run](docs/x/README.md) [web](https://example.org/a) [here](#anchor) [up](../y.md#z)")
    assert cited_doc_paths(text) == ["docs/e2e/2026-12-06-h100-triton-split", "docs/usage.md",
                                     "docs/x/README.md"]
    assert relative_link_targets(text) == ["docs/x/README.md", "../y.md"]


def test_every_docs_path_the_package_cites_exists():
    missing = []
    for source in sorted(PACKAGE.rglob("*.py")):
        for path in cited_doc_paths(source.read_text()):
            if not (ROOT / path).exists():
                missing.append(f"{source.relative_to(ROOT)}: {path}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize("markdown", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_a_markdown_file_resolves(markdown):
    missing = [t for t in relative_link_targets(markdown.read_text()) if not (markdown.parent / t).exists()]
    assert not missing, f"{markdown.relative_to(ROOT)} links to missing files: {missing}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
