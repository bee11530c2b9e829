"""Sweep the fused draft-proposal kernel's launch configuration (tile, warps, programs per SM).

Prints CUDA-graph replay time per configuration and shape; every configuration
is first checked to give the same draws as the default one.
Usage: python benchmark/sweep_race_config.py
"""

import itertools
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from sglang_detspec.ops import exponential_race  # noqa: E402
from sglang_detspec.ops import race_triton as rt  # noqa: E402


def main() -> None:
    shapes = [(32, 163840), (128, 163840), (512, 163840)]
    data = {}
    for b, v in shapes:
        gen = torch.Generator(device="cuda").manual_seed(b)
        probs = torch.softmax(torch.randn(b, v, generator=gen, device="cuda"), dim=-1)
        seeds = torch.arange(b, device="cuda")
        pos = torch.arange(b, device="cuda") + 7
        data[(b, v)] = (probs, seeds, pos, exponential_race(probs, seeds, pos, stream="draft", kernel="triton"))
    for block, warps, per_sm in itertools.product([256, 512, 1024, 2048], [2, 4, 8], [2, 4, 8, 16]):
        rt.BLOCK, rt.NUM_WARPS, rt.PROGRAMS_PER_SM = block, warps, per_sm
        times = []
        for (b, v), (probs, seeds, pos, want) in data.items():
            fn = lambda: exponential_race(probs, seeds, pos, stream="draft", check=False, kernel="triton")  # noqa: E731
            assert torch.equal(fn(), want)
            times.append(do_bench_cudagraph(fn, rep=30) * 1e3)
        print(f"BLOCK={block:5d} warps={warps} programs/SM={per_sm:2d} " +
              " ".join(f"B={b}:{t:7.1f}us" for (b, _), t in zip(shapes, times)), flush=True)


if __name__ == "__main__":
    main()
