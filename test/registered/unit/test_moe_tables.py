"""SGLANG_DETSPEC_MOE_TABLES=checked: the table source against SGLang's own config lookup, the sizes checked, the
comparison, the tuned files SGLang ships, and the hook's fallbacks.

SGLang's ``try_get_optimal_moe_config`` (the function its fused-MoE forward asks for the up and the down
projection's config) runs for real with the plugin's :class:`TableSource` in place of ``get_moe_configs``; the
tuned files read are the ones in the installed wheel. The check's forwards need a CUDA GPU
(``test/registered/cuda/test_moe_tables_cuda.py``).
"""

import dataclasses
import importlib
import logging

import pytest
import torch
from sglang.srt.layers.moe.moe_runner import triton_utils
from sglang.srt.runtime_context import get_context, get_exec
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import config
from sglang_detspec.config import DEFAULT_MOE_TILE, MOE_TABLES_ENV, DetSpecConfig, env_settings
from sglang_detspec.sglang_plugin import moe_tables, moe_tile_hook, startup_notes

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

SGL = importlib.import_module(moe_tables.CONFIG_MODULE)
# Qwen3-30B-A3B's expert shapes on one GPU: w13 [E, 2 * 768, 2048], w2 [E, 2048, 768].
W13, W2, KEY = (128, 1536, 2048), (128, 2048, 768), (128, 768, None, 0, 0, False)
UP = {1: {"BLOCK_SIZE_M": 16, "n": 1}, 16: {"BLOCK_SIZE_M": 16, "n": 2}, 64: {"BLOCK_SIZE_M": 32, "n": 3},
      1024: {"BLOCK_SIZE_M": 64, "n": 4}, 4096: {"BLOCK_SIZE_M": 64, "n": 5}}
DOWN = {1: {"BLOCK_SIZE_M": 16, "d": 1}, 48: {"BLOCK_SIZE_M": 32, "d": 2}, 2048: {"BLOCK_SIZE_M": 64, "d": 3}}
TILE = dict(zip(config.MOE_TILE_FIELDS, DEFAULT_MOE_TILE))
ACTIVE = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, num_steps=3, num_draft_tokens=4,
                       attention_backend="fa3", model_family="moe", moe_tables="checked", source="server_args")


@pytest.fixture
def sglang_lookup(monkeypatch):
    """SGLang's get_moe_configs and override slot, restored after the test; the bag too; SGLang's runtime context
    published with its default server arguments (a server publishes its own)."""
    monkeypatch.setattr(SGL, "get_moe_configs", SGL.get_moe_configs)
    monkeypatch.setattr(triton_utils, "_config", None)
    with get_context().override_server_args():
        yield
    config.reset_config()


def sglang_pick(m):
    """What SGLang's own lookup gives a fused-MoE forward of ``m`` tokens: (up config, down config or None)."""
    up, (down, _) = SGL.try_get_optimal_moe_config(W13, W2, 8, None, m, return_down_config=True)
    return up, down


def test_nearest_is_sglangs_rule_through_its_own_lookup(sglang_lookup):
    source = moe_tables.TableSource(reference={1: TILE}, tables={(KEY, False): UP, (KEY, True): DOWN})
    SGL.get_moe_configs = source
    for m in (1, 2, 8, 9, 40, 41, 100, 544, 545, 2560, 2561, 8192):
        up, down = sglang_pick(m)
        # SGLang gives the down projection the up config's BLOCK_SIZE_M (one token sort serves both): a function
        # of the pair, so the runs of equal pairs stay the runs of equal configs.
        assert up == moe_tables.nearest(UP, m), m
        assert down == {**moe_tables.nearest(DOWN, m), "BLOCK_SIZE_M": up["BLOCK_SIZE_M"]}, m
    # A shape the source was not told about gets the reference at every size, its down projection the same.
    other = moe_tables.TableSource(reference={1: TILE})
    SGL.get_moe_configs = other
    for m in (1, 33, 4096):
        assert sglang_pick(m) == (TILE, None)
    # SGLang's own deterministic tile as the reference: SGLang's lookup falls back to its default config.
    SGL.get_moe_configs = moe_tables.TableSource(reference=None)
    with get_exec().deterministic.override(enable_deterministic_inference=True):
        assert sglang_pick(7)[0] == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def test_the_runs_cut_where_the_config_pair_changes_and_cover_every_size():
    runs = moe_tables.config_runs(UP, DOWN, 3000)
    assert runs[0][0] == 1 and runs[-1][1] == 4097  # one past the largest key
    assert all(a[1] + 1 == b[0] for a, b in zip(runs, runs[1:]))
    pair = lambda m: (id(moe_tables.nearest(UP, m)), id(moe_tables.nearest(DOWN, m)))  # noqa: E731
    for first, last in runs:
        assert len({pair(m) for m in range(first, last + 1)}) == 1
    assert all(pair(a[1]) != pair(b[0]) for a, b in zip(runs, runs[1:]))
    # Without a down table the up table alone cuts; the runs reach one past the largest key, whatever the
    # expected largest forward (a larger one keeps the last key's config, checked).
    assert moe_tables.config_runs(UP, None, 100) == [(1, 8), (9, 40), (41, 544), (545, 2560), (2561, 4097)]
    assert moe_tables.config_runs(UP, None, 8192)[-1] == (2561, 8192)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        moe_tables.config_runs(UP, None, 0)


def test_the_sizes_checked_are_each_runs_ends_an_odd_and_a_multiple_of_16_inside_and_sglangs_switch():
    runs = moe_tables.config_runs({1: {"a": 1}, 16: {"a": 2}, 64: {"a": 3}, 1024: {"a": 4}}, None, 2048)
    # Top-8: the early-launch flag turns at 512 rows: 64 tokens for the down projection, 512 for the up one.
    assert moe_tables.check_sizes(runs, 8) == [1, 3, 8, 9, 11, 16, 40, 41, 43, 48, 64, 65, 512, 513, 544, 545,
                                                547, 560, 2048]
    assert moe_tables.check_sizes([(1, 40)], 8) == [1, 3, 16, 40]  # the switch lies past these forwards
    assert moe_tables.check_sizes([(1, 300)], 2)[-3:] == [256, 257, 300]


def test_the_comparison_finds_one_flipped_bit_and_passes_equal_bytes():
    torch.manual_seed(0)
    rows = torch.randn(64, 32).to(torch.bfloat16)
    same = lambda m: rows[:m].clone()  # noqa: E731

    def one_bit_off(m):
        out = rows[:m].clone()
        out.view(torch.int16)[m - 1, 5] ^= 1
        return out
    assert moe_tables.first_mismatch(same, same, [1, 16, 64]) is None
    assert moe_tables.first_mismatch(same, one_bit_off, [1, 16, 64]) == "1 of 1 rows apart at 1 tokens"
    # Another accumulation of the same sum is apart somewhere: the check sees arithmetic, not only layout.
    big = torch.randn(64, 4096)
    in_fp32 = lambda m: big[:m].sum(-1, keepdim=True)  # noqa: E731
    in_fp64 = lambda m: big[:m].double().sum(-1, keepdim=True).float()  # noqa: E731
    assert moe_tables.first_mismatch(in_fp32, in_fp64, [64]).endswith("rows apart at 64 tokens")


def test_sglangs_own_reader_gives_the_tuned_tables_it_ships_whatever_the_mode(sglang_lookup, monkeypatch):
    # The tuned files are per GPU name; on this CPU-only machine SGLang's name lookup is told the H100's.
    monkeypatch.setattr(SGL, "get_device_name", lambda device_id=0: "NVIDIA H100 80GB HBM3")
    SGL.get_moe_configs.cache_clear()
    with get_exec().deterministic.override(enable_deterministic_inference=True):
        assert SGL.get_moe_configs(*KEY) is None  # SGLang in deterministic mode reads no table
        up, down = moe_tables.read_tuned(SGL.get_moe_configs, KEY)
        assert SGL.get_moe_configs(*KEY) is None  # the cache does not keep the other mode's answer
    assert up and all(isinstance(k, int) and "BLOCK_SIZE_M" in v for k, v in up.items())
    assert down is None or set(down) <= set(range(1, 1 << 20))
    # A shape with no file for this GPU: none.
    assert moe_tables.read_tuned(SGL.get_moe_configs, (3, 40, None, 0, 0, False)) == (None, None)


def test_installing_with_no_expert_layer_answers_the_tile_everywhere(sglang_lookup):
    own = SGL.get_moe_configs
    verdicts, seconds = moe_tables.install_checked_tables([torch.nn.Linear(4, 4)], TILE, 8192)
    assert verdicts == {} and seconds >= 0
    assert isinstance(SGL.get_moe_configs, moe_tables.TableSource) and SGL.get_moe_configs.original is own
    assert sglang_pick(300) == (TILE, None)
    # A second install in the same process reads with SGLang's own function, and keeps it as the original.
    moe_tables.install_checked_tables([], None, 8192)
    assert SGL.get_moe_configs.original is own
    assert moe_tables.restore_sglang_lookup() is own and SGL.get_moe_configs is own


def test_the_shape_key_is_what_sglangs_forward_asks_for():
    layer = type("Layer", (), {"w2_weight": torch.empty(128, 2048, 768, dtype=torch.bfloat16)})()
    assert moe_tables.shape_key(layer) == KEY


def test_the_setting_reads_off_or_checked_and_names_itself_when_bad():
    assert env_settings({})["moe_tables"] == "off"
    assert env_settings({MOE_TABLES_ENV: " Checked "})["moe_tables"] == "checked"
    with pytest.raises(ValueError, match=r"SGLANG_DETSPEC_MOE_TABLES must be one of off or checked, got 'on'"):
        env_settings({MOE_TABLES_ENV: "on"})
    assert "moe_tables='checked'" in ACTIVE.describe()
    assert "moe_tables" not in dataclasses.replace(ACTIVE, moe_tables="off").describe()


@pytest.mark.parametrize("family, words", [
    ("moe", "SGLANG_DETSPEC_MOE_TABLES=checked: at start-up SGLang's tuned fused-MoE tables are checked on this "
            "GPU, per expert shape, against the tile 32,64,128,1,4,3"),
    ("mla+moe", "against the tile 32,64,128,1,4,3"),
    ("dense", "SGLANG_DETSPEC_MOE_TABLES=checked changes nothing here: this target has no expert layers"),
    ("moe+fp8", "changes nothing here: its weights are quantized (moe+fp8)"),
])
def test_the_start_up_note_says_what_the_tables_setting_does_here(family, words):
    note = startup_notes.moe_tables_note(dataclasses.replace(ACTIVE, model_family=family))
    assert words in note
    assert startup_notes.moe_tables_note(dataclasses.replace(ACTIVE, model_family=family, moe_tables="off")) is None
    assert "SGLang's deterministic tile" in startup_notes.moe_tables_note(
        dataclasses.replace(ACTIVE, model_family="moe", moe_tile=None))


def test_without_a_gpu_the_hook_keeps_the_tile_and_says_why(sglang_lookup, caplog):
    if torch.cuda.is_available():
        pytest.skip("the check runs on a CUDA GPU here: test/registered/cuda/test_moe_tables_cuda.py")
    config.install_config(ACTIVE)
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        moe_tile_hook.pin_moe_tile(None)
    assert "SGLANG_DETSPEC_MOE_TABLES=checked not applied: no CUDA device" in caplog.text
    assert triton_utils._config == TILE and not isinstance(SGL.get_moe_configs, moe_tables.TableSource)


def test_the_check_on_a_scheduler_logs_each_verdict_and_restores_sglang_when_it_fails(sglang_lookup, caplog):
    """check_tables, the part of the hook after the GPU guard: with SGLang's runtime context published and a
    scheduler whose model has no expert layer it installs the source and says so; where reading the scheduler
    raises, SGLang's own lookup is back and the caller is told to set the tile."""
    own = SGL.get_moe_configs
    runner = type("Runner", (), {"model": torch.nn.Linear(4, 4), "max_running_requests": 8})()
    scheduler = type("Scheduler", (), {"tp_worker": type("Worker", (), {"model_runner": runner})(),
                                       "draft_worker": None})()
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        assert moe_tile_hook.check_tables(scheduler, TILE, ACTIVE) is True
    assert "SGLANG_DETSPEC_MOE_TABLES=checked: no bf16 / fp16 fused-MoE layer found; the tile serves" in caplog.text
    assert isinstance(SGL.get_moe_configs, moe_tables.TableSource)
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        assert moe_tile_hook.check_tables(object(), TILE, ACTIVE) is False
    assert "the start-up check of SGLang's tuned fused-MoE tables failed (AttributeError" in caplog.text
    assert SGL.get_moe_configs is own
    # A later start with the setting off puts SGLang's lookup back too.
    SGL.get_moe_configs = moe_tables.TableSource(reference={1: TILE}, original=own)
    config.install_config(dataclasses.replace(ACTIVE, moe_tables="off"))
    moe_tile_hook.pin_moe_tile(None)
    assert SGL.get_moe_configs is own and triton_utils._config == TILE


@pytest.mark.parametrize("family, words", [
    ("dense", "SGLANG_DETSPEC_MOE_TABLES=checked not applied: this target has no expert layers"),
    ("moe+fp8", "SGLANG_DETSPEC_MOE_TABLES=checked not applied: its weights are quantized (moe+fp8)"),
    (None, "SGLANG_DETSPEC_MOE_TABLES=checked not applied: the target's family could not be read"),
])
def test_the_hook_says_where_the_tables_setting_does_not_apply(sglang_lookup, caplog, family, words):
    config.install_config(dataclasses.replace(ACTIVE, model_family=family, moe_tile=None))
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        moe_tile_hook.pin_moe_tile(None)
    assert words in caplog.text
    assert triton_utils._config is None and not isinstance(SGL.get_moe_configs, moe_tables.TableSource)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
