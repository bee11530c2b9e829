"""The DeepGEMM warm-up's row counts, row bound and weight shapes (CPU; the compile check is test_gemm_warmup_cuda).

The oracle for the row counts is everything DeepGEMM's SM90 heuristic reads
of M, in the release SGLang 0.5.23 installs and in the earlier one: the
block-M candidates (16 / 32 added for M <= 16 / 32), the block counts
ceil(M / b) for each candidate b, the earlier release's tie rule "no block
larger than M" (M >= 64, 128, 256) and its multicast from M >= 512. Two row
counts with the same value of every one of those reach the same
configuration for a given (N, K), so the warm-up must hold one row count of
each value that occurs up to its bound.
"""

import math
import sys

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.sglang_plugin import forward_sizes
from sglang_detspec.sglang_plugin import gemm_warmup_hook as g

register_cpu_ci(est_time=15, suite="detspec-unit-cpu")


def heuristic_inputs(m: int) -> tuple:
    """Everything DeepGEMM's SM90 configuration choice reads of M."""
    blocks = (16,) * (m <= 16) + (32,) * (m <= 32) + (64, 128, 256)  # the candidates at this M
    return (blocks, tuple(math.ceil(m / b) for b in blocks), tuple(m >= b for b in (64, 128, 256)), m >= 512)


@pytest.mark.parametrize("max_rows", [1, 2, 31, 63, 64, 65, 127, 128, 129, 511, 512, 513, 1100, 4096, 8192, 8193])
def test_the_rows_reach_every_configuration_up_to_the_bound(max_rows):
    rows = g.warm_rows(max_rows)
    assert rows == sorted(set(rows)) and rows[0] == 1 and rows[-1] == max_rows
    warmed = {heuristic_inputs(m) for m in rows}
    missed = [m for m in range(1, max_rows + 1) if heuristic_inputs(m) not in warmed]
    assert not missed, missed[:10]
    assert len(rows) <= g.ROW_CLASS + 2 * math.ceil(max_rows / g.ROW_CLASS) + 1


def test_the_oracle_can_fail():
    """Row counts at one end of each interval only would miss the threshold rows (M = 64 j): the check sees it."""
    rows = [m for m in g.warm_rows(1100) if m <= g.ROW_CLASS or m % g.ROW_CLASS == 1]
    warmed = {heuristic_inputs(m) for m in rows}
    assert heuristic_inputs(512) not in warmed


def test_a_bad_bound_is_named():
    with pytest.raises(ValueError, match="max_rows must be >= 1, got 0"):
        g.warm_rows(0)


@pytest.mark.parametrize("chunk, prefill, running, tokens, mixed, expected", [
    (8192, 16384, 128, 4, False, 8192),       # the chunk bounds a prefill batch
    (-1, 16384, 128, 4, False, 16384),        # chunking off: max_prefill_tokens does
    (None, 16384, None, 1, False, 16384),
    (256, 16384, 128, 8, False, 1024),        # a tree verify of 128 requests outgrows a small chunk
    (8192, 16384, 128, 4, True, 8192 + 512),  # a mixed chunk carries a decode batch too
])
def test_the_row_bound(chunk, prefill, running, tokens, mixed, expected):
    assert forward_sizes.max_rows_for(chunk, prefill, running, tokens, mixed) == expected


def _module(cls, n: int, k: int, dtype=torch.bfloat16):
    """An SGLang layer object (its __init__ needs a tensor-parallel group) carrying an [n, k] weight."""
    module = object.__new__(cls)
    torch.nn.Module.__init__(module)
    module.weight = torch.nn.Parameter(torch.zeros(n, k, dtype=dtype), requires_grad=False)
    return module


def test_the_weights_are_sglang_linear_layers_and_lm_heads_one_per_shape():
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    target = torch.nn.ModuleList([
        _module(QKVParallelLinear, 96, 64), _module(RowParallelLinear, 64, 64),
        _module(QKVParallelLinear, 96, 64),                     # same shape: one entry
        _module(MergedColumnParallelLinear, 256, 64),
        _module(RowParallelLinear, 64, 128, dtype=torch.float32),  # not bf16: not DeepGEMM's
        _module(RowParallelLinear, 8, 64),                       # N < 16: SGLang multiplies it elsewhere
        _module(RowParallelLinear, 64, 60),                      # K rows of 120 bytes: not 16-byte aligned
        _module(VocabParallelEmbedding, 1000, 64),               # looked up, not multiplied
        _module(ParallelLMHead, 1024, 64),
    ])
    draft = torch.nn.ModuleList([_module(RowParallelLinear, 64, 128), _module(ParallelLMHead, 1024, 64),
                                 torch.nn.Linear(128, 32, bias=True, dtype=torch.bfloat16)])  # EAGLE's fc
    draft.lm_head = _module(VocabParallelEmbedding, 512, 64)  # a head tied to the embedding table
    weights = g.gemm_weights([target, draft])
    assert list(weights) == [(32, 128), (64, 64), (64, 128), (96, 64), (256, 64), (512, 64), (1024, 64)]
    assert all(tuple(w.shape) == key for key, w in weights.items())


def test_the_models_are_the_target_and_the_draft_of_sglang_workers():
    """The attributes read are SGLang 0.5.23's: Scheduler.tp_worker.model_runner, EAGLEWorkerV2._draft_worker.draft_runner."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    target, draft = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    scheduler = object.__new__(Scheduler)
    scheduler.tp_worker = type("TpWorker", (), {})()
    scheduler.tp_worker.model_runner = object.__new__(ModelRunner)
    scheduler.tp_worker.model_runner.model = target
    scheduler.draft_worker = None
    assert forward_sizes.models_of(scheduler) == [target]
    scheduler.draft_worker = object.__new__(EAGLEWorkerV2)
    scheduler.draft_worker._draft_worker = object.__new__(EagleDraftWorker)
    scheduler.draft_worker._draft_worker.draft_runner = object.__new__(ModelRunner)
    scheduler.draft_worker._draft_worker.draft_runner.model = draft
    assert forward_sizes.models_of(scheduler) == [target, draft]


def test_the_schedule_fields_read_are_sglangs():
    """compile_gemms reads these from SGLang's published schedule (a typo would only log a failed warm-up)."""
    from sglang.srt.arg_groups.fields.schedule import Schedule

    fields = set(Schedule.__struct_fields__)
    assert {"chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "enable_mixed_chunk"} <= fields


def test_the_warm_up_launches_each_row_count_and_leaves_what_does_not_fit_to_first_use():
    weights = {(64, 16): torch.zeros(64, 16, dtype=torch.bfloat16), (32, 16): torch.zeros(32, 16, dtype=torch.bfloat16)}
    launched, reached, notes = g.warm_gemms(weights, list(range(1, 11)), max_tensor_bytes=64 * 2 * 5)
    assert launched == 5 + 10 and reached == 10  # [M, 64] outputs: 5 rows fit; [M, 32] outputs and [M, 16] inputs: 10
    assert notes == ["N=64 K=16: rows above 5 compile at first use"]
    assert g.warm_gemms({}, [1, 2, 3]) == (0, 3, [])


def test_the_warm_up_stops_at_its_deadline_small_rows_first():
    weights = {(32, 16): torch.zeros(32, 16, dtype=torch.bfloat16)}
    launched, reached, notes = g.warm_gemms(weights, [1, 2, 3], deadline=0.0)  # long past
    assert (launched, reached) == (0, 0)
    assert notes == ["the time budget ran out after 0 of 3 row counts: the other row counts compile at first use"]
    launched, reached, notes = g.warm_gemms(weights, [1, 2, 3], deadline=float("inf"))
    assert (launched, reached, notes) == (3, 3, [])


def test_the_order_puts_decode_rows_first_then_the_prefill_range_coarse_to_fine():
    rows = g.warm_rows(8192)
    order = g.warm_order(rows, 512)
    assert sorted(order) == rows and len(set(order)) == len(order)  # a permutation
    decode = [r for r in rows if r <= 512]
    assert order[:len(decode)] == decode  # every decode / verify batch first, ascending
    rest = order[len(decode):]
    assert rest[0] == 8192  # the chunk itself first
    # Any prefix samples the range: after a quarter of the rest, no gap wider than a quarter of it.
    quarter = sorted(rest[:len(rest) // 4]) + [8192]
    span = 8192 - 512
    assert max(b - a for a, b in zip([512] + quarter, quarter)) <= span // 4 + 64
    assert g.warm_order([5, 1, 3], 0) == [5, 3, 1]  # the largest, then index 2 (a power of two), then index 1
    assert g.warm_order([1, 2, 3], 10) == [1, 2, 3]  # all decode rows: ascending


def test_under_captured_decode_graphs_the_prefill_range_comes_first():
    rows = g.warm_rows(8192)
    eager, captured = g.warm_order(rows, 512), g.warm_order(rows, 512, captured=True)
    decode = [r for r in rows if r <= 512]
    assert sorted(captured) == rows and captured[-len(decode):] == decode  # the capture compiles these anyway
    assert captured[:len(rows) - len(decode)] == eager[len(decode):]  # the prefill range in the same order
    assert g.warm_order([1, 2, 3], 10, captured=True) == [1, 2, 3]


def test_the_captured_decode_batch_sizes_are_read_from_sglangs_config(monkeypatch):
    import types

    from sglang.srt import runtime_context
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig

    def published(config):
        monkeypatch.setattr(runtime_context, "get_exec",
                            lambda: types.SimpleNamespace(graph=types.SimpleNamespace(cuda_graph_config=config)))

    config = CudaGraphConfig()
    config.decode.bs = [1, 2, 4, 8]
    published(config)
    assert g._captured_decode_bs() == [1, 2, 4, 8]
    config.decode.backend = Backend.DISABLED
    assert g._captured_decode_bs() == []
    config.decode.backend, config.decode.bs = Backend.FULL, []
    assert g._captured_decode_bs() == []
    monkeypatch.setattr(runtime_context, "get_exec", lambda: (_ for _ in ()).throw(ValueError("not published")))
    assert g._captured_decode_bs() == []


@pytest.mark.parametrize("running, graph_bs, tokens, expected", [
    (4096, 48, 4, 192),   # SGLang's default running bound: the CUDA-graph bound decides
    (32, 48, 8, 256),     # a smaller running bound decides
    (32, None, 4, 128),   # graphs off: the running bound
    (None, 48, 1, 48),
    (None, None, 4, 0),   # nothing known: no decode rows first
])
def test_the_rows_taken_first_are_the_largest_graph_or_running_batch(running, graph_bs, tokens, expected):
    assert g.first_rows(running, graph_bs, tokens) == expected


def test_with_sglangs_default_running_bound_the_prefill_range_is_still_coarse_to_fine():
    rows = g.warm_rows(8192)
    order = g.warm_order(rows, g.first_rows(4096, 512, 4))  # 512 captured batches x 4 rows: 2,048
    assert order != sorted(rows) and order[sum(r <= 2048 for r in rows)] == 8192


def test_coverage_is_the_contiguous_prefix_of_the_rows_warmed():
    rows = [1, 2, 3, 64, 65, 128]
    assert g.covered_up_to(rows, {1, 2, 3, 128}) == 3
    assert g.covered_up_to(rows, set(rows)) == 128
    assert g.covered_up_to(rows, {2, 3}) == 0


def test_the_budget_setting_is_checked_and_named():
    from sglang_detspec.config import DEFAULT_GEMM_WARMUP_S, GEMM_WARMUP_ENV, env_settings

    assert env_settings({})["gemm_warmup_s"] == DEFAULT_GEMM_WARMUP_S
    assert env_settings({GEMM_WARMUP_ENV: "0"})["gemm_warmup_s"] == 0.0
    assert env_settings({GEMM_WARMUP_ENV: " 300 "})["gemm_warmup_s"] == 300.0
    for bad in ("-1", "abc", "nan", "1e9"):
        with pytest.raises(ValueError, match=rf"{GEMM_WARMUP_ENV} must be a number of seconds in \[0, 3600\]"):
            env_settings({GEMM_WARMUP_ENV: bad})


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
