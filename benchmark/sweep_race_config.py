"""Sweep the launch tunables of the race, verify_chain and coupled kernels.

The tunables live in ``sglang_detspec.ops.triton_config`` (BLOCK, NUM_WARPS,
PROGRAMS_PER_SM) and every kernel reads them at launch, so one sweep covers
all three. Each configuration is first checked to give the same outputs as
the default one (the draws never depend on the launch configuration), then
timed by CUDA-graph replay. Prints one table row per configuration, the torch
and Triton versions on top, and the best configuration per kernel at the end.

Usage: python benchmark/sweep_race_config.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import triton
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from sglang_detspec.ops import (  # noqa: E402
    Stream, coupled_verify_chain, exponential_race, verify_chain,
)
from sglang_detspec.ops import triton_config as cfg  # noqa: E402

V = 163840
K = 3


def cases():
    """(name, fn) per kernel and shape; fn runs the Triton kernel unchecked."""
    out = []
    for b in (32, 128, 512):
        gen = torch.Generator(device="cuda").manual_seed(b)
        seeds = torch.randint(0, 2**62, (b,), generator=gen, device="cuda")
        pos = torch.randint(0, 2**20, (b,), generator=gen, device="cuda")
        probs = torch.softmax(torch.randn(b, V, generator=gen, device="cuda"), dim=-1)
        out.append((f"race B={b}", lambda w=probs, s=seeds, p=pos: exponential_race(
            w, s, p, stream="draft", check=False, kernel="triton")))
        if b == 512:
            continue  # verify rows: [B, K+1, V] float32 at B = 512 is 1.3 GB; 32 and 128 suffice
        q = torch.softmax(torch.randn(b, K, V, generator=gen, device="cuda"), -1)
        tp = torch.softmax(torch.randn(b, K + 1, V, generator=gen, device="cuda"), -1)
        tp[:, :K] = 0.1 * tp[:, :K] + 0.9 * q
        x = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(b, K)
        xc = torch.stack([exponential_race(q[:, j], seeds, pos + j, stream=Stream.TARGET)[:, 0] for j in range(K)], 1)
        out.append((f"verify K={K} B={b}", lambda x=x, q=q, tp=tp, s=seeds, p=pos: verify_chain(
            x, q, tp, s, p, check=False, kernel="triton")))
        out.append((f"coupled K={K} B={b}", lambda x=xc, tp=tp, s=seeds, p=pos: coupled_verify_chain(
            x, tp, s, p, check=False, kernel="triton")))
    return out


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(torch.equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a small grid around the defaults")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sweep_race_config: needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    runs = cases()
    want = {name: fn() for name, fn in runs}
    blocks = [512, 1024, 2048] if args.quick else [256, 512, 1024, 2048]
    warps = [4, 8] if args.quick else [2, 4, 8]
    per_sm = [2, 4, 8] if args.quick else [2, 4, 8, 16]
    print("| BLOCK | NUM_WARPS | PROGRAMS_PER_SM | " + " | ".join(f"{n} us" for n, _ in runs) + " |")
    print("|---|---|---|" + "---|" * len(runs))
    best = {}
    default = (cfg.BLOCK, cfg.NUM_WARPS, cfg.PROGRAMS_PER_SM)
    for conf in itertools.product(blocks, warps, per_sm):
        cfg.BLOCK, cfg.NUM_WARPS, cfg.PROGRAMS_PER_SM = conf
        times = []
        for name, fn in runs:
            assert same(fn(), want[name]), f"{name} differs at {conf}"
            t = do_bench_cudagraph(fn, rep=30) * 1e3
            times.append(t)
            if name not in best or t < best[name][0]:
                best[name] = (t, conf)
        print(f"| {conf[0]} | {conf[1]} | {conf[2]} | " + " | ".join(f"{t:.1f}" for t in times) + " |", flush=True)
    cfg.BLOCK, cfg.NUM_WARPS, cfg.PROGRAMS_PER_SM = default
    print("\nbest per kernel (BLOCK, NUM_WARPS, PROGRAMS_PER_SM):")
    for name, (t, conf) in best.items():
        print(f"  {name}: {t:.1f} us at {conf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
