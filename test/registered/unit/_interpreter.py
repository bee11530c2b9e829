"""Running a script under Triton's interpreter (``TRITON_INTERPRET=1``) in a child Python, for the CPU unit tests.

The switch is read when Triton is imported, so the kernels a test interprets
run in a child process (no other test's kernel is interpreted). The child
finds this package's source (``python/``) and any ``extra_paths`` first on
its path.
"""

import os
import subprocess
import sys
from pathlib import Path

PACKAGE_SOURCE = Path(__file__).resolve().parents[3] / "python"


def run_interpreted(script: str, *args: str, timeout: float, extra_paths=()) -> subprocess.CompletedProcess:
    """``python -c script args...`` with ``TRITON_INTERPRET=1``; stdout and stderr captured as text."""
    path = os.pathsep.join([*map(str, extra_paths), str(PACKAGE_SOURCE), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
