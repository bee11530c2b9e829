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
import sys

import torch

from ..config import MOE_TABLES_ENV, MOE_TILE_ENV, MOE_TILE_FIELDS, MOE_TILE_SMEM_RULE, current_config, moe_tile_smem
from .moe_tables import TARGET as TABLES  # replaced with SGLANG_DETSPEC_MOE_TABLES=checked (moe_tables.TableSource)
from .moe_tables import install_checked_tables, restore_sglang_lookup
from .forward_sizes import models_of, scheduler_max_rows

TARGET = "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs"
OVERRIDE = "sglang.srt.layers.moe.moe_runner.triton_utils._config"
logger = logging.getLogger("sglang_detspec")


def moe_tile_config(tile: tuple[int, ...]) -> dict[str, int]:
    """The fused-MoE config dict SGLang's kernel takes for ``tile`` (the bag's ``moe_tile``, in MOE_TILE_FIELDS order)."""
    return dict(zip(MOE_TILE_FIELDS, tile))


def gpu_smem_per_block() -> int | None:
    """Bytes of shared memory one program may take on the current CUDA GPU (its opt-in bound), None without one."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "shared_memory_per_block_optin", None) or None


def tile_too_large(tile: tuple[int, ...], room: int | None) -> str | None:
    """Why ``tile`` cannot run on a GPU whose programs may take ``room`` bytes of shared memory, or None (also
    where ``room`` is unknown: the setting's own bound, the largest GPU's, then holds)."""
    need = moe_tile_smem(tile)
    if room is None or need <= room:
        return None
    return (f"its pipeline takes {need} bytes of shared memory ({MOE_TILE_SMEM_RULE}), more than the {room} a "
            "program may take on this GPU")


def pin_moe_tile(*args, **kwargs) -> None:
    """BEFORE hook of ``Scheduler.init_all_cuda_graphs``: set the bag's fused-MoE tile as SGLang's override, or,
    with ``SGLANG_DETSPEC_MOE_TABLES=checked``, put SGLang's tuned tables behind a start-up check in place of its
    ``get_moe_configs``.

    Does nothing unless the bag is active and deterministic, ``moe_tile`` is
    not ``sglang`` (None) or ``moe_tables`` is ``checked``, and the target
    takes a tile (``takes_moe_tile``: expert layers, no quantized weights,
    SGLang's Triton MoE runner, and SGLang's own ``model_config`` on the
    scheduler, ``args[0]``, reads no quantization either); logs why where the bag's ``moe_tile_skip``
    names a reason for a tile the user set (quantized weights), where SGLang
    reads a quantization the family label missed, or where the family is
    unknown. With ``moe_tables`` ``checked`` SGLang's tuned tables serve
    each expert shape the start-up check admits
    (:func:`sglang_plugin.moe_tables.install_checked_tables`), the tile the others.
    A tile whose pipeline needs more shared memory than this GPU gives a
    program (:func:`tile_too_large`) is not set: SGLang's tile serves, with a warning.
    Returns None.
    """
    bag = current_config()
    _forget_earlier_start()
    if not (bag.active and bag.deterministic and (bag.moe_tile is not None or bag.moe_tables == "checked")):
        return None
    tile = ",".join(map(str, bag.moe_tile)) if bag.moe_tile is not None else "sglang"
    settings = " and ".join(([f"the fused-MoE tile {tile}"] if bag.moe_tile is not None else [])
                            + ([f"{MOE_TABLES_ENV}=checked"] if bag.moe_tables == "checked" else []))
    if bag.model_family is None:
        # A setting the user made warrants a warning; the default tile, on a target most likely dense, a line.
        log = logger.warning if (bag.moe_tile_chosen or bag.moe_tables == "checked") else logger.info
        log("sglang-detspec: %s not applied: the target's family could not be read from its config; SGLang's "
            "tile serves any expert layers", settings)
        return None
    if not bag.takes_moe_tile:
        serves = "that path's own kernels serve" if bag.moe_path_flag else "SGLang's deterministic tile serves"
        if bag.moe_tile_skip:
            logger.warning("sglang-detspec: %s=%s not applied: %s; %s", MOE_TILE_ENV, tile, bag.moe_tile_skip, serves)
        if bag.moe_tables == "checked":
            logger.warning("sglang-detspec: %s=checked not applied: %s; %s", MOE_TABLES_ENV, bag.moe_tables_skip,
                           serves)
        return None
    # SGLang's own reading of the checkpoint's quantization (its flag, config.json or a file beside it), in case
    # the family label missed a layout: a quantized kernel needs K tiles that divide its blocks.
    quantized = getattr(getattr(args[0] if args else None, "model_config", None), "quantization", None)
    if quantized:
        logger.warning("sglang-detspec: %s not applied: SGLang reads the target's weights as quantized (%s); "
                       "SGLang's tile serves", settings, quantized)
        return None
    from sglang.srt.layers.moe.moe_runner import triton_utils

    config = moe_tile_config(bag.moe_tile) if bag.moe_tile is not None else None
    why = tables_unavailable(args[0] if args else None) if bag.moe_tables == "checked" else None
    too_large = tile_too_large(bag.moe_tile, gpu_smem_per_block()) if config is not None else None
    if too_large:
        # Triton would refuse the kernel inside the CUDA-graph capture; SGLang's tile fits every GPU it serves.
        checked = bag.moe_tables == "checked" and why is None
        logger.warning("sglang-detspec: the fused-MoE tile %s not applied, whatever the start-up note above says: %s; "
                       "SGLang's deterministic tile takes its place%s (%s names a smaller one)", tile, too_large,
                       " and is what SGLang's tuned tables are checked against" if checked else "", MOE_TILE_ENV)
        config = None
    if bag.moe_tables == "checked":
        if why:
            logger.warning("sglang-detspec: %s=checked not applied: %s", MOE_TABLES_ENV, why)
        elif check_tables(args[0], config, bag):
            triton_utils._config = None  # the override would answer before the tables
            return None
    if config is None:  # 'sglang', the tables not checked: SGLang's own deterministic tile serves
        return None
    # What SGLang's override_config context sets; held for the process's life, not one block.
    triton_utils._config = config
    _pinned[:] = [config]
    logger.info("sglang-detspec: the fused-MoE Triton kernel runs the tile %s at every batch size (in place of "
                "SGLang's deterministic tile)", config)
    return None


# The override this process's last start set (so a later start can take back its own and nothing else).
_pinned: list = []


def _forget_earlier_start() -> None:
    """Take back what an earlier start in this process put into SGLang (its override, its table source), where
    SGLang's MoE modules are imported at all."""
    utils = sys.modules.get(OVERRIDE.rsplit(".", 1)[0])
    if utils is not None and _pinned and getattr(utils, "_config", None) is _pinned[0]:
        utils._config = None
    _pinned.clear()
    restore_sglang_lookup(imported_only=True)


def tables_unavailable(scheduler) -> str | None:
    """Why ``SGLANG_DETSPEC_MOE_TABLES=checked`` cannot run in this process (no CUDA device, no scheduler), or
    None. Another MoE runner or an all-to-all backend is the bag's rule (``takes_moe_tile``), met before."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    return "no scheduler to read the models from" if scheduler is None else None


def check_tables(scheduler, tile: dict | None, bag) -> bool:
    """``SGLANG_DETSPEC_MOE_TABLES=checked``: SGLang's ``get_moe_configs`` answers its tuned tables for each
    expert shape the start-up check admits (``moe_tables.install_checked_tables``), the tile (or SGLang's,
    ``tile`` None) for the others; each shape's verdict logged.

    Returns True once the check ran; False where it raised: SGLang's own lookup is back in place and the caller
    sets the tile as without the setting (speed only)."""
    try:
        most, _ = scheduler_max_rows(scheduler, bag.num_draft_tokens or 1)
        verdicts, seconds = install_checked_tables(models_of(scheduler), tile, most)
    except Exception as exc:
        restore_sglang_lookup()
        logger.warning("sglang-detspec: %s=checked: the start-up check of SGLang's tuned fused-MoE tables failed "
                       "(%s: %s); the tile serves", MOE_TABLES_ENV, type(exc).__name__, exc)
        return False
    # The tile the tables were checked against (None: SGLang's, also where the bag's was too large for this GPU).
    reference = ",".join(str(tile[f]) for f in MOE_TILE_FIELDS) if tile else "SGLang's deterministic tile"
    for key, verdict in verdicts.items():
        served = "SGLang's tuned tables serve" if verdict.startswith("tuned") else f"the tile {reference} serves"
        logger.info("sglang-detspec: fused-MoE expert shape E=%s N=%s (forwards of up to %s tokens expected): %s: "
                    "%s (start-up check of their rows against the tile's, %.1f s in all)", key[0], key[1], most,
                    served, verdict, seconds)
    if not verdicts:
        logger.info("sglang-detspec: %s=checked: no bf16 / fp16 fused-MoE layer found; the tile serves",
                    MOE_TABLES_ENV)
    return True
