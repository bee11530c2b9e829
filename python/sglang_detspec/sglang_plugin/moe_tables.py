"""SGLang's tuned fused-MoE tables, admitted per expert shape by a start-up check of their bits.

Without deterministic inference SGLang's fused-MoE Triton kernel takes a
tile per batch size from its tuned tables (``get_moe_configs``: a JSON file
per expert count, intermediate size, dtype and GPU, ``{M: config}``, the
nearest key's config serving a batch of M tokens; a second file may tune
the down projection, TMA included). Under ``--enable-deterministic-inference``
it reads none and runs one tile at every M, which keeps a token's row
independent of its batch. The tables are faster at prefill sizes: on one
H100 at a Qwen3-30B-A3B-like expert shape the plugin's default tile took
1.7x / 2.8x their time at 2,048 / 8,192-token calls, and every config the
probe tried, the tables' included, gave the same bits
(``docs/benchmarks/moe_tile_probe/2026-12-07-h100``). Same bits as a
batch-invariant tile at every batch size make a table batch-invariant too;
that is what this module checks, on the server's GPU and expert shapes,
before it lets a table serve.

:class:`TableSource` takes the place of SGLang's ``get_moe_configs`` (the
module function ``try_get_optimal_moe_config`` asks for the up and the down
projection's table) and answers per expert shape: the tuned tables where
:func:`admit_tables` found them giving the reference's bits, else the
reference (the plugin's tile as a one-entry table, the same config at every
M, or None where SGLang's own deterministic tile serves). The check, per
distinct expert shape among the models' fused-MoE layers: the batch sizes
where the pair (up config, down config) the tables give changes
(:func:`config_runs`), each run's two ends and a multiple of 16 inside it
and an odd one inside it, and the sizes where the kernel's early-launch flag
turns (:func:`check_sizes`), up to the largest forward the server makes or
one past the tables' largest key; at each size the same random
tokens, routed top-k at random, through SGLang's own ``fused_experts`` with
the layer's own weights, once with each answer; every output byte equal, or
the shape keeps the reference.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping

import torch

logger = logging.getLogger("sglang_detspec")

CONFIG_MODULE = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"
TARGET = f"{CONFIG_MODULE}.get_moe_configs"
SEED = 0
# Rows of a projection's input at which SGLang's fused-MoE kernel turns its early-launch flag (GDC_EARLY: at most
# this many): the up projection's are the tokens, the down projection's tokens x top-k.
EARLY_LAUNCH_ROWS = 512

# get_moe_configs's arguments without down_moe: (E, N, dtype, block_n, block_k, per_channel_quant).
ShapeKey = tuple


def nearest(table: Mapping[int, dict], m: int) -> dict:
    """The config SGLang's ``try_get_optimal_moe_config`` takes from ``table`` for a batch of ``m`` tokens: the
    key nearest ``m``, the first such key in the table's order on a tie."""
    return table[min(table, key=lambda key: abs(key - m))]


def config_runs(up: Mapping[int, dict], down: Mapping[int, dict] | None, max_tokens: int) -> list[tuple[int, int]]:
    """The batch sizes cut where the (up, down) config pair SGLang takes from the tables changes.

    They run from 1 to ``max_tokens`` or one past the tables' largest key, whichever is larger: past that key
    the pair no longer changes, so a forward larger than ``max_tokens`` (a first request above the prefill
    bound, tokens gathered from other ranks) still runs a checked config.

    Args:
        up: the up projection's table ``{M: config}`` (non-empty).
        down: the down projection's table, or None (the down projection then takes the up config).
        max_tokens: the largest batch size a forward is expected to have, >= 1.

    Returns:
        ``[(first, last), ...]``, inclusive, ascending, covering every size up to the last run's end.

    Raises:
        ValueError: ``max_tokens`` below 1 or ``up`` empty.
    """
    if max_tokens < 1 or not up:
        raise ValueError(f"max_tokens must be >= 1 and up non-empty, got {max_tokens} and {len(up)} entries")
    end = max(max_tokens, max(up) + 1, max(down) + 1 if down else 0)
    runs, start, last = [], 1, None
    for m in range(1, end + 1):
        pair = (id(nearest(up, m)), id(nearest(down, m)) if down else None)
        if last is not None and pair != last:
            runs.append((start, m - 1))
            start = m
        last = pair
    runs.append((start, end))
    return runs


def check_sizes(runs: list[tuple[int, int]], top_k: int) -> list[int]:
    """The batch sizes checked for ``runs`` (:func:`config_runs`): each run's ends and, inside it, a multiple of
    16 and an odd size (Triton specialises a kernel on integer arguments divisible by 16: the padded row count
    and tokens x ``top_k``), and the sizes either side of where the early-launch flag turns: at
    :data:`EARLY_LAUNCH_ROWS` tokens for the up projection, :data:`EARLY_LAUNCH_ROWS` / ``top_k`` for the down
    one (sorted, distinct, within the runs)."""
    down = EARLY_LAUNCH_ROWS // max(top_k, 1)
    sizes = {m for m in (down, down + 1, EARLY_LAUNCH_ROWS, EARLY_LAUNCH_ROWS + 1) if m <= runs[-1][1]}
    for first, last in runs:
        sizes.update((first, last))
        for inner in ((first // 16 + 1) * 16, first + 1 if first % 2 == 0 else first + 2):
            if first < inner < last:
                sizes.add(inner)
    return sorted(sizes)


def first_mismatch(reference: Callable[[int], torch.Tensor], candidate: Callable[[int], torch.Tensor],
                   sizes: Iterable[int]) -> str | None:
    """None when ``candidate(m)`` has the bytes of ``reference(m)`` at every size, else where it first did not.

    Args:
        reference, candidate: ``m -> output [m, hidden]`` for the same ``m`` tokens (any dtype, equal shapes).
        sizes: the batch sizes to try, in order.
    """
    for m in sizes:
        ref, out = reference(m), candidate(m)
        if ref.shape != out.shape or not torch.equal(ref.view(torch.uint8), out.view(torch.uint8)):
            rows = ((ref.view(torch.uint8) != out.view(torch.uint8)).flatten(1).any(-1).sum().item()
                    if ref.shape == out.shape else "all")
            return f"{rows} of {m} rows apart at {m} tokens"
    return None


@dataclasses.dataclass
class TableSource:
    """What ``get_moe_configs`` answers once installed: per expert shape and projection, a table or None.

    ``reference`` answers every shape not in ``tables`` (and the down projection of those in it without a
    down table): ``{1: tile}`` for a plugin tile, None for SGLang's own deterministic tile.
    """

    reference: dict | None
    tables: dict = dataclasses.field(default_factory=dict)  # (ShapeKey, down_moe) -> table or None
    original: Callable | None = None  # SGLang's own get_moe_configs, which this one replaced

    def __call__(self, E, N, dtype, block_n=0, block_k=0, per_channel_quant=False, down_moe=False):
        key = ((E, N, dtype, block_n, block_k, per_channel_quant), down_moe)
        if key in self.tables:
            return self.tables[key]
        return None if down_moe else self.reference


def read_tuned(original, key: ShapeKey) -> tuple[dict | None, dict | None]:
    """SGLang's tuned (up, down) tables for ``key``, read by its own ``get_moe_configs`` (``original``, still the
    module's function: a missing down file falls back to the up table through it) with deterministic inference
    off for the call; (None, None) where it has none for this GPU. Its cache is cleared after: the answer
    depends on the mode."""
    from sglang.srt.runtime_context import get_exec

    try:
        with get_exec().deterministic.override(enable_deterministic_inference=False):
            up = original(*key, down_moe=False)
            down = original(*key, down_moe=True) if up else None
    finally:
        getattr(original, "cache_clear", lambda: None)()
    return (dict(up) if up else None), (dict(down) if down else None)


def shape_key(layer) -> ShapeKey:
    """The ``get_moe_configs`` key SGLang's fused-MoE forward asks for this unquantized layer: (E, N, None, 0, 0,
    False) with E and N from its ``w2_weight`` [E, hidden, N]."""
    e, _, n = layer.w2_weight.shape
    return (e, n, None, 0, 0, False)


def expert_layers(models: Iterable[torch.nn.Module]) -> dict:
    """One fused-MoE layer per distinct expert shape in ``models`` ({ShapeKey: layer}), first met first: layers
    with bf16 / fp16 expert weights (a quantized draft's are another kernel's)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    layers = {}
    for model in models:
        for module in model.modules():
            weight = getattr(module, "w2_weight", None)
            if isinstance(module, FusedMoE) and weight is not None and weight.dtype in (torch.bfloat16,
                                                                                          torch.float16):
                layers.setdefault(shape_key(module), module)
    return layers


def layer_runner(layer, m_max: int) -> Callable[[int], torch.Tensor]:
    """``m -> output [m, hidden]`` of SGLang's ``fused_experts`` over the first ``m`` of ``m_max`` fixed random
    tokens (bf16 in the layer's dtype, unit normal; top-k experts of a random softmax, renormalised) with the
    layer's own weights, biases, runner config and gate / up layout (as SGLang's unquantized method passes
    them to its Triton runner)."""
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    w13, w2, cfg = layer.w13_weight, layer.w2_weight, layer.moe_runner_config
    extra = dict(b1=getattr(layer, "w13_weight_bias", None), b2=getattr(layer, "w2_weight_bias", None),
                 fuse_swiglu_interleaved=bool(getattr(getattr(layer, "quant_method", None),
                                                      "w13_swiglu_interleaved", False)))
    g = torch.Generator(device=w13.device).manual_seed(SEED)
    x = torch.randn(m_max, w13.shape[-1], generator=g, device=w13.device).to(w13.dtype)
    weights, ids = torch.rand(m_max, w13.shape[0], generator=g, device=w13.device).softmax(-1).topk(cfg.top_k, -1)
    weights, ids = weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)

    def run(m: int) -> torch.Tensor:
        hidden = x[:m].clone()  # the runner's config may write its output in place
        return fused_experts(hidden, w13, w2, StandardTopKOutput(weights[:m].contiguous(), ids[:m].contiguous(),
                                                                 None), cfg, **extra).clone()
    return run


def admit_tables(source: TableSource, tuned: Mapping, layers: Mapping, max_tokens: int) -> dict:
    """Check each expert shape's tuned tables against ``source.reference``; keep those that pass in ``source``.

    ``source`` must be SGLang's ``get_moe_configs`` while this runs (the forwards it makes ask it).

    Args:
        source: the installed :class:`TableSource`; its ``tables`` gain every checked shape's answer.
        tuned: ``{ShapeKey: (up, down)}`` as :func:`read_tuned` gives them.
        layers: ``{ShapeKey: fused-MoE layer}`` (:func:`expert_layers`).
        max_tokens: the largest batch size a forward of this server has.

    Returns:
        ``{ShapeKey: verdict}``: ``"tuned"`` (admitted), or why not (no tuned table for this GPU, or the first
        difference found).
    """
    verdicts = {}
    for key, layer in layers.items():
        up, down = tuned.get(key, (None, None))
        if up is None:
            verdicts[key] = "no tuned table for this GPU"
            continue
        sizes = check_sizes(config_runs(up, down, max_tokens), layer.moe_runner_config.top_k)
        run = layer_runner(layer, sizes[-1])

        def answered(tables, run=run):
            def go(m):
                source.tables.update(tables)
                return run(m)
            return go
        reference = {(key, False): source.reference, (key, True): None}
        candidate = {(key, False): up, (key, True): down}
        mismatch = first_mismatch(answered(reference), answered(candidate), sizes)
        source.tables.update(reference if mismatch else candidate)
        verdicts[key] = f"{mismatch} (checked {len(sizes)} sizes)" if mismatch else f"tuned ({len(sizes)} sizes)"
    return verdicts


def install_checked_tables(models: Iterable[torch.nn.Module], tile: dict | None,
                           max_tokens: int) -> tuple[dict, float]:
    """Put a :class:`TableSource` in place of SGLang's ``get_moe_configs`` and admit the tuned tables that pass.

    Args:
        models: the target model and any draft model (their fused-MoE layers give the shapes).
        tile: the reference config (the plugin's tile), or None for SGLang's deterministic tile.
        max_tokens: the largest batch size a forward of this server has.

    Returns:
        (``{ShapeKey: verdict}`` as :func:`admit_tables`, the check's seconds).
    """
    original = restore_sglang_lookup()
    module = importlib.import_module(CONFIG_MODULE)
    layers = expert_layers(models)
    tuned = {key: read_tuned(original, key) for key in layers}  # SGLang's own lookup in place while it reads
    source = TableSource(reference={1: dict(tile)} if tile else None, original=original)
    module.get_moe_configs = source
    start = time.perf_counter()
    try:
        verdicts = admit_tables(source, tuned, layers, max_tokens)
    finally:
        if torch.cuda.is_available():  # the check's activations go back before the CUDA-graph capture
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return verdicts, round(time.perf_counter() - start, 1)


def restore_sglang_lookup(imported_only: bool = False):
    """Put SGLang's own ``get_moe_configs`` back where a :class:`TableSource` replaced it (an earlier start in
    this process); returns it. ``imported_only``: do nothing (None) where SGLang's module is not imported yet,
    so no source can be in place (a dense or inactive server need not import the Triton MoE code)."""
    module = sys.modules.get(CONFIG_MODULE) if imported_only else importlib.import_module(CONFIG_MODULE)
    if module is None:
        return None
    if isinstance(module.get_moe_configs, TableSource):
        module.get_moe_configs = module.get_moe_configs.original
    return module.get_moe_configs
