"""The chain draft-step hook around SGLang's own top-1 kernel, eager and under CUDA-graph capture.

``topk_draft_hook.coupled_chain_step`` wraps SGLang's ``draft_topk1_postprocess``
(a Triton kernel: argmax, advance the positions, write the draft column) for
coupled chains whose sampled-draft path is off, e.g. an EAGLE3 draft over a
reduced vocabulary. Oracle: the op layer's race over q spread onto target
ids (``exponential_race`` on ``Stream.TARGET``) at the published positions;
greedy rows keep SGLang's argmax.
"""

import pytest
import torch

from _register import register_cuda_ci

register_cuda_ci(est_time=30, suite="detspec-kernels-cuda")

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (SGLang's draft top-1 kernel is Triton)", allow_module_level=True)
topk1 = pytest.importorskip("sglang.kernels.ops.speculative.topk1", reason="needs SGLang's draft top-1 kernel")

from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402

from sglang_detspec.ops import Stream, exponential_race  # noqa: E402
from sglang_detspec.sglang_plugin import positions as sites  # noqa: E402
from sglang_detspec.sglang_plugin import topk_draft_hook  # noqa: E402

DEV = "cuda"
V, V_DRAFT, B = 4096, 3072, 8


def case(seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    hot = torch.randperm(V, generator=gen, device=DEV)[:V_DRAFT]
    logits = torch.randn(B, V_DRAFT, generator=gen, device=DEV) * 3
    seeds = torch.randint(-(1 << 62), 1 << 62, (B,), generator=gen, device=DEV)
    pos = torch.randint(0, 1 << 20, (B,), generator=gen, device=DEV)
    top_ks = torch.tensor([V_DRAFT] * (B - 2) + [1, 1], dtype=torch.int32, device=DEV)  # two greedy rows
    info = SamplingBatchInfo(
        temperatures=torch.ones(B, 1, device=DEV), top_ps=torch.ones(B, device=DEV), top_ks=top_ks,
        min_ps=torch.zeros(B, device=DEV), is_all_greedy=False, is_any_greedy=True, need_top_p_sampling=False,
        need_top_k_sampling=False, need_min_p_sampling=False, vocab_size=V_DRAFT, sampling_seed=seeds, device=DEV,
    )
    return hot, logits, seeds, pos, info


def expected(hot, logits, seeds, drafted_at):
    spread = torch.zeros(B, V, device=DEV).index_copy_(1, hot, torch.softmax(logits.float(), dim=-1))
    race = exponential_race(spread, seeds, drafted_at, stream=Stream.TARGET, kernel="triton")[:, 0]
    columns = torch.full((V,), -1, dtype=torch.int64, device=DEV)
    columns[hot] = torch.arange(V_DRAFT, device=DEV)
    want = columns[race]
    want[-2:] = logits[-2:].argmax(dim=-1)  # greedy rows: SGLang's argmax
    return want


def step(hot, logits, pos, info, draft_tokens):
    site = sites.DraftSite(1, lambda: sites.draft_forward_positions(pos), hot, V, info)
    with sites.draft_site(site):
        return topk_draft_hook.coupled_chain_step(topk1.draft_topk1_postprocess, logits, pos, draft_tokens, 1)


def test_chain_step_races_on_target_ids_and_keeps_sglangs_contract(monkeypatch):
    monkeypatch.setattr(topk_draft_hook, "current_config", lambda: type("Bag", (), {"kernel": "triton"})())
    hot, logits, seeds, pos, info = case()
    drafted_at = sites.draft_forward_positions(pos).clone()
    before = pos.clone()
    draft_tokens = torch.zeros(B, 3, dtype=torch.int64, device=DEV)
    topk_p, topk_index = step(hot, logits, pos, info, draft_tokens)
    want = expected(hot, logits, seeds, drafted_at)
    assert torch.equal(topk_index.view(-1), want)
    assert torch.equal(draft_tokens[:, 1], want) and not draft_tokens[:, [0, 2]].any()
    assert torch.equal(pos, before + 1)  # SGLang's kernel advanced the positions once
    assert torch.equal(topk_p, torch.ones(B, 1, device=DEV))


def test_chain_step_replays_in_a_cuda_graph(monkeypatch):
    monkeypatch.setattr(topk_draft_hook, "current_config", lambda: type("Bag", (), {"kernel": "triton"})())
    hot, logits, seeds, pos, info = case(1)
    draft_tokens = torch.zeros(B, 3, dtype=torch.int64, device=DEV)
    step(hot, logits, pos.clone(), info, draft_tokens.clone())  # warm-up: compile outside capture
    torch.cuda.synchronize()
    static_pos = pos.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, graph_index = step(hot, logits, static_pos, info, draft_tokens)
    for trial in range(2):
        fresh = case(10 + trial)
        logits.copy_(fresh[1]); seeds.copy_(fresh[2]); pos_now = fresh[3]  # noqa: E702
        static_pos.copy_(pos_now)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(graph_index.view(-1), expected(hot, logits, seeds, sites.draft_forward_positions(pos_now)))
        assert torch.equal(static_pos, pos_now + 1)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
