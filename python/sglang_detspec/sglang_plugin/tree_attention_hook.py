"""FA3 tree verify as decode queries: each tree node attends like the decode step of its token.

Opt-in: ``SGLANG_DETSPEC_TREE_ATTENTION=nodes`` (the bag's ``tree_attention``).

Why: SGLang 0.5.23's FA3 backend verifies a draft tree (``topk > 1``) by
cascade attention: one call over the cached prefix, one over each node's
ancestors, merged by log-sum-exp from two bf16 outputs. A decode step of the
same token is one call over prefix and path together, so the two round
differently (measured: 114 of 1024 logprobs one bf16 step apart,
``docs/forward_modes.md``). Here the tree verify runs SGLang's own
``forward_decode`` over a batch of ``bs * N`` one-token queries, node ``i``
of request ``b`` reading the key list ``prefix(b) ++ ancestors(i)`` (root to
node, itself last): the decode call of that token, with the same kernel,
split count and key order, so its logits are the decode step's bit for bit.
Cost: each node reads its request's prefix keys itself (``N`` times per
request instead of once), and the page table holds ``bs * N`` rows: under
CUDA graphs ``[max_bs * N, context + N]`` int32 (``N`` times SGLang's own
verify page table; 200 MB at 48 requests, 8 nodes, 131072 tokens), eagerly
``N`` times the prefix table SGLang builds for the step. The rows are
written up to each row's length (a Triton kernel on CUDA), once per verify
forward, not per layer.

Hooked symbols (``sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend``):

- ``__init__`` (AFTER): whether this backend takes the node path (logged).
- ``init_forward_metadata`` (AFTER, eager) and ``init_forward_metadata_out_graph``
  (AFTER, CUDA-graph capture and replay): after SGLang built the cascade's
  two metadata sets, build the node metadata from them (:func:`node_key_lists`);
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
import functools
import logging

import torch

from ..config import current_config
from ..ops.kernel_choice import use_triton

FA = "sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend"
INIT = f"{FA}.__init__"
INIT_EAGER = f"{FA}.init_forward_metadata"
INIT_GRAPH = f"{FA}.init_forward_metadata_out_graph"
GRAPH_STATE = f"{FA}.init_cuda_graph_state"
FORWARD_EXTEND = f"{FA}.forward_extend"

# Attributes this hook keeps on SGLang's backend instance.
_NODES = "_detspec_tree_nodes"  # the node metadata of the forward in progress, or None
_BUFFERS = "_detspec_tree_buffers"  # CUDA-graph buffers (dict of tensors), or None
_GRAPH_META = "_detspec_tree_graph_metadata"  # per graph batch size: metadata over views of the buffers

logger = logging.getLogger("sglang_detspec")
# Start-up lines (the E2E suite reads them from a server's log).
NODE_PATH_ON = "FA3 tree verify runs one decode query per tree node"
NODE_PATH_OFF = "FA3 tree verify keeps SGLang's cascade attention"


def node_key_lists(
    prefix_table: torch.Tensor,  # [bs, W] int32: request b's cache slots, the first prefix_lens[b] valid
    prefix_lens: torch.Tensor,  # [bs] int: keys before the tree (the root's position)
    ancestor_table: torch.Tensor,  # [bs * n, n] int32: node r's ancestors' slots, root to node, first anc_lens[r] valid
    ancestor_lens: torch.Tensor,  # [bs * n] int: ancestors of node r, itself included
    n: int,
    out_table: torch.Tensor | None = None,  # [>= bs * n, >= W + n] int32, written in place
    out_lens: torch.Tensor | None = None,  # [>= bs * n] int32, written in place
    kernel: str = "auto",
):
    """Each tree node's key list, as one decode query's page-table row: ``(table, lens)``.

    Row ``r = b * n + i`` of ``table`` [bs * n, W + n] starts with
    ``prefix_table[b, :prefix_lens[b]]`` followed by
    ``ancestor_table[r, :ancestor_lens[r]]``; ``lens[r] = prefix_lens[b] +
    ancestor_lens[r]`` (int32). Entries past ``lens[r]`` are never read (FA3
    reads a row up to its length) and hold whatever they held. Static shapes,
    no host sync: runs as it is before a CUDA-graph replay. With ``out_*``
    the result is written into their leading ``[bs * n, W + n]`` / ``[bs * n]``
    part and views of it are returned.

    ``kernel``: ``torch`` copies whole rows (``bs * n * W`` entries: under
    CUDA graphs, where ``W`` is the context length, hundreds of MB per verify
    step at high concurrency); ``triton`` (``auto`` on CUDA) copies each row
    up to its length only, so its cost follows the prefixes. Both write the
    same entries up to ``lens[r]``; the GPU suite pins them. All tables are
    row-major with unit column stride.

    Requires ``prefix_lens[b] <= W`` (the prefix table covers the prefix).
    SGLang's cascade metadata has this layout: its prefix page table and its
    "expand" table, whose rows list a node's ancestors sorted by node index
    (a parent precedes its children in SGLang's tree order).
    """
    bs, width = prefix_table.shape
    rows = bs * n
    if out_table is None:
        # Zeros, not empty: an entry past a row's length, should a kernel fetch one for a masked key, is a
        # valid slot id, as in SGLang's own tables.
        out_table = torch.zeros(rows, width + n, dtype=torch.int32, device=prefix_table.device)
    if out_lens is None:
        out_lens = torch.empty(rows, dtype=torch.int32, device=prefix_table.device)
    table, lens = out_table[:rows, : width + n], out_lens[:rows]
    if rows == 0:
        return table, lens
    if use_triton(kernel, prefix_table.device):
        _node_rows_triton(prefix_table, prefix_lens, ancestor_table, ancestor_lens, n, table, lens)
        return table, lens
    table.view(bs, n, -1)[:, :, :width].copy_(prefix_table.unsqueeze(1).expand(bs, n, width))
    starts = prefix_lens.to(torch.int64).repeat_interleave(n)  # [rows]
    cols = starts.unsqueeze(1) + torch.arange(n, device=table.device)  # < width + n
    table.scatter_(1, cols, ancestor_table.to(torch.int32))
    lens.copy_(starts + ancestor_lens.to(torch.int64))
    return table, lens


def _node_rows_triton(prefix_table, prefix_lens, ancestor_table, ancestor_lens, n, table, lens):
    import triton

    for name, t in (("prefix_table", prefix_table), ("ancestor_table", ancestor_table), ("out_table", table)):
        if t.stride(1) != 1:
            raise ValueError(f"{name} must have unit column stride, got strides {t.stride()}")
    kernel = _node_rows_kernel()
    kernel[(table.shape[0],)](
        prefix_table, prefix_table.stride(0), prefix_lens, ancestor_table, ancestor_table.stride(0), ancestor_lens,
        table, table.stride(0), lens, prefix_table.shape[1], N=n, N_POW2=triton.next_power_of_2(n), BLOCK=1024,
    )


@functools.cache
def _node_rows_kernel():
    """The Triton kernel, built on first use (Triton is imported only where it runs)."""
    import triton
    import triton.language as tl

    @triton.jit
    def node_rows(prefix_ptr, prefix_stride, prefix_lens_ptr, anc_ptr, anc_stride, anc_lens_ptr, out_ptr,
                  out_stride, out_lens_ptr, width, N: tl.constexpr, N_POW2: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        b = r // N
        # A prefix longer than the table (never from SGLang) is cut to it, so no write leaves the row.
        plen = tl.minimum(tl.load(prefix_lens_ptr + b).to(tl.int64), width)
        src = prefix_ptr + b.to(tl.int64) * prefix_stride
        dst = out_ptr + r.to(tl.int64) * out_stride
        for start in range(0, plen, BLOCK):  # one program per node row, looping over its prefix only
            offs = start + tl.arange(0, BLOCK)
            keep = offs < plen
            tl.store(dst + offs, tl.load(src + offs, mask=keep), mask=keep)
        cols = tl.arange(0, N_POW2)
        inside = cols < N
        anc = tl.load(anc_ptr + r.to(tl.int64) * anc_stride + cols, mask=inside)
        tl.store(dst + plen + cols, anc.to(tl.int32), mask=inside)
        tl.store(out_lens_ptr + r, (plen + tl.load(anc_lens_ptr + r).to(tl.int64)).to(tl.int32))

    return node_rows


def ancestor_layout(parents: list[int]) -> tuple[list[list[int]], list[int]]:
    """SGLang's cascade "expand" rows for one tree: ``(rows, lens)``, node indices.

    ``parents[i]``: node i's parent (-1 for the root, node 0; a parent before
    its children, SGLang's tree order). Row i lists node i's ancestors from
    the root to itself (``lens[i]`` of them), then the other nodes in index
    order: what SGLang's sort of the tree mask's columns gives. Used to build
    that layout where SGLang's backend cannot run (tests, the benchmark).
    """
    rows, lens = [], []
    for i in range(len(parents)):
        on, j = [], i
        while j >= 0:
            on.append(j)
            j = parents[j]
        on.reverse()
        rows.append(on + [j for j in range(len(parents)) if j not in on])
        lens.append(len(on))
    return rows, lens


def node_metadata(normal, expand, n: int, buffers: dict | None = None, kernel: str = "auto"):
    """SGLang's FA3 metadata for ``bs * n`` decode queries, one per tree node.

    ``normal`` / ``expand``: the cascade's prefix and draft metadata SGLang
    just built (``forward_metadata`` / ``forward_metadata_spec_decode_expand``).
    With ``buffers`` (CUDA graphs) every tensor is a view of them.
    ``kernel``: :func:`node_key_lists`'s.
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


def _why_not(backend) -> str | None:
    """Why the node path cannot serve this backend's tree verify, or None."""
    if backend.fa_impl_ver != 3:
        return "FA4 (only FA3 is covered)"
    if backend.use_mla:
        return "MLA"
    if backend.page_size != 1:
        return f"page size {backend.page_size} (decode tiles pages, the node rows list tokens)"
    if backend.has_swa or backend.local_attn_builder is not None:
        return "sliding-window or local attention"
    if backend.kv_cache_dtype_str != "auto":
        return f"a {backend.kv_cache_dtype_str} KV cache"
    if getattr(backend, "attn_cp_size", 1) > 1:
        return "context parallelism"
    if getattr(backend, "fa_skip_kv_cache", False):
        return "a backend that skips the KV cache"
    return None


def _serves(backend) -> bool:
    """The node path is asked for and this is a target FA3 backend verifying trees."""
    bag = current_config()
    return (bag.active and bag.tree_attention == "nodes" and not backend.is_draft_runner and backend.topk > 1
            and getattr(backend, _NODES + "_ok", False))


def check_backend(result, backend, *args, **kwargs):
    """AFTER hook of ``FlashAttentionBackend.__init__``: decide once whether this backend takes the node path.

    Logs why not where the bag asks for nodes on a tree server and the
    backend falls outside the covered case. Returns None.
    """
    bag = current_config()
    setattr(backend, _NODES, None)
    setattr(backend, _NODES + "_ok", False)
    if not (bag.active and bag.tree_attention == "nodes") or backend.is_draft_runner or backend.topk <= 1:
        return None
    why = _why_not(backend)
    if why:
        logger.warning("sglang-detspec: %s (%s): this server's tree logits are 'tokens', not 'bitwise' "
                       "(docs/forward_modes.md)", NODE_PATH_OFF, why)
        return None
    setattr(backend, _NODES + "_ok", True)
    logger.info("sglang-detspec: %s", NODE_PATH_ON)
    return None


def allocate_graph_buffers(result, backend, max_bs: int, *args, **kwargs):
    """AFTER hook of ``init_cuda_graph_state(max_bs, max_num_tokens)``: the node metadata's graph buffers."""
    if not _serves(backend):
        return None
    n, device = backend.speculative_num_draft_tokens, backend.device
    rows = max_bs * n
    pages = (backend.max_context_len + backend.page_size - 1) // backend.page_size
    setattr(backend, _BUFFERS, {
        "page_table": torch.zeros(rows, pages + n, dtype=torch.int32, device=device),
        "cache_seqlens": torch.zeros(rows, dtype=torch.int32, device=device),
        "cu_seqlens_q": torch.arange(rows + 1, dtype=torch.int32, device=device),
        "cu_seqlens_k": torch.zeros(rows + 1, dtype=torch.int32, device=device),
    })
    setattr(backend, _GRAPH_META, {})
    return None


def build_after_eager_metadata(result, backend, forward_batch, *args, **kwargs):
    """AFTER hook of ``init_forward_metadata(forward_batch)``: node metadata for an eager tree verify."""
    setattr(backend, _NODES, None)
    if _serves(backend) and forward_batch.forward_mode.is_target_verify():
        setattr(backend, _NODES, node_metadata(backend.forward_metadata, backend.forward_metadata_spec_decode_expand,
                                               backend.speculative_num_draft_tokens, kernel=current_config().kernel))
    return None


def build_after_graph_metadata(result, backend, forward_batch, *args, **kwargs):
    """AFTER hook of ``init_forward_metadata_out_graph(forward_batch, in_capture)``: the same into graph buffers.

    At capture the metadata object (views of the buffers) is made for the
    graph's batch size and the captured kernels read it; at replay the
    buffers are refilled in place before ``graph.replay()``.
    """
    setattr(backend, _NODES, None)
    buffers = getattr(backend, _BUFFERS, None)
    if buffers is None or not _serves(backend) or not forward_batch.forward_mode.is_target_verify():
        return None
    n = backend.speculative_num_draft_tokens
    meta = node_metadata(backend.forward_metadata, backend.forward_metadata_spec_decode_expand, n, buffers,
                         current_config().kernel)
    per_bs = getattr(backend, _GRAPH_META)
    bs = meta.cache_seqlens_int32.shape[0] // n
    # One object per graph batch size, made at capture: a replay refills its buffers only.
    setattr(backend, _NODES, per_bs.setdefault(bs, meta))
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
    nodes = getattr(backend, _NODES, None)
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
