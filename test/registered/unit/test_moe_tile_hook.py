"""SGLANG_DETSPEC_MOE_TILE: the setting's checks and the hook's effect on SGLang's real fused-MoE config lookup.

The hook sets SGLang's fused-MoE override slot; SGLang's own
``try_get_optimal_moe_config`` (the function its fused-MoE forward asks, for
the up and the down projection) must then return that tile at every batch
size, and the slot must stay untouched where the hook does not apply.
"""

import dataclasses
import logging

import pytest
from sglang.srt.layers.moe.moe_runner import triton_utils
from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import try_get_optimal_moe_config
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import config
from sglang_detspec.config import DEFAULT_MOE_TILE, MOE_TILE_ENV, DetSpecConfig, env_settings
from sglang_detspec.sglang_plugin import moe_tile_hook

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

TILE = (16, 128, 128, 1, 4, 3)
ACTIVE = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, num_steps=3, num_draft_tokens=4,
                       attention_backend="fa3", model_family="moe", moe_tile=TILE, source="server_args")
# Qwen3-30B-A3B's expert shapes: w13 [E, 2 * 768, 2048], w2 [E, 2048, 768].
W13, W2 = (128, 1536, 2048), (128, 2048, 768)


@pytest.fixture
def slot(monkeypatch):
    """SGLang's override slot, restored after the test; the bag restored too."""
    monkeypatch.setattr(triton_utils, "_config", None)
    yield
    config.reset_config()


@pytest.mark.parametrize("raw, tile", [("", DEFAULT_MOE_TILE), ("sglang", None), (" SGLang ", None),
                                       ("16,128,128,1,4,3", TILE), ("64, 64, 32, 8, 4, 2", (64, 64, 32, 8, 4, 2)),
                                       ("128,256,64,1,8,4", (128, 256, 64, 1, 8, 4))])  # SGLang's own largest H100 tile
def test_the_setting_reads_a_tile_or_sglangs(raw, tile):
    assert env_settings({MOE_TILE_ENV: raw})["moe_tile"] == tile


@pytest.mark.parametrize("raw, words", [
    ("16,128,128,1,4", "six integers BLOCK_SIZE_M,BLOCK_SIZE_N,BLOCK_SIZE_K,GROUP_SIZE_M,num_warps,num_stages"),
    ("16,128,100,1,4,3", "BLOCK_SIZE_K must be one of 16, 32, 64, 128 or 256, got 100"),
    ("8,128,128,1,4,3", "BLOCK_SIZE_M must be one of"),
    ("16,128,128,0,4,3", "GROUP_SIZE_M must be in [1, 64], got 0"),
    ("16,128,128,1,3,3", "num_warps must be one of 1, 2, 4, 8 or 16, got 3"),
    ("16,128,128,1,4,9", "num_stages must be in [1, 8], got 9"),
    ("16,128,-128,1,4,3", "six integers"),
    ("auto", "must be 'sglang' or six integers"),
    ("16,128,12\u00b2,1,4,3", "six integers"),  # a superscript digit is not a number here
    ("64,128,256,1,8,3", "must be at most 232448 (227 KiB of shared memory), got 294912"),
])
def test_a_bad_tile_names_the_setting_the_field_and_the_bound(raw, words):
    with pytest.raises(ValueError) as info:
        env_settings({MOE_TILE_ENV: raw})
    assert MOE_TILE_ENV in str(info.value) and words in str(info.value)


@pytest.mark.parametrize("family, tile, words", [
    ("dense", TILE, "SGLANG_DETSPEC_MOE_TILE changes nothing here: this target has no expert layers"),
    ("dense", None, None),
    (None, TILE, None),  # family unknown: nothing said
    ("moe+fp8", TILE, "changes nothing here: its weights are quantized (moe+fp8)"),
    ("moe", None, "SGLANG_DETSPEC_MOE_TILE=sglang: the expert layers run SGLang's deterministic fused-MoE tile (64 "
                  "x 64 x 32 at every batch size): on a Qwen3-30B-A3B"),
    ("mla+moe", TILE, "the expert layers run the fused-MoE tile 16,128,128,1,4,3 (BLOCK_SIZE_M"),
    # The default says nothing where it changes nothing, and says that it is the default where it serves.
    ("dense", DEFAULT_MOE_TILE, None),
    ("moe+fp8", DEFAULT_MOE_TILE, "the expert layers keep SGLang's deterministic fused-MoE tile: the weights are "
                                  "quantized (moe+fp8)"),
    ("moe+fp8", None, "the expert layers keep SGLang's deterministic fused-MoE tile"),
    ("moe", DEFAULT_MOE_TILE, "the expert layers run the fused-MoE tile 32,64,128,1,4,3 (BLOCK_SIZE_M, BLOCK_SIZE_N, "
                              "BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages) at every batch size on SGLang's "
                              "Triton MoE runner (the plugin's default; SGLANG_DETSPEC_MOE_TILE=sglang keeps"),
])
def test_the_start_up_notes_say_what_the_tile_setting_does_here(family, tile, words):
    from sglang_detspec.sglang_plugin.startup_notes import moe_tile_note, setting_notes

    bag = dataclasses.replace(ACTIVE, model_family=family, moe_tile=tile)
    note = moe_tile_note(bag)
    assert (note is None) if words is None else (words in note), note
    assert (note in setting_notes(bag)) if note else not any("fused-MoE" in n for n in setting_notes(bag))


def test_the_start_up_line_shows_the_tile_where_it_serves_or_was_set():
    assert "moe_tile=(16, 128, 128, 1, 4, 3)" in ACTIVE.describe()
    # An MoE target shows which tile serves it, SGLang's (None) included.
    assert "moe_tile=None" in dataclasses.replace(ACTIVE, moe_tile=None).describe()
    assert "moe_tile=(32, 64, 128, 1, 4, 3)" in dataclasses.replace(ACTIVE, moe_tile=DEFAULT_MOE_TILE).describe()
    # A target that takes no tile shows a tile only where one was set.
    dense = dataclasses.replace(ACTIVE, model_family="dense")
    assert "moe_tile" not in dataclasses.replace(dense, moe_tile=DEFAULT_MOE_TILE).describe()
    assert "moe_tile" not in dataclasses.replace(dense, moe_tile=None).describe()
    assert "moe_tile=(16, 128, 128, 1, 4, 3)" in dense.describe()


def test_the_default_tile_serves_an_unquantized_moe_target_at_every_batch_size(slot):
    assert DetSpecConfig().moe_tile == DEFAULT_MOE_TILE
    config.install_config(dataclasses.replace(ACTIVE, moe_tile=DEFAULT_MOE_TILE))
    moe_tile_hook.pin_moe_tile(object())
    want = dict(zip(config.MOE_TILE_FIELDS, DEFAULT_MOE_TILE))
    for m in (1, 33, 512, 8192):
        assert try_get_optimal_moe_config(W13, W2, 8, None, m) == want, m


def test_a_quantization_sglang_reads_keeps_sglangs_tile(slot, caplog):
    # The scheduler's ModelConfig (the hook's first argument) reads a quantization the family label missed.
    import types

    config.install_config(dataclasses.replace(ACTIVE, moe_tile=DEFAULT_MOE_TILE))
    scheduler = types.SimpleNamespace(model_config=types.SimpleNamespace(quantization="modelopt_fp8"))
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        moe_tile_hook.pin_moe_tile(scheduler)
    assert triton_utils.get_config() is None
    assert "SGLang reads the target's weights as quantized (modelopt_fp8)" in caplog.text
    # Unquantized there too: the tile serves.
    moe_tile_hook.pin_moe_tile(types.SimpleNamespace(model_config=types.SimpleNamespace(quantization=None)))
    assert triton_utils.get_config() == dict(zip(config.MOE_TILE_FIELDS, DEFAULT_MOE_TILE))


def test_a_tile_this_gpu_cannot_hold_is_not_set(slot, caplog, monkeypatch):
    # One of SGLang's tuned H100 tiles, 196,608 bytes by the estimate: an A100 gives a program 166,912, an L4
    # 101,376.
    big = (128, 256, 64, 1, 8, 4)
    assert config.moe_tile_smem(big) == 196_608 and config.moe_tile_problem(big) is None
    assert moe_tile_hook.tile_too_large(big, 232_448) is None and moe_tile_hook.tile_too_large(big, None) is None
    assert moe_tile_hook.tile_too_large(DEFAULT_MOE_TILE, 101_376) is None
    config.install_config(dataclasses.replace(ACTIVE, moe_tile=big))
    monkeypatch.setattr(moe_tile_hook, "gpu_smem_per_block", lambda: 166_912)
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        moe_tile_hook.pin_moe_tile(object())
    assert triton_utils.get_config() is None
    assert ("the fused-MoE tile 128,256,64,1,8,4 not applied, whatever the start-up note above says: its pipeline "
            "takes 196608 bytes of shared memory" in caplog.text
            and "more than the 166912 a program may take on this GPU" in caplog.text)
    assert "checked against" not in caplog.text
    # With the tables asked for but no CUDA device to check them on, the warning names no check.
    caplog.clear()
    config.install_config(dataclasses.replace(ACTIVE, moe_tile=big, moe_tables="checked"))
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        moe_tile_hook.pin_moe_tile(object())
    assert triton_utils.get_config() is None and "takes its place (" in caplog.text
    assert "checked against" not in caplog.text and "MOE_TABLES=checked not applied: no CUDA device" in caplog.text
    config.install_config(dataclasses.replace(ACTIVE, moe_tile=big))
    monkeypatch.setattr(moe_tile_hook, "gpu_smem_per_block", lambda: 232_448)  # an H100's
    moe_tile_hook.pin_moe_tile(object())
    assert triton_utils.get_config() == dict(zip(config.MOE_TILE_FIELDS, big))


@pytest.mark.parametrize("family, level", [("moe+fp8", None), ("dense", None), (None, logging.INFO)])
def test_the_default_tile_stays_quiet_where_it_does_not_apply(slot, caplog, family, level):
    config.install_config(dataclasses.replace(ACTIVE, moe_tile=DEFAULT_MOE_TILE, model_family=family))
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        moe_tile_hook.pin_moe_tile(object())
    assert triton_utils.get_config() is None
    assert [r.levelno for r in caplog.records] == ([] if level is None else [level]), caplog.text


def test_sglangs_lookup_returns_the_tile_at_every_batch_size(slot):
    config.install_config(ACTIVE)
    moe_tile_hook.pin_moe_tile(object())
    want = dict(zip(config.MOE_TILE_FIELDS, TILE))
    for m in (1, 4, 17, 128, 512, 8192):
        up, (down, _) = try_get_optimal_moe_config(W13, W2, 8, None, m, return_down_config=True)
        assert up == want and down is None, m  # SGLang's forward runs `down_config or config`


@pytest.mark.parametrize("change, logged", [
    ({"moe_tile": None}, False),
    ({"deterministic": False}, False),
    ({"model_family": None}, False),  # unknown: a warning of its own
    ({"model_family": "dense"}, False),
    ({"model_family": "moe+fp8"}, True),  # block-quantized kernels need K tiles dividing the blocks
    ({"disabled": True}, False),
])
def test_the_slot_stays_sglangs_where_the_hook_does_not_apply(slot, caplog, change, logged):
    config.install_config(dataclasses.replace(ACTIVE, **change))
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        moe_tile_hook.pin_moe_tile(object())
    assert triton_utils.get_config() is None
    assert ("SGLANG_DETSPEC_MOE_TILE=16,128,128,1,4,3 not applied: its weights are quantized" in caplog.text) is logged


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
