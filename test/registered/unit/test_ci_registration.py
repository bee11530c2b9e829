"""Every test file registers with SGLang's CI markers, as SGLang's own collector parses them."""

import glob
import os

import pytest
from sglang.test.ci.ci_register import HWBackend, collect_tests, register_cpu_ci

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = {
    "unit": (HWBackend.CPU, "detspec-unit-cpu"),
    "cuda": (HWBackend.CUDA, "detspec-kernels-cuda"),
    "e2e": (HWBackend.CUDA, "detspec-e2e-cuda"),
}


@pytest.mark.parametrize("folder", sorted(SUITES))
def test_folder_registers_every_file(folder):
    files = sorted(glob.glob(os.path.join(ROOT, folder, "test_*.py")))
    assert files
    registries = collect_tests(files, sanity_check=True)
    backend, suite = SUITES[folder]
    by_file = {os.path.basename(r.filename): r for r in registries}
    assert set(by_file) == {os.path.basename(f) for f in files}
    for name, reg in by_file.items():
        assert reg.backend == backend and reg.effective_suite == suite and reg.est_time > 0, name


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
