"""Pack sgl-kernel's FlashAttention-3 library for the H200 transfer folders.

The wheel set that travels to the H200 drops ``sgl_kernel/flash_ops.abi3.so``
(FA3, about 1 GiB unpacked) to save transfer time, which leaves only the
Triton attention backend there. SGLang 0.5.23 captures the multi-layer EAGLE
draft-extend step as one CUDA graph only with an attention backend that
stages draft-extend metadata (FA3 on Hopper), so the multi-layer suite needs
it. This writes the library alone as a zip named like a wheel (the unpacker
on the H200 extracts every ``*.whl`` into the site folder) and cuts it into
60 MiB parts, in new ``.whl/cNN`` folders after the existing ones.

    python3 scripts/h200/pack_fa3.py ~/.cache/<wheel cache>/sglang_kernel-0.4.10-*.whl
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

MEMBER = "sgl_kernel/flash_ops.abi3.so"
PART_BYTES = 60 * 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="the unslimmed sglang_kernel wheel that holds " + MEMBER)
    parser.add_argument("--dest", type=Path, default=Path(".whl"), help="transfer folder root (default .whl)")
    args = parser.parse_args(argv)

    with zipfile.ZipFile(args.wheel) as source:
        try:
            info = source.getinfo(MEMBER)
        except KeyError:
            print(f"pack_fa3: {args.wheel} has no {MEMBER} (a slimmed wheel?)", file=sys.stderr)
            return 1
        version = args.wheel.name.split("-")[1]
        name = f"sgl_kernel_fa3-{version}-py3-none-any.whl"
        staged = args.dest / name
        args.dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as out:
            out.writestr(info, source.read(info))  # keeps the executable mode bits

    taken = [int(m.group(1)) for p in args.dest.iterdir() if (m := re.fullmatch(r"c(\d+)", p.name))]
    first = max(taken, default=-1) + 1
    data = staged.read_bytes()
    staged.unlink()
    folders = []
    for i, start in enumerate(range(0, len(data), PART_BYTES)):
        folder = args.dest / f"c{first + i:02d}"
        folder.mkdir()
        (folder / f"{name}.part{i:02d}").write_bytes(data[start:start + PART_BYTES])
        folders.append(folder.name)
    print(f"{name}: {len(data) / 2**20:.0f} MiB in {', '.join(folders)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
