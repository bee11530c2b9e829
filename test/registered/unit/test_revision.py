"""The revision a result file records: from git where the repository is there, else the stamp a copy carries,
and for a run's servers the stamp of the installed plugin."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import revision

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command (revisions come from git)")
BENCH = Path(__file__).resolve().parents[3] / "benchmark" / "serving"
QUIET_GIT = ("-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false")


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *QUIET_GIT, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv(revision.REVISION_ENV, raising=False)
    root = tmp_path / "repo"
    (root / "python").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "python" / "a.py").write_text("x = 1\n")
    (root / "docs" / "a.md").write_text("text\n")
    git(tmp_path, "init", "-q", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    return root


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An installed copy of the package: this module's file in a folder of its own, as pip --target lays it."""
    package = tmp_path / "site" / "sglang_detspec"
    package.mkdir(parents=True)
    monkeypatch.setattr(revision, "__file__", str(package / "revision.py"))
    return package


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


def test_a_copy_over_an_older_git_reads_the_stamp(repo, monkeypatch):
    # The stamp names a commit this repository does not hold: the files are a newer tree's, laid over this
    # older .git, whose HEAD would be a wrong answer. A stamp of a commit it holds stays behind git.
    head = git(repo, "rev-parse", "--short=12", "HEAD")
    (repo / revision.REVISION_FILE).write_text("0123456789ab\n")
    assert revision.code_revision(repo) == "0123456789ab"
    package = repo / "python" / "sglang_detspec"
    package.mkdir()
    monkeypatch.setattr(revision, "__file__", str(package / "revision.py"))
    assert revision.run_revision() == "0123456789ab"
    revision.write(repo)
    (repo / "python" / "a.py").write_text("x = 4\n")  # the repository moved on after its stamp
    assert revision.code_revision(repo) == revision.run_revision() == head + revision.CHANGED


def test_the_environment_wins(repo, installed, monkeypatch):
    (installed / revision.INSTALLED_STAMP).write_text("older\n")
    monkeypatch.setenv(revision.REVISION_ENV, " abc123 ")
    assert revision.code_revision(repo) == revision.run_revision() == "abc123"


def test_a_run_records_what_its_servers_import(repo, installed, tmp_path):
    # The install scripts stamp the installed copy; a later command's working copy may have moved on.
    head = revision.stamp_install(installed, repo)
    assert head == git(repo, "rev-parse", "--short=12", "HEAD") == revision.run_revision()
    (repo / "python" / "a.py").write_text("x = 3\n")
    assert revision.code_revision(repo) == head + revision.CHANGED and revision.run_revision() == head
    # Installed from a tree with no revision: the older stamp goes, the run records null, not the working
    # copy's revision (which may be newer than the install).
    bare = tmp_path / "bare"
    bare.mkdir()
    assert revision.stamp_install(installed, bare) is None
    assert (installed / revision.INSTALLED_STAMP).read_text() == ""
    assert revision.run_revision() is None
    (installed / revision.INSTALLED_STAMP).unlink()  # an install no script stamped: null as well
    assert revision.run_revision() is None
    with pytest.raises(ValueError, match="package_dir must be the installed sglang_detspec folder"):
        revision.stamp_install(tmp_path / "nowhere", repo)


def test_a_source_checkout_answers_from_its_own_tree(repo, monkeypatch, tmp_path):
    # Imported from a git checkout (pip install -e): its git answers, whatever a stray stamp says and wherever
    # the command runs.
    package = repo / "python" / "sglang_detspec"
    package.mkdir()
    (package / revision.INSTALLED_STAMP).write_text("stray\n")
    monkeypatch.setattr(revision, "__file__", str(package / "revision.py"))
    monkeypatch.chdir(tmp_path)
    assert revision.run_revision() == revision.code_revision(repo) != "stray"


def test_stamping_needs_a_repository(tmp_path, monkeypatch):
    monkeypatch.delenv(revision.REVISION_ENV, raising=False)
    with pytest.raises(ValueError, match="root must be a git work tree"):
        revision.write(tmp_path)


def test_a_failing_status_is_not_read_as_clean(repo, monkeypatch):
    real = revision._git

    def status_fails(root, *args):
        done = real(root, *args)
        return done if args[0] != "status" else subprocess.CompletedProcess(done.args, 128, "", "fatal")

    monkeypatch.setattr(revision, "_git", status_fails)
    assert revision.code_revision(repo).endswith(revision.UNKNOWN)


def test_the_command_line_stamps_reads_and_says_when_there_is_none(repo, installed, tmp_path, capsys):
    assert revision.main(["--write", "--root", str(repo)]) == 0
    stamped = capsys.readouterr().out.strip()
    assert stamped == (repo / revision.REVISION_FILE).read_text().strip()
    # Reading: the imported plugin's revision, what result files record (an unstamped install: none).
    assert revision.main([]) == 1
    assert "no revision: the plugin imported from" in capsys.readouterr().err
    # What the install script runs: exit 0 with the stamp, 1 (and an empty stamp) where the tree has none.
    assert revision.main(["--stamp-install", str(installed), "--root", str(repo)]) == 0
    assert capsys.readouterr().out.strip() == stamped == (installed / revision.INSTALLED_STAMP).read_text().strip()
    assert revision.main([]) == 0 and capsys.readouterr().out.strip() == stamped
    assert revision.main(["--stamp-install", str(installed), "--root", str(tmp_path)]) == 1
    assert (installed / revision.INSTALLED_STAMP).read_text() == ""
    with pytest.raises(SystemExit):
        revision.main(["--write", "--stamp-install", str(installed)])
    with pytest.raises(SystemExit):
        revision.main(["--root", str(repo)])  # the bare command reads the imported plugin, not a folder
    assert "--root goes with --write or --stamp-install" in capsys.readouterr().err


def test_the_serving_report_records_the_installed_revision(repo, installed, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])  # serving_run adds its folder too: undone after
    import serving_report
    import serving_run

    stamped = revision.stamp_install(installed, repo)
    (repo / "python" / "a.py").write_text("x = 4\n")  # the working copy moves on; the servers run the install
    assert serving_run.versions()["code_revision"] == stamped
    assert f"- code revision: {stamped}" in serving_report._meta_lines(serving_run.versions())


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
