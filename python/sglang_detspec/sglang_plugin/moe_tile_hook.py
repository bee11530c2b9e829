"""Start-up: a mixture-of-experts target's fused-MoE Triton kernel runs one tile at every batch size.

Under ``--enable-deterministic-inference`` SGLang 0.5.23 gives its fused-MoE
Triton kernel one fixed tile for every batch size (``get_default_config`` in
``moe_runner/triton_utils/fused_moe_triton_config.py``: 64 x 64 x 32, and
``get_moe_configs`` returns no tuned table): a token's output row then does
not depend on the batch around it, since the kernel neither splits K nor
mixes rows in a tile, and the K loop's order is the tile's alone. Any other
fixed tile is meant to keep that property by the same argument (the
compiled kernel variant still changes with the batch: SGLang's ``GDC_EARLY``
flag flips at 512 rows, and Triton specialises on row counts divisible by
16, which ``benchmark/moe_tile_probe.py`` crosses while it checks each tile's
rows bit for bit). SGLang's tile is not the fast one at decode and
verify sizes, where its own tuned tables take 16-row tiles with 128-256-wide
K tiles (a Qwen3-30B-A3B-like target served the plugin's chain at 0.79 of
SGLang's non-deterministic chain at 8-128 requests on one H100,
``docs/benchmarks/determinism_tax/2026-12-07-h100-moe-a3b``; with the tile
that is the default since, 0.91-0.98 at 1-128 requests,
``docs/benchmarks/determinism_tax/2026-12-07-h100-moe-tile``).

``SGLANG_DETSPEC_MOE_TILE`` (the bag's ``moe_tile``) names a tile, by
default ``config.DEFAULT_MOE_TILE`` (``sglang`` keeps SGLang's); this hook
sets it as SGLang's fused-MoE config override (the module-level value that
``triton_utils.override_config`` sets and ``try_get_optimal_moe_config``
reads first, for the up and the down projection, at every batch size). Only
where the run is the plugin's (:attr:`DetSpecConfig.active`), deterministic,
and the target is a mixture-of-experts model without quantized weights (a
block-quantized FP8 kernel needs K tiles that divide its quantization
blocks: SGLang's own choice stays there; the override is process-wide, so a
quantized MoE draft of an unquantized target would get the tile too, which
no supported draft is). Which tile is fastest while every
row stays bit-identical across batch sizes is measured by
``benchmark/moe_tile_probe.py`` (on one H100 at a Qwen3-30B-A3B-like expert
shape every tile it tried, SGLang's deterministic one and its tuned tables
included, gave the same bits; elsewhere a tile may change a token's bits
against another, alike on every server that runs it: the plugin's servers,
the one without speculative decoding a speculative one is compared with
included, run the default unless told otherwise).

Registered BEFORE ``Scheduler.init_all_cuda_graphs``: the CUDA-graph capture
and every forward after it read the override.
"""

from __future__ import annotations

import logging

from ..config import MOE_TILE_ENV, MOE_TILE_FIELDS, current_config

TARGET = "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs"
OVERRIDE = "sglang.srt.layers.moe.moe_runner.triton_utils._config"
logger = logging.getLogger("sglang_detspec")


def moe_tile_config(tile: tuple[int, ...]) -> dict[str, int]:
    """The fused-MoE config dict SGLang's kernel takes for ``tile`` (the bag's ``moe_tile``, in MOE_TILE_FIELDS order)."""
    return dict(zip(MOE_TILE_FIELDS, tile))


def pin_moe_tile(*args, **kwargs) -> None:
    """BEFORE hook of ``Scheduler.init_all_cuda_graphs``: set the bag's fused-MoE tile as SGLang's override.

    Does nothing unless the bag is active and deterministic, ``moe_tile`` is
    not ``sglang`` (None) and the target takes a tile (``takes_moe_tile``:
    expert layers, no quantized weights, and SGLang's own ``model_config``
    on the scheduler, ``args[0]``, reads no quantization either); logs why
    where the bag's ``moe_tile_skip`` names a reason for a tile the user set
    (quantized weights), where SGLang reads a quantization the family label
    missed, or where the family is unknown. Returns None.
    """
    bag = current_config()
    if not (bag.active and bag.deterministic and bag.moe_tile is not None):
        return None
    if bag.model_family is None:
        # A tile the user set warrants a warning; the default one, on a target that is most likely dense, a line.
        log = logger.warning if bag.moe_tile_chosen else logger.info
        log("sglang-detspec: the fused-MoE tile %s not applied: the target's family could not be read from its "
            "config; SGLang's tile serves any expert layers", ",".join(map(str, bag.moe_tile)))
        return None
    if not bag.takes_moe_tile:
        if bag.moe_tile_skip:
            logger.warning("sglang-detspec: %s=%s not applied: %s; SGLang's deterministic tile serves", MOE_TILE_ENV,
                           ",".join(map(str, bag.moe_tile)), bag.moe_tile_skip)
        return None
    # SGLang's own reading of the checkpoint's quantization (its flag, config.json or a file beside it), in case
    # the family label missed a layout: a quantized kernel needs K tiles that divide its blocks.
    quantized = getattr(getattr(args[0] if args else None, "model_config", None), "quantization", None)
    if quantized:
        logger.warning("sglang-detspec: the fused-MoE tile %s not applied: SGLang reads the target's weights as "
                       "quantized (%s); SGLang's tile serves", ",".join(map(str, bag.moe_tile)), quantized)
        return None
    from sglang.srt.layers.moe.moe_runner import triton_utils

    config = moe_tile_config(bag.moe_tile)
    # What SGLang's override_config context sets; held for the process's life, not one block.
    triton_utils._config = config
    logger.info("sglang-detspec: the fused-MoE Triton kernel runs the tile %s at every batch size (in place of "
                "SGLang's deterministic tile)", config)
    return None
