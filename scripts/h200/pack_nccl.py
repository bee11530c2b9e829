"""Pack the NCCL wheel that torch 2.14.1 declares for the H200 transfer folders.

torch 2.14.1+cu130 needs NCCL symbols (``ncclCommResume`` and ten more) that the
H200 machine's own NCCL 2.28.9 lacks. The base kit satisfies the loader with a
symbol stub, which leaves no working collectives (no ``--tp 2`` / ``--dp 2``).
Shipping ``nvidia-nccl-cu13==2.30.7`` (the version torch declares) instead puts
the real library under ``<site>/nvidia/nccl/lib``, where torch finds it, and
``install_nccl.sh`` then drops the stub. This writes the wheel (downloaded with
pip, or given) cut into 60 MiB parts in new ``.whl/cNN`` folders after the
existing ones; the H200 side joins ``*.partNN`` files back (``remote/install.sh``).

    python3 scripts/h200/pack_nccl.py                 # pip download, cp312 manylinux x86_64
    python3 scripts/h200/pack_nccl.py --wheel PATH    # an already downloaded wheel
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SPEC = "nvidia-nccl-cu13==2.30.7"
PART_BYTES = 60 * 2**20
PLATFORMS = ("manylinux_2_18_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_28_x86_64")


def download(dest: Path) -> Path:
    """pip-download the cp312 Linux x86_64 wheel of :data:`SPEC` into ``dest``; its path."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest), SPEC]
    for plat in PLATFORMS:
        cmd[5:5] = ["--platform", plat]
    subprocess.run(cmd, check=True)
    found = sorted(dest.glob("nvidia_nccl_cu13-2.30.7-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download of {SPEC} left no wheel in {dest}")
    return found[0]


def pack(wheel: Path, dest: Path) -> list[str]:
    """Cut ``wheel`` into 60 MiB parts, one new ``dest/cNN`` folder each; the folder names.

    Raises:
        ValueError: ``wheel`` is not a ``nvidia_nccl_cu13`` wheel.
    """
    if not re.fullmatch(r"nvidia_nccl_cu13-[0-9.]+-.+\.whl", wheel.name):
        raise ValueError(f"wheel must be an nvidia_nccl_cu13 wheel, got {wheel.name}")
    dest.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for p in dest.iterdir() if (m := re.fullmatch(r"c(\d+)", p.name))]
    first = max(taken, default=-1) + 1
    folders = []
    with open(wheel, "rb") as src:
        i = 0
        while chunk := src.read(PART_BYTES):
            folder = dest / f"c{first + i:02d}"
            folder.mkdir()
            (folder / f"{wheel.name}.part{i:02d}").write_bytes(chunk)
            folders.append(folder.name)
            i += 1
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, default=None, help="use this wheel instead of downloading")
    parser.add_argument("--dest", type=Path, default=Path(".whl"), help="transfer folder root (default .whl)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = args.wheel or download(Path(tmp))
        try:
            folders = pack(wheel, args.dest)
        except ValueError as exc:
            parser.error(str(exc))
        print(f"{wheel.name}: {wheel.stat().st_size / 2**20:.0f} MiB in {', '.join(folders)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
