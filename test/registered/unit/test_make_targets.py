"""Make targets on a machine without a GPU: they say nothing ran, and install nothing first."""

import shutil
import subprocess
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi (maybe a GPU)")
@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_e2e_target_without_a_gpu_stops_before_the_install(tmp_path):
    venv = tmp_path / "venv"  # where `make setup` would install SGLang
    proc = subprocess.run(["make", "-s", "test-e2e", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # make's status for a failed recipe
    assert "make test-e2e: nothing ran, nothing installed: nvidia-smi lists no CUDA GPU here" in proc.stdout
    assert "Error 5" in proc.stderr  # the recipe's own status: pytest's "no tests ran", as make test-gpu
    assert not venv.exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_setup_refuses_a_disk_without_room_for_the_install(tmp_path):
    venv = tmp_path / "venv"
    proc = subprocess.run(["make", "-s", "setup", f"VENV={venv}", "SETUP_FREE_GB=1000000000"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "GB free on the disk of" in proc.stderr and "the install takes about 1000000000 GB" in proc.stderr
    assert "nothing was installed" in proc.stderr and not venv.exists()


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
