"""What a scheduler's forwards can hold: its models and the most rows one forward multiplies.

Read at start-up by the hooks that prepare kernels before serving (the
DeepGEMM matmul warm-up, the fused-MoE tables' check): one rule for both.
"""

from __future__ import annotations


def max_rows_for(chunked_prefill_size: int | None, max_prefill_tokens: int, max_running_requests: int | None,
                 tokens_per_request: int, mixed_chunk: bool) -> int:
    """The most rows one matmul of this server multiplies: a prefill batch's tokens or a decode step's.

    Args:
        chunked_prefill_size: SGLang's chunk (tokens per prefill batch); None or < 1 when chunking is off,
            then ``max_prefill_tokens`` bounds a prefill batch.
        max_prefill_tokens: SGLang's ``max_prefill_tokens`` (>= 1).
        max_running_requests: the decode batch bound (None: unknown, taken as 0).
        tokens_per_request: rows per request in a decode or verify step (draft tokens; 1 without
            speculative decoding).
        mixed_chunk: ``--enable-mixed-chunk`` (a prefill chunk and a decode batch in one forward).
    """
    prefill = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else max_prefill_tokens
    decode = (max_running_requests or 0) * max(tokens_per_request, 1)
    return max(prefill + (decode if mixed_chunk else 0), decode, 1)



def models_of(scheduler) -> list:
    """The target model of a scheduler and, where it has one, its draft model (SGLang's EAGLE workers)."""
    models = [scheduler.tp_worker.model_runner.model]
    worker = getattr(scheduler, "draft_worker", None)
    for path in (("_draft_worker", "draft_runner"), ("draft_runner",), ("model_runner",)):
        runner = worker
        for name in path:
            runner = getattr(runner, name, None)
        if getattr(runner, "model", None) is not None and runner.model is not models[0]:
            return models + [runner.model]
    return models


def scheduler_max_rows(scheduler, tokens_per_request: int) -> tuple[int, int | None]:
    """(:func:`max_rows_for` this scheduler's limits, its decode batch bound): SGLang's schedule settings, the
    bound the model runner resolved (the schedule's is the command line's, often None) before the schedule's."""
    from sglang.srt.runtime_context import get_schedule

    schedule = get_schedule()
    running = getattr(scheduler.tp_worker.model_runner, "max_running_requests", None)
    running = running or schedule.max_running_requests
    return (max_rows_for(schedule.chunked_prefill_size, schedule.max_prefill_tokens, running, tokens_per_request,
                         bool(schedule.enable_mixed_chunk)), running)
