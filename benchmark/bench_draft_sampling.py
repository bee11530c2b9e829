"""Draft sampler and chain verifier: CUDA-graph replay time and extra peak memory.

Side by side in one run, per (B, V):
  (a) unseeded     SGLang's unseeded draft proposal: exponential noise, float32 scores, argmax
  (b) materialized SGLang 0.5.23's seeded draft proposal as defined: full [B, V] hash
                   matrix (one Triton hash kernel), float64 scores, argmax
  (c) reference    sglang_detspec's torch reference (chunked)
  (d) kernel       sglang_detspec's fused Triton kernel
plus the HBM floor (reading the float32 probabilities once at the measured
device-copy bandwidth). verify_chain: (c) and (d) at K in {1, 3, 7} against
its own floor (reading p and q once). Side by side with it at the same B, K:
coupled_verify_chain (reference and kernel, drafts raced on the TARGET stream
so acceptance is realistic), the plain race of one row, and the coupled floor
(reading the K+1 target rows once); coupled_verify_tree on an 8-node top-4
tree. Writes a markdown table, a JSON file and a PNG plot, each with the torch
and Triton versions. Needs a CUDA GPU with torch and Triton.

Usage: python benchmark/bench_draft_sampling.py [--out-dir DIR] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys

try:
    import torch
    import triton
    import triton.language as tl
    from triton.testing import do_bench, do_bench_cudagraph
except ImportError as exc:  # the benchmark needs the GPU stack; say so instead of a traceback
    sys.exit(f"bench_draft_sampling: needs torch and Triton with a CUDA GPU ({exc}); run `make setup` on a GPU machine")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from sglang_detspec.ops import (  # noqa: E402
    Stream, coupled_verify_chain, coupled_verify_tree, exponential_race, verify_chain,
)
from sglang_detspec.ops.triton_hash import hash_column, row_prefix  # noqa: E402

MIB = 2**20


@triton.jit
def _hash_matrix_kernel(
    seed_ptr,  # [B] int64
    pos_ptr,  # [B] int64
    out_ptr,  # [B, V] int32 out (uint32 bits), as SGLang's murmur_hash32 writes
    V,
    SALT_LO: tl.constexpr,
    SALT_HI: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    prefix = row_prefix(tl.load(seed_ptr + row), tl.load(pos_ptr + row), SALT_LO, SALT_HI)
    h = hash_column(prefix, idx.to(tl.uint32))  # draft step 0: columns are token ids
    tl.store(out_ptr + row.to(tl.int64) * V + idx, h.to(tl.int32, bitcast=True), mask=idx < V)


def materialized_seeded(probs, seeds, positions):
    """SGLang 0.5.23's seeded fast_sample arithmetic (draft step 0) on a materialized hash matrix."""
    b, v = probs.shape
    salt = Stream.DRAFT.salt
    hashed = torch.empty(b, v, dtype=torch.int32, device=probs.device)
    _hash_matrix_kernel[(b, triton.cdiv(v, 1024))](
        seeds, positions, hashed, v, SALT_LO=salt & 0xFFFFFFFF, SALT_HI=salt >> 32, BLOCK=1024
    )
    scores = hashed.to(torch.int64).bitwise_and_(0xFFFFFFFF).to(torch.float64)
    scores.add_(0.5).div_(2.0**32).log_().neg_().reciprocal_()
    scores.mul_(probs)
    return scores.argmax(dim=-1, keepdim=True)


def unseeded(probs):
    q = torch.empty_like(probs).exponential_(1.0).clamp_min_(torch.finfo(torch.float32).tiny)
    return (probs.float() / q).argmax(dim=-1, keepdim=True)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    n = 2**30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), rep=200)
    return 2 * n / (ms * 1e-3)


def extra_peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / MIB


def measure(fn) -> dict:
    fn()  # compile / warm up outside capture
    return {"us": do_bench_cudagraph(fn, rep=50) * 1e3, "extra_mib": extra_peak_mib(fn)}


def bench_race(bs, vs, bw):
    rows = []
    for v in vs:
        for b in bs:
            gen = torch.Generator(device="cuda").manual_seed(b + v)
            probs = torch.softmax(torch.randn(b, v, generator=gen, device="cuda"), dim=-1)
            seeds = torch.randint(0, 2**62, (b,), generator=gen, device="cuda")
            pos = torch.randint(0, 2**20, (b,), generator=gen, device="cuda")
            ours = exponential_race(probs, seeds, pos, stream="draft", kernel="triton")
            assert torch.equal(ours, materialized_seeded(probs, seeds, pos)), "kernel != SGLang definition"
            row = {"B": b, "V": v, "floor_us": b * v * 4 / bw * 1e6}
            row["unseeded"] = measure(lambda: unseeded(probs))
            row["materialized"] = measure(lambda: materialized_seeded(probs, seeds, pos))
            row["reference"] = measure(
                lambda: exponential_race(probs, seeds, pos, stream="draft", check=False, kernel="torch"))
            row["kernel"] = measure(
                lambda: exponential_race(probs, seeds, pos, stream="draft", check=False, kernel="triton"))
            rows.append(row)
            print(f"race B={b:4d} V={v:6d} " + " ".join(
                f"{m}={row[m]['us']:8.1f}us/{row[m]['extra_mib']:7.2f}MiB"
                for m in ("unseeded", "materialized", "reference", "kernel")) + f" floor={row['floor_us']:.1f}us",
                flush=True)
            del probs
    return rows


def bench_verify(bs, ks, v, bw):
    rows = []
    for k in ks:
        for b in bs:
            gen = torch.Generator(device="cuda").manual_seed(b * 10 + k)
            q = torch.softmax(torch.randn(b, k, v, generator=gen, device="cuda"), -1)
            p = torch.softmax(torch.randn(b, k + 1, v, generator=gen, device="cuda"), -1)
            p[:, :k] = 0.1 * p[:, :k] + 0.9 * q
            x = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, k)
            seeds = torch.randint(0, 2**62, (b,), generator=gen, device="cuda")
            pos = torch.randint(0, 2**20, (b,), generator=gen, device="cuda")
            row = {"B": b, "K": k, "V": v, "floor_us": b * (2 * k + 1) * v * 4 / bw * 1e6,
                   "coupled_floor_us": b * (k + 1) * v * 4 / bw * 1e6}
            row["reference"] = measure(lambda: verify_chain(x, q, p, seeds, pos, check=False, kernel="torch"))
            row["kernel"] = measure(lambda: verify_chain(x, q, p, seeds, pos, check=False, kernel="triton"))
            _, acc = verify_chain(x, q, p, seeds, pos, kernel="triton")
            row["mean_accept"] = float(acc.double().mean())
            # Coupled drafts: x_j = race(q_j, TARGET, t + j), the same uniforms as the target race.
            xc = torch.stack([exponential_race(q[:, j], seeds, pos + j, stream=Stream.TARGET, kernel="triton")[:, 0]
                              for j in range(k)], 1)
            row["race_one_row"] = measure(
                lambda: exponential_race(p[:, 0], seeds, pos, stream="target", check=False, kernel="triton"))
            row["coupled_reference"] = measure(
                lambda: coupled_verify_chain(xc, p, seeds, pos, check=False, kernel="torch"))
            row["coupled_kernel"] = measure(
                lambda: coupled_verify_chain(xc, p, seeds, pos, check=False, kernel="triton"))
            _, acc_c = coupled_verify_chain(xc, p, seeds, pos, kernel="triton")
            row["coupled_mean_accept"] = float(acc_c.double().mean())
            rows.append(row)
            print(f"verify K={k} B={b:4d} ref={row['reference']['us']:9.1f}us kernel={row['kernel']['us']:7.1f}us/"
                  f"{row['kernel']['extra_mib']:.2f}MiB floor={row['floor_us']:.1f}us accept={row['mean_accept']:.2f} | "
                  f"coupled kernel={row['coupled_kernel']['us']:7.1f}us ref={row['coupled_reference']['us']:9.1f}us "
                  f"floor={row['coupled_floor_us']:.1f}us accept={row['coupled_mean_accept']:.2f} "
                  f"race(1 row)={row['race_one_row']['us']:.1f}us", flush=True)
            del p, q
    return rows


# SGLang-like top-4 expansion with 8 nodes: root -> 4 children, the first child -> 3 more.
TREE_PARENTS = [-1, 0, 0, 0, 0, 1, 1, 1]


def tree_links(b, device):
    n = len(TREE_PARENTS)
    nxt, sib = [-1] * n, [-1] * n
    for c in range(1, n):
        par = TREE_PARENTS[c]
        if nxt[par] == -1:
            nxt[par] = c
        else:
            last = nxt[par]
            while sib[last] != -1:
                last = sib[last]
            sib[last] = c
    return (torch.tensor([nxt] * b, device=device), torch.tensor([sib] * b, device=device))


def bench_tree(bs, v, bw):
    rows = []
    n = len(TREE_PARENTS)
    for b in bs:
        gen = torch.Generator(device="cuda").manual_seed(b)
        p = torch.softmax(torch.randn(b, n, v, generator=gen, device="cuda"), -1)
        cand = torch.randint(0, v, (b, n), generator=gen, device="cuda")
        nxt, sib = tree_links(b, "cuda")
        seeds = torch.randint(0, 2**62, (b,), generator=gen, device="cuda")
        pos = torch.randint(0, 2**20, (b,), generator=gen, device="cuda")
        row = {"B": b, "N": n, "V": v, "floor_us": b * n * v * 4 / bw * 1e6}
        row["reference"] = measure(lambda: coupled_verify_tree(cand, nxt, sib, p, seeds, pos, check=False,
                                                               kernel="torch"))
        row["kernel"] = measure(lambda: coupled_verify_tree(cand, nxt, sib, p, seeds, pos, check=False,
                                                            kernel="triton"))
        rows.append(row)
        print(f"coupled tree N={n} B={b:4d} ref={row['reference']['us']:9.1f}us kernel={row['kernel']['us']:7.1f}us "
              f"floor={row['floor_us']:.1f}us", flush=True)
        del p
    return rows


def markdown(meta, race_rows, verify_rows, tree_rows) -> str:
    out = [f"# Draft sampler and chain verifier benchmark", "",
           f"- date: {meta['date']}", f"- device: {meta['device']}", f"- torch {meta['torch']}, triton {meta['triton']}",
           f"- measured device-copy bandwidth: {meta['copy_bw_tbs']:.2f} TB/s (read + write)",
           "- times: CUDA-graph replay, mean of `triton.testing.do_bench_cudagraph`; memory: extra peak "
           "allocation of one eager call", "",
           "## Draft proposal (exponential race, num_samples = 1)", "",
           "| B | V | unseeded us | materialized seeded us | reference us | kernel us | HBM floor us | "
           "kernel / materialized | kernel / unseeded | kernel / floor | extra MiB materialized | extra MiB kernel |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in race_rows:
        k, m, u = r["kernel"]["us"], r["materialized"]["us"], r["unseeded"]["us"]
        out.append(f"| {r['B']} | {r['V']} | {u:.1f} | {m:.1f} | {r['reference']['us']:.1f} | {k:.1f} | "
                   f"{r['floor_us']:.1f} | {k / m:.3f} | {k / u:.2f} | {k / r['floor_us']:.2f} | "
                   f"{r['materialized']['extra_mib']:.2f} | {r['kernel']['extra_mib']:.3f} |")
    out += ["", f"## verify_chain and coupled_verify_chain (V = {verify_rows[0]['V'] if verify_rows else '-'})", "",
            "| K | B | reference us | kernel us | floor us (p and q once) | kernel / floor | extra MiB kernel | "
            "mean accept | coupled kernel us | coupled reference us | coupled floor us (K+1 rows once) | "
            "coupled kernel / floor | coupled / verify kernel | race of one row us | coupled mean accept |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in verify_rows:
        ck = r["coupled_kernel"]["us"]
        out.append(f"| {r['K']} | {r['B']} | {r['reference']['us']:.1f} | {r['kernel']['us']:.1f} | "
                   f"{r['floor_us']:.1f} | {r['kernel']['us'] / r['floor_us']:.2f} | "
                   f"{r['kernel']['extra_mib']:.3f} | {r['mean_accept']:.2f} | {ck:.1f} | "
                   f"{r['coupled_reference']['us']:.1f} | {r['coupled_floor_us']:.1f} | "
                   f"{ck / r['coupled_floor_us']:.2f} | {ck / r['kernel']['us']:.2f} | "
                   f"{r['race_one_row']['us']:.1f} | {r['coupled_mean_accept']:.2f} |")
    if tree_rows:
        out += ["", f"## coupled_verify_tree (top-4 tree, N = {tree_rows[0]['N']}, V = {tree_rows[0]['V']})", "",
                "| B | reference us | kernel us | floor us (N rows once) | kernel / floor |", "|---|---|---|---|---|"]
        for r in tree_rows:
            out.append(f"| {r['B']} | {r['reference']['us']:.1f} | {r['kernel']['us']:.1f} | {r['floor_us']:.1f} | "
                       f"{r['kernel']['us'] / r['floor_us']:.2f} |")
    return "\n".join(out) + "\n"


def plot(race_rows, verify_rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vs = sorted({r["V"] for r in race_rows})
    fig, axes = plt.subplots(1, len(vs) + 1, figsize=(5 * (len(vs) + 1), 4.2))
    for ax, v in zip(axes, vs):
        rows = [r for r in race_rows if r["V"] == v]
        bs = [r["B"] for r in rows]
        for m in ("unseeded", "materialized", "reference", "kernel"):
            ax.plot(bs, [r[m]["us"] for r in rows], marker="o", label=m)
        ax.plot(bs, [r["floor_us"] for r in rows], "k--", label="HBM floor")
        ax.set(xscale="log", yscale="log", xlabel="batch B", ylabel="us (graph replay)", title=f"draft proposal, V={v}")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for k in sorted({r["K"] for r in verify_rows}):
        rows = [r for r in verify_rows if r["K"] == k]
        ax.plot([r["B"] for r in rows], [r["kernel"]["us"] for r in rows], marker="o", label=f"kernel K={k}")
        ax.plot([r["B"] for r in rows], [r["floor_us"] for r in rows], "--", label=f"floor K={k}")
        ax.plot([r["B"] for r in rows], [r["coupled_kernel"]["us"] for r in rows], marker="s",
                label=f"coupled kernel K={k}")
    ax.set(xscale="log", yscale="log", xlabel="batch B", ylabel="us", title="verify_chain / coupled")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks"))
    ap.add_argument("--quick", action="store_true", help="B in {1, 128}, V = 163840, verify K = 3 only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_draft_sampling: needs a CUDA GPU (the kernels are Triton on CUDA)", file=sys.stderr)
        return 2
    bs = [1, 128] if args.quick else [1, 8, 32, 128, 512]
    vs = [163840] if args.quick else [32000, 151936, 163840]
    bw = copy_bandwidth()
    meta = {"date": dt.date.today().isoformat(), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__, "copy_bw_tbs": bw / 1e12}
    print(f"torch {torch.__version__}, triton {triton.__version__}, {meta['device']}; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    race_rows = bench_race(bs, vs, bw)
    verify_rows = bench_verify(bs, [3] if args.quick else [1, 3, 7], 163840, bw)
    tree_rows = bench_tree(bs, 163840, bw)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "draft_sampling.json"), "w") as f:
        json.dump({"meta": meta, "race": race_rows, "verify": verify_rows, "tree": tree_rows}, f, indent=1)
    with open(os.path.join(args.out_dir, "draft_sampling.md"), "w") as f:
        f.write(markdown(meta, race_rows, verify_rows, tree_rows))
    plot(race_rows, verify_rows, os.path.join(args.out_dir, "draft_sampling.png"))
    print(f"wrote {args.out_dir}/draft_sampling.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
