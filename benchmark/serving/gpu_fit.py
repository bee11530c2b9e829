"""How many benchmark servers one GPU holds at once, from each server's weights and KV pool.

The serving benchmarks start several 8B-shape (or MoE-shape) servers side by
side on one GPU. What fits depends on the card: an H200 holds about 140 GiB,
an H100 about 80. A server started where the others leave too little memory
dies while loading, or SGLang shrinks its KV pool below ``--max-total-tokens``
and a cell then measures a queue instead of a batch. So the commands plan from
an estimate instead of from a fixed server count:

    server = weights (target, and the EAGLE draft where it drafts)
             + KV pool (pool tokens x bytes per token, target and draft layers)
             + OVERHEAD_GIB

Only estimates: each server's own log says what it got (``logged_pool_tokens``).
"""

from __future__ import annotations

import os
import re
import subprocess

from serving_models import ModelShape

GIB = 2 ** 30
# CUDA context, CUDA graphs, workspaces and run-time activations beyond weights and KV pools, per server.
# Bound from a committed run: four 8B-shape servers at 100,000 KV tokens (two with the EAGLE draft) shared one
# 140.4 GiB H200 (docs/benchmarks/attention_cost/2026-12-02-h200): 114.3 GiB of weights and pools by this
# module's arithmetic, so at most 6.5 GiB each.
OVERHEAD_GIB = 5.0
# KV slots a request holds beyond its prompt and output: a tree's draft tokens and a page of slack.
SLACK_TOKENS = 16
# SGLang's line for each KV pool it allocates; the target's comes first.
_POOL_LINE = re.compile(r"KV Cache is allocated\..*?#tokens: (\d+)")


def kv_tokens(concurrency: int, input_len: int, output_len: int) -> int:
    """KV-pool tokens ``concurrency`` requests hold at once: prompt, output and :data:`SLACK_TOKENS` each."""
    return concurrency * (input_len + output_len + SLACK_TOKENS)


def server_gib(shape: ModelShape, pool_tokens: int, speculative: bool) -> float:
    """Estimated GPU memory of one server, GiB: bf16 weights, the KV pool of ``pool_tokens`` tokens, the overhead.

    ``speculative``: the server also holds the EAGLE draft (its weights as
    loaded, ``ModelShape.draft_params``, and its one layer's KV pool).
    """
    weights = 2 * (shape.target_params() + (shape.draft_params() if speculative else 0))
    kv = pool_tokens * (shape.kv_bytes_per_token() + (shape.kv_bytes_per_token(1) if speculative else 0))
    return (weights + kv) / GIB + OVERHEAD_GIB


def pool_that_fits(shape: ModelShape, speculative: list[bool], total_gib: float) -> int:
    """The largest KV pool (tokens, a multiple of 1024) every one of these servers may take at once; 0 if none.

    ``speculative``: one entry per server on the GPU.
    """
    fixed = sum(server_gib(shape, 0, spec) for spec in speculative)
    per_token = sum(shape.kv_bytes_per_token() + (shape.kv_bytes_per_token(1) if spec else 0)
                    for spec in speculative) / GIB
    if not speculative or fixed >= total_gib:
        return 0
    return int((total_gib - fixed) / per_token) // 1024 * 1024


def gpu_memory_gib() -> float | None:
    """Free memory of the GPU the servers start on, GiB, as ``nvidia-smi`` reports it; None where unknown.

    That GPU is the first of ``CUDA_VISIBLE_DEVICES`` where it names one by
    index, else GPU 0. Free, not total: memory another process holds is not
    the servers' to plan with. None without ``nvidia-smi`` or that GPU.
    """
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(first) if first.isdigit() else 0
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout.splitlines()
        free = {int(i): float(m) for i, m in (line.split(",") for line in out if line.strip())}
        return free[index] / 1024  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None


def logged_pool_tokens(log_text: str) -> int | None:
    """The target's KV pool in tokens from a server's log (SGLang's first "KV Cache is allocated" line), or None."""
    found = _POOL_LINE.search(log_text)
    return int(found.group(1)) if found else None
