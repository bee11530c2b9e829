"""Launch the fused draft-proposal kernel a few times at one shape, for a profiler.

Usage: ncu --clock-control none --kernel-name regex:_race_argmax -c 1 \
           python3 scripts/profile_race_kernel.py [B] [V]
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from sglang_detspec.ops import exponential_race  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("b", nargs="?", type=int, default=128, help="rows (draft proposals), default 128")
    parser.add_argument("v", nargs="?", type=int, default=163840, help="vocabulary size, default 163840")
    args = parser.parse_args()
    b, v = args.b, args.v
    gen = torch.Generator(device="cuda").manual_seed(0)
    probs = torch.softmax(torch.randn(b, v, generator=gen, device="cuda"), dim=-1)
    seeds = torch.arange(b, device="cuda")
    pos = torch.arange(b, device="cuda") + 1000
    for _ in range(3):
        exponential_race(probs, seeds, pos, stream="draft", check=False, kernel="triton")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
