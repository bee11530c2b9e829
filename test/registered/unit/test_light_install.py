"""`make demo`'s light venv: the in-process audit runs without SGLang, on the torch and transformers SGLang pins."""

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]


def demo_deps() -> dict[str, Requirement]:
    """The Makefile's DEMO_DEPS, by distribution name."""
    line = re.search(r"^DEMO_DEPS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert line, "Makefile defines no DEMO_DEPS"
    reqs = [Requirement(word) for word in line.group(1).split()]
    return {r.name: r for r in reqs}


def test_demo_pins_what_sglang_pins():
    deps = demo_deps()
    assert set(deps) == {"torch", "transformers", "rich", "requests"}
    pinned = {r.name: r for r in map(Requirement, importlib.metadata.requires("sglang")) if r.name in deps}
    for name in ("torch", "transformers"):
        assert str(deps[name].specifier) == str(pinned[name].specifier), name
        assert importlib.metadata.version(name) in deps[name].specifier  # the suite runs on the same versions


# Runs `detspec audit` (in-process) with every SGLang import refused, as in the light venv.
BLOCKED_RUN = """
import importlib.abc, json, sys

class NoSGLang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sglang", "sgl_kernel", "flashinfer"):
            raise ModuleNotFoundError(f"No module named {name!r} (the light demo venv has no SGLang)")

sys.meta_path.insert(0, NoSGLang())
from sglang_detspec.cli.main import main

rc = main(["audit", "--trials", "2", "--max-new-tokens", "2", "--max-batch-size", "4", "--no-control"])
print(json.dumps({"rc": rc, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def test_in_process_audit_runs_without_sglang():
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, proc.stdout + proc.stderr[-3000:]
    assert "torch" in result["modules"] and "sglang" not in result["modules"]
    assert "PASS" in proc.stdout


if __name__ == "__main__":
    import pytest

    sys.exit(pytest.main([__file__, "-v"]))
