"""Launch tunables shared by every Triton kernel here, and the split planner.

Kernels read these module attributes at launch time (``triton_config.BLOCK``,
not a copied name), so ``benchmark/sweep_race_config.py`` can set them and
re-run. Changing them never changes a draw: the race compares per-element
scores and the split reduction breaks ties to the smaller index.
"""

from __future__ import annotations

import functools

import torch

BLOCK = 1024  # vocabulary columns per tile
NUM_WARPS = 4  # warps per program of every vocabulary-walking kernel
PROGRAMS_PER_SM = 4  # target programs per SM when splitting rows across programs
BIG = 2**31 - 1  # "no index" sentinel of the int32 argmax reductions


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def max_splits(vocab: int) -> int:
    """The most splits :func:`plan_splits` gives a row of ``vocab`` columns: one per tile."""
    return max(1, -(-vocab // BLOCK))


def split_lanes(vocab: int, per_split: int = 1) -> int:
    """Lanes of a kernel that reads ``per_split`` partials of every split at once: a power of two.

    Sized for :func:`max_splits`, not for the batch's own split count, so a
    kernel is compiled once per vocabulary instead of once per batch size
    (the batch's count is a run-time argument, masked).
    """
    return 1 << (max_splits(vocab) * per_split - 1).bit_length()


def plan_splits(rows: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """``(S, columns per split)`` for ``rows`` rows of ``vocab`` columns.

    About ``PROGRAMS_PER_SM`` programs per SM in total; each split is a whole
    number of ``BLOCK`` tiles, and the last split may be shorter.
    """
    blocks = -(-vocab // BLOCK)
    index = device.index if device.index is not None else torch.cuda.current_device()
    target = PROGRAMS_PER_SM * _sm_count(index)
    splits = max(1, min(blocks, -(-target // max(rows, 1))))
    per = -(-blocks // splits)
    return -(-blocks // per), per * BLOCK
