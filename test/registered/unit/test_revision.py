"""The revision a result file records: from git where the repository is there, else the stamp a copy carries."""

import subprocess

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import revision

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv(revision.REVISION_ENV, raising=False)
    root = tmp_path / "repo"
    (root / "python").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "python" / "a.py").write_text("x = 1\n")
    (root / "docs" / "a.md").write_text("text\n")
    git(tmp_path, "init", "-q", str(root))
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root


def test_git_names_head_and_code_changes_only(repo):
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    assert revision.code_revision(repo) == head and len(head) == 12
    (repo / "docs" / "a.md").write_text("other\n")  # docs and run folders do not change what runs
    (repo / "docs" / "new.md").write_text("new\n")
    assert revision.code_revision(repo) == head
    (repo / "python" / "b.py").write_text("y = 2\n")  # a new file travels with the copy
    assert revision.code_revision(repo) == head + revision.CHANGED
    (repo / "python" / "b.py").unlink()
    (repo / "python" / "a.py").write_text("x = 2\n")
    assert revision.code_revision(repo) == head + revision.CHANGED


def test_a_copy_without_git_reads_the_stamp(repo, tmp_path):
    stamped = revision.write(repo)
    assert (repo / revision.REVISION_FILE).read_text() == stamped + "\n"
    assert revision.code_revision(repo) == stamped  # the stamp is not a code change
    copy = tmp_path / "copy"
    copy.mkdir()
    assert revision.code_revision(copy) is None  # no git, no stamp: null, never a guess
    (copy / revision.REVISION_FILE).write_text((repo / revision.REVISION_FILE).read_text())
    assert revision.code_revision(copy) == stamped


def test_the_environment_wins(repo, monkeypatch):
    monkeypatch.setenv(revision.REVISION_ENV, " abc123 ")
    assert revision.code_revision(repo) == "abc123"


def test_stamping_needs_a_repository(tmp_path, monkeypatch):
    monkeypatch.delenv(revision.REVISION_ENV, raising=False)
    with pytest.raises(ValueError, match="root must be a git work tree"):
        revision.write(tmp_path)


def test_the_command_line_stamps_and_reads(repo, capsys):
    assert revision.main(["--write", "--root", str(repo)]) == 0
    stamped = capsys.readouterr().out.strip()
    assert revision.main(["--root", str(repo)]) == 0
    assert capsys.readouterr().out.strip() == stamped == (repo / revision.REVISION_FILE).read_text().strip()


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
