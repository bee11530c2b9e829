"""The start-up warm-up of SGLang's KV move (sglang_plugin.kv_move_warmup): which moves compile every variant.

Oracles: Triton's own specialisation of an integer argument (its native
``specialize_impl``), SGLang's own chunking (``MHATokenToKVPool._move_kv_cache_impl``
on a real pool, its GPU launch recorded), and brute force over batch sizes.
"""

import sys
import types

import pytest
import torch
from sglang.srt.utils import next_power_of_2
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import DetSpecConfig
from sglang_detspec.sglang_plugin import kv_move_warmup, warmup_hook
from sglang_detspec.sglang_plugin.kv_move_warmup import copy_bound, count_variant, move_lengths, move_segments

register_cpu_ci(est_time=15, suite="detspec-unit-cpu")


def triton_variant(n: int):
    """Triton's specialisation key of an int kernel argument (what selects a compiled variant)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return native_specialize_impl(BaseBackend, n, False, True, True)


def test_the_count_variants_are_tritons():
    keys = {}
    for n in [*range(1, 1100), 2**20 + 16, 2**20 + 17]:
        keys.setdefault(count_variant(n), set()).add(triton_variant(n))
    # One Triton key per variant of ours, and no key shared by two of ours.
    assert all(len(v) == 1 for v in keys.values()), keys
    assert len({next(iter(v)) for v in keys.values()}) == len(keys) == 3


@pytest.fixture
def recorded_pool(monkeypatch):
    """A real SGLang MHA pool on the CPU whose tiled-copy launches are recorded (they need a GPU)."""
    from sglang.srt.mem_cache import memory_pool

    pool = memory_pool.MHATokenToKVPool(size=64, page_size=1, dtype=torch.bfloat16, head_num=2, head_dim=64,
                                        layer_num=1, device="cpu", enable_memory_saver=False)
    calls = []
    monkeypatch.setattr(memory_pool, "copy_all_layer_kv_cache_func",
                        lambda ptrs, strides, tgt, src, n, upper, cfg: calls.append((n, upper)))
    return pool, calls


@pytest.mark.parametrize("bound", [128, 256])
def test_the_segments_are_sglangs_launches(recorded_pool, bound):
    pool, calls = recorded_pool
    pool._kv_copy_config = {"num_locs_upper": bound, "bytes_per_tile": 128, "byte_tiles": 2, "num_warps": 4}
    assert not pool.use_native_move_kv_cache and not pool.use_hnd
    assert copy_bound(pool) == bound
    for n in [1, 2, 3, 15, 16, 17, bound - 1, bound, bound + 1, 2 * bound, 2 * bound + 12, 5 * bound + 3, 1000]:
        calls.clear()
        loc = torch.zeros(n, dtype=torch.int64)
        pool._move_kv_cache_impl(loc, loc)
        assert calls == [(s, next_power_of_2(s)) for s in move_segments(n, bound)], n


def test_a_pool_without_the_tiled_copy_is_not_warmed(recorded_pool):
    pool, calls = recorded_pool
    assert pool._kv_copy_config is None and copy_bound(pool) is None  # built without enable_kv_cache_copy
    assert kv_move_warmup.warm_kv_move(pool, 4, 128, torch.device("cpu")) == 0 and calls == []
    pool._kv_copy_config = {"num_locs_upper": 256}
    pool.use_native_move_kv_cache = True
    assert copy_bound(pool) is None


def brute_force_keys(width: int, batches: range, bound: int) -> set:
    return {(next_power_of_2(s), count_variant(s)) for b in batches for s in move_segments(width * b, bound)}


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("bound", [128, 256])
@pytest.mark.parametrize("max_batch", [1, 3, 16, 48, 128, 4096])
def test_the_lengths_compile_every_variant_serving_launches_once(width, bound, max_batch):
    lengths = move_lengths(width, max_batch, bound)
    assert lengths == sorted(lengths) and all(1 <= n <= bound for n in lengths)
    keys = [(next_power_of_2(n), count_variant(n)) for n in lengths]
    assert len(set(keys)) == len(keys)  # one move per variant
    # Every variant a batch of up to max_batch launches (past 2 x bound: the same ones), and no other.
    assert set(keys) == brute_force_keys(width, range(1, min(max_batch, 6 * bound) + 1), bound)
    # Each is the least move of its variant that a batch launches.
    reached = {s for b in range(1, min(max_batch, 2 * bound) + 1) for s in move_segments(width * b, bound)}
    for n, key in zip(lengths, keys):
        assert n in reached and not any((next_power_of_2(s), count_variant(s)) == key for s in reached if s < n)


def test_the_eight_b_tree_shape():
    """Steps 3 (4 slots per request), the 8B shape's bound (256: 2,048-byte KV rows), up to 128 requests:
    a batch's move length crosses 4, 8, 16, 32, 64, 128 and 256, and from 16 on both count variants occur."""
    lengths = move_lengths(4, 128, 256)
    assert {next_power_of_2(n) for n in lengths} == {4, 8, 16, 32, 64, 128, 256}
    assert len(lengths) == 12
    # A switching tree with bound 16 verifies trees of up to 16 requests: moves of up to 64 slots.
    assert max(move_lengths(4, 16, 256)) <= 64 and len(move_lengths(4, 16, 256)) == 8


@pytest.mark.parametrize("args, bad", [((0, 4, 256), "accept_width"), ((4, 0, 256), "max_batch"),
                                       ((4, 4, 0), "bound"), ((4, 4, 96), "power of two")])
def test_bad_arguments_are_named(args, bad):
    with pytest.raises(ValueError, match=bad):
        move_lengths(*args)


def bag(**kw):
    return DetSpecConfig(deterministic=True, **kw)


@pytest.mark.parametrize("kw, moves", [
    ({}, False),
    ({"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}, False),
    ({"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}, True),
    ({"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8}, True),
    ({"algorithm": "NGRAM", "num_draft_tokens": 8}, True),
    ({"algorithm": "EAGLE", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8, "multi_layer_eagle": True},
     False),
])
def test_which_servers_move_accepted_kv(kw, moves):
    assert kv_move_warmup.moves_accepted_kv(bag(**kw)) is moves


def scheduler_with(pool, max_running_requests: int):
    """The attribute path ``warm_sglang_kv_move`` reads from SGLang's scheduler, holding a real pool."""
    allocator = types.SimpleNamespace(get_kvcache=lambda: pool)
    runner = types.SimpleNamespace(token_to_kv_pool_allocator=allocator, max_running_requests=max_running_requests)
    return types.SimpleNamespace(tp_worker=types.SimpleNamespace(model_runner=runner), server_args=None)


def test_the_start_up_warms_the_pools_move_once_per_variant(recorded_pool):
    pool, calls = recorded_pool
    tree = bag(algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8)
    width = warmup_hook.plan_for(tree, 1000).accept_width
    line = warmup_hook.warm_sglang_kv_move(scheduler_with(pool, 48), tree, width, torch.device("cpu"))
    assert "not warmed" in line and "MHATokenToKVPool" in line and calls == []  # no tiled copy configured
    pool._kv_copy_config = {"num_locs_upper": 256, "bytes_per_tile": 128, "byte_tiles": 2, "num_warps": 4}
    line = warmup_hook.warm_sglang_kv_move(scheduler_with(pool, 48), tree, width, torch.device("cpu"))
    lengths = move_lengths(4, 48, 256)
    assert calls == [(n, next_power_of_2(n)) for n in lengths]
    assert f"verify batches up to 48 (4 slots per request) in {len(lengths)} launches" in line
    calls.clear()
    assert "accept width is not known" in warmup_hook.warm_sglang_kv_move(scheduler_with(pool, 48), tree, 0,
                                                                            torch.device("cpu"))
    assert calls == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
