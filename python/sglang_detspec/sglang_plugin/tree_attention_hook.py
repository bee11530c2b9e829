"""FA3 tree verify as decode queries: each tree node attends like the decode step of its token.

Serves with ``SGLANG_DETSPEC_TREE_ATTENTION=nodes`` (the bag's ``tree_attention``) beside
``SGLANG_DETSPEC_DECODE_ATTENTION=sglang`` (or ``one_pass``): the FA3 tree default at target
head sizes 65-128 (``config.FA3_TREE_DEFAULTS``), or asked for. Under the prefix / tail split
(``split``) trees are already bitwise and this path stands by. Where the backend turns it down
(``check_backend``) the bag in force becomes the cascade's, with the claim that leaves.

Why: SGLang 0.5.23's FA3 backend verifies a draft tree (``topk > 1``) by
cascade attention: one call over the cached prefix, one over each node's
ancestors, merged by log-sum-exp from two bf16 outputs. A decode step of the
same token is one call over prefix and path together, so the two round
differently (logprobs one bf16 step apart: ``docs/e2e/2026-12-02-h200-matrix/``,
summarised in ``docs/forward_modes.md``). Here the tree verify runs SGLang's own
``forward_decode`` over a batch of ``bs * N`` one-token queries, node ``i``
of request ``b`` reading the key list ``prefix(b) ++ ancestors(i)`` (root to
node, itself last): the decode call of that token, with the same kernel,
split count and key order, so its logits are the decode step's bit for bit.
Cost: each node reads its request's prefix keys itself (``N`` times per
request instead of once), and the page table holds ``bs * N`` rows: under
CUDA graphs ``[max_bs * N, context + N]`` int32 (``N`` times SGLang's own
verify page table: 4 bytes x 48 x 8 x 131072 = 200 MB at 48 requests, 8 nodes,
131072 tokens), eagerly
``N`` times the prefix table SGLang builds for the step. The rows are
written up to each row's length (a Triton kernel on CUDA), once per verify
forward, not per layer.

Hooked symbols (``sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend``):

- ``__init__`` (AFTER): whether this backend takes the node path (logged).
- ``init_forward_metadata`` (AFTER, eager) and ``init_forward_metadata_out_graph``
  (AFTER, CUDA-graph capture and replay): after SGLang built the cascade's
  two metadata sets, build the node metadata from them (``ops.node_rows.node_key_lists``);
  under CUDA graphs into buffers allocated once by
- ``init_cuda_graph_state`` (AFTER): ``[max_bs * N, pages + N]`` int32.
- ``forward_extend`` (AROUND): a target verify with node metadata runs
  ``forward_decode`` with that metadata (and ``topk`` seen as 1, so SGLang's
  decode does not take its own cascade); every other call is SGLang's.

Applies to the target model's FA3 backend in deterministic mode with page
size 1, without MLA, sliding-window or local attention, context parallelism,
an fp8 KV cache or FA4; elsewhere SGLang's cascade runs and start-up logs that
the server's tree logits are ``tokens``.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ..config import current_config, install_config
from ..ops.node_rows import node_key_lists
from .channels import TREE_BUFFERS, TREE_GRAPH_META, TREE_NODES, TREE_NODES_OK
from .fa3_split import FA_BACKEND as FA
from .fa3_split import backend_problem

INIT = f"{FA}.__init__"
INIT_EAGER = f"{FA}.init_forward_metadata"
INIT_GRAPH = f"{FA}.init_forward_metadata_out_graph"
GRAPH_STATE = f"{FA}.init_cuda_graph_state"
FORWARD_EXTEND = f"{FA}.forward_extend"


logger = logging.getLogger("sglang_detspec")
# Start-up lines (the E2E suite reads them from a server's log).
NODE_PATH_ON = "FA3 tree verify runs one decode query per tree node"
NODE_PATH_OFF = "FA3 tree verify keeps SGLang's cascade attention"


def node_metadata(normal, expand, n: int, buffers: dict | None = None, kernel: str = "auto"):
    """SGLang's FA3 metadata for ``bs * n`` decode queries, one per tree node.

    ``normal`` / ``expand``: the cascade's prefix and draft metadata SGLang
    just built (``forward_metadata`` / ``forward_metadata_spec_decode_expand``).
    With ``buffers`` (CUDA graphs) every tensor is a view of them.
    ``kernel``: ``ops.node_rows.node_key_lists``'s.
    """
    bs = normal.cache_seqlens_int32.shape[0]
    rows = bs * n
    out_table = out_lens = None
    if buffers is not None:
        out_table, out_lens = buffers["page_table"], buffers["cache_seqlens"]
    table, lens = node_key_lists(normal.page_table, normal.cache_seqlens_int32, expand.page_table,
                                 expand.cache_seqlens_int32, n, out_table, out_lens, kernel)
    if buffers is not None:
        cu_k = buffers["cu_seqlens_k"][: rows + 1]
        cu_k[1:].copy_(torch.cumsum(lens, 0, dtype=torch.int32))
        cu_q = buffers["cu_seqlens_q"][: rows + 1]
    else:
        cu_k = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
        cu_q = torch.arange(rows + 1, dtype=torch.int32, device=lens.device)
    return dataclasses.replace(
        normal, page_table=table, cache_seqlens_int32=lens, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seq_len_q=1, max_seq_len_k=table.shape[1], scheduler_metadata=None, local_attn_metadata=None,
        swa_spec_metadata=None,
    )


def _serves(backend) -> bool:
    """The node path is asked for and this is a target FA3 backend verifying trees."""
    bag = current_config()
    # Where the FA3 prefix / tail split serves (fa3_split_hook) it verifies trees too; where it cannot, its
    # start-up hook leaves a bag without it, and the node path serves.
    return (bag.active and bag.tree_attention == "nodes" and bag.decode_attention != "split"
            and not backend.is_draft_runner and backend.topk > 1 and TREE_NODES_OK.read(backend, False))


def check_backend(result, backend, *args, **kwargs):
    """AFTER hook of ``FlashAttentionBackend.__init__``: decide once whether this backend takes the node path.

    Logs why not where the bag asks for nodes on a tree server and the
    backend falls outside the covered case. Returns None.
    """
    bag = current_config()
    TREE_NODES.write(backend, None)
    TREE_NODES_OK.write(backend, False)
    if not (bag.active and bag.tree_attention == "nodes") or backend.is_draft_runner or backend.topk <= 1:
        return None
    why = backend_problem(backend)
    if why:
        # The bag in force says what serves from here on, so its claim (the start-up line, the responses' checks)
        # is the cascade's: the same problem turns the split down too (fa3_split.backend_problem), and the bounds
        # the FA3 tree default gave the node path go with it.
        lowered = {"tree_attention": "cascade", "decode_attention": "one_pass" if bag.decode_attention == "split"
                   else bag.decode_attention}
        lowered.update({bound: 0 for bound in ("tree_chain_batch", "tree_chain_tokens")
                        if bound in bag.fa3_defaults_taken})
        kept = dataclasses.replace(bag, **lowered)
        install_config(kept)
        logger.warning("sglang-detspec: %s (%s): this server's tree logits are %r%s (docs/forward_modes.md)",
                       NODE_PATH_OFF, why, kept.logits, "" if kept.logits == bag.logits else f", not {bag.logits!r}")
        return None
    TREE_NODES_OK.write(backend, True)
    if bag.decode_attention == "split":
        # The split's own start-up hook runs next; it verifies trees itself unless it declines.
        logger.info("sglang-detspec: the FA3 node path stands by: the prefix / tail split verifies trees where it "
                    "serves (SGLANG_DETSPEC_DECODE_ATTENTION=sglang runs the node path instead)")
        return None
    logger.info("sglang-detspec: %s", NODE_PATH_ON)
    return None


def allocate_graph_buffers(result, backend, max_bs: int, *args, **kwargs):
    """AFTER hook of ``init_cuda_graph_state(max_bs, max_num_tokens)``: the node metadata's graph buffers."""
    if not _serves(backend):
        return None
    n, device = backend.speculative_num_draft_tokens, backend.device
    rows = max_bs * n
    pages = (backend.max_context_len + backend.page_size - 1) // backend.page_size
    TREE_BUFFERS.write(backend, {
        "page_table": torch.zeros(rows, pages + n, dtype=torch.int32, device=device),
        "cache_seqlens": torch.zeros(rows, dtype=torch.int32, device=device),
        "cu_seqlens_q": torch.arange(rows + 1, dtype=torch.int32, device=device),
        "cu_seqlens_k": torch.zeros(rows + 1, dtype=torch.int32, device=device),
    })
    TREE_GRAPH_META.write(backend, {})
    return None


def build_after_eager_metadata(result, backend, forward_batch, *args, **kwargs):
    """AFTER hook of ``init_forward_metadata(forward_batch)``: node metadata for an eager tree verify."""
    TREE_NODES.write(backend, None)
    if _serves(backend) and forward_batch.forward_mode.is_target_verify():
        TREE_NODES.write(backend, node_metadata(backend.forward_metadata, backend.forward_metadata_spec_decode_expand,
                                               backend.speculative_num_draft_tokens, kernel=current_config().kernel))
    return None


def build_after_graph_metadata(result, backend, forward_batch, *args, **kwargs):
    """AFTER hook of ``init_forward_metadata_out_graph(forward_batch, in_capture)``: the same into graph buffers.

    At capture the metadata object (views of the buffers) is made for the
    graph's batch size and the captured kernels read it; at replay the
    buffers are refilled in place before ``graph.replay()``.
    """
    TREE_NODES.write(backend, None)
    buffers = TREE_BUFFERS.read(backend)
    if buffers is None or not _serves(backend) or not forward_batch.forward_mode.is_target_verify():
        return None
    n = backend.speculative_num_draft_tokens
    meta = node_metadata(backend.forward_metadata, backend.forward_metadata_spec_decode_expand, n, buffers,
                         current_config().kernel)
    per_bs = TREE_GRAPH_META.read(backend)
    bs = meta.cache_seqlens_int32.shape[0] // n
    # One object per graph batch size, made at capture: a replay refills its buffers only.
    TREE_NODES.write(backend, per_bs.setdefault(bs, meta))
    return None


def _layer_covered(layer, forward_batch, kwargs) -> bool:
    sliding = getattr(layer, "sliding_window_size", None)
    if (sliding is not None and sliding > -1) or layer.is_cross_attention:
        return False
    if any(kwargs.get(name) is not None for name in ("q_rope", "k_rope", "score_mod", "rel_bias")):
        return False
    if kwargs.get("return_lse") or getattr(forward_batch, "encoder_lens", None) is not None:
        return False
    return not forward_batch.spec_algorithm.is_uno()


def verify_tree_as_decode(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
    """AROUND hook of ``forward_extend(q, k, v, layer, forward_batch, save_kv_cache, **kw)``.

    A target verify with node metadata (built by the metadata hooks above)
    runs SGLang's ``forward_decode`` over ``bs * N`` one-token queries
    ``q`` [bs * N, heads * head_dim]: it writes the draft tokens' K/V as the
    extend would and returns the same ``[bs * N, heads * v_head_dim]``
    output. Every other call is SGLang's ``forward_extend``.
    """
    nodes = TREE_NODES.read(backend)
    if (nodes is None or args or not forward_batch.forward_mode.is_target_verify()
            or not _layer_covered(layer, forward_batch, kwargs)):
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    saved = backend.forward_metadata, backend.topk
    # SGLang's decode takes its own cascade when topk > 1; seen as 1, it runs the plain decode call.
    backend.forward_metadata, backend.topk = nodes, 1
    try:
        return backend.forward_decode(q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    finally:
        backend.forward_metadata, backend.topk = saved
