"""Make targets that would install gigabytes: they refuse early, say why, and install nothing.

The checks read behaviour (exit status, what exists afterwards) and the facts a
message must carry (the variable, the value, the way out), not whole sentences.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make(*args, env_extra=None):
    """`make -s ARGS` in the repository, outside any calling make, with PYTHON=false.

    PYTHON=false makes a check that wrongly lets the install through fail at its first
    step (`$(PYTHON) -m venv`) instead of starting an 11 GB pip install.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env.update(env_extra or {})
    return subprocess.run(["make", "-s", *args, "PYTHON=false"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None or bool(list(Path("/dev").glob("nvidia[0-9]*"))),
                    reason="this machine may have a CUDA GPU")
def test_e2e_target_without_a_gpu_stops_before_the_install(tmp_path):
    venv = tmp_path / "venv"  # where `make setup` would install SGLang
    proc = make("test-e2e", f"VENV={venv}")
    assert proc.returncode == 2, proc.stdout + proc.stderr  # make's status for a failed recipe
    assert "nothing ran" in proc.stderr and "no CUDA GPU" in proc.stderr
    assert "Error 5" in proc.stderr  # the recipe's own status: pytest's "no tests ran", as make test-gpu
    assert not venv.exists()


@pytest.mark.parametrize("venv_exists", [False, True], ids=["fresh", "left-by-a-failed-install"])
def test_setup_refuses_a_disk_without_room_for_the_install(tmp_path, venv_exists):
    venv = tmp_path / "deeper" / "venv"
    if venv_exists:
        venv.mkdir(parents=True)  # a first install that stopped midway leaves the folder, not the stamp
    proc = make("setup", f"VENV={venv}", "SETUP_FREE_GB=1000000000")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"GiB free on the disk of {venv}, and the install takes about 1000000000 GiB" in proc.stderr
    assert "SETUP_FREE_GB=N" in proc.stderr and "nothing was installed" in proc.stderr
    assert "installing sglang-detspec" not in proc.stdout
    assert venv.exists() == venv_exists and (tmp_path / "deeper").exists() == venv_exists  # nothing created


@pytest.mark.parametrize("value", ["abc", "10.5", ""])
def test_setup_names_a_bad_free_space_limit(tmp_path, value):
    proc = make("setup", f"VENV={tmp_path / 'venv'}", f"SETUP_FREE_GB={value}")
    assert proc.returncode == 2
    assert f"make setup: SETUP_FREE_GB must be a whole number of GiB, got '{value}'" in proc.stderr


def test_setup_warns_when_the_free_space_cannot_be_read(tmp_path):
    # A df that fails, first on PATH: the check says so and lets the install go on (here PYTHON=false stops it).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "df").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "df").chmod(0o755)
    proc = make("setup", f"VENV={tmp_path / 'venv'}",
                env_extra={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert "make setup: warning: could not read the free space of" in proc.stderr
    assert "installing sglang-detspec" in proc.stdout and proc.returncode == 2  # `false -m venv` failed


def test_venv_path_with_spaces_is_refused(tmp_path):
    proc = make("setup", f"VENV={tmp_path / 'my venv'}")
    assert proc.returncode == 2 and "VENV must be a path without spaces" in proc.stderr


def test_bare_make_lists_the_targets_and_installs_nothing(tmp_path):
    proc = make(f"VENV={tmp_path / 'venv'}")
    assert proc.returncode == 0, proc.stderr
    assert "make demo" in proc.stdout and "make test" in proc.stdout
    assert not (tmp_path / "venv").exists()


def test_help_lists_every_target_a_user_runs():
    """Every target the Makefile declares phony is in `make help`, except the set-up steps other targets run."""
    declared = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith(".PHONY:"):
            declared.update(line.split(":", 1)[1].split())
    listed = set(make().stdout.split())
    missing = sorted(t for t in declared - {"help", "demo-setup"} if t not in listed)
    assert not missing, f"make help does not list {missing}"


def test_a_missing_interpreter_is_named_with_the_way_out(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    proc = subprocess.run(["make", "-s", "demo-setup", f"DEMO_VENV={tmp_path / 'demo'}", "PYTHON=python3.no-such"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    # The message names the missing interpreter and the variable that picks another.
    assert "python3.no-such not found" in proc.stderr and "PYTHON=" in proc.stderr
    assert not (tmp_path / "demo").exists()


def test_an_unreachable_torch_index_is_named_before_anything_is_installed(tmp_path):
    import http.server
    import socket
    import threading

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    venv, python = tmp_path / "demo", f"INDEX_CHECK_PYTHON={sys.executable}"
    no_proxy = {"NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    proc = make("demo-setup", f"DEMO_VENV={venv}", python, f"TORCH_INDEX=http://127.0.0.1:{closed}/simple",
                env_extra=no_proxy)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"TORCH_INDEX=http://127.0.0.1:{closed}/simple cannot be reached from this machine" in proc.stderr
    assert "run make demo without TORCH_INDEX" in proc.stderr
    assert not venv.exists()
    # An index that answers passes the check; the install then stops at PYTHON=false's venv step.
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "index"))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = make("demo-setup", f"DEMO_VENV={venv}", python, f"TORCH_INDEX=http://127.0.0.1:{server.server_port}/",
                    env_extra=no_proxy)
    finally:
        server.shutdown()
        server.server_close()
    assert "cannot be reached" not in proc.stderr and proc.returncode == 2, proc.stdout + proc.stderr
    assert not venv.exists()


def test_serving_report_without_results_names_results():
    proc = make("bench-serving-report")
    assert proc.returncode == 2 and "set RESULTS to a results folder" in proc.stderr


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
