"""Where does FA3 give a chunked prefill other bits than decode? A kernel-level probe (Hopper GPU).

On the H200 (``docs/e2e/2026-12-04-h200-shape-modes/``, forward modes) a
server with ``--chunked-prefill-size 256`` gave 6 of 1,024 decode logprobs
other bits than one prefill of the same tokens, without speculative
decoding too, while every unchunked server's were the same. This probe
calls SGLang's FA3 (``flash_attn_with_kvcache``, ``ver=3``, one split) the
way SGLang's FlashAttention backend calls it, on random KV at page size 1,
for one sequence of ``L`` tokens:

- ``decode``: one query row per position p, keys ``[0, p]`` (a batch of
  one-row requests, ``max_seqlen_q`` 1), as ``forward_decode`` does, once
  without and once with the scheduler metadata SGLang precomputes for it
  (``get_scheduler_metadata``, one split);
- ``prefill``: all ``L`` rows in one causal call over keys ``[0, L)``
  (``cu_seqlens_k_new`` given, as ``forward_extend`` passes it);
- ``chunked``: the rows of chunk c (``[c C, min((c + 1) C, L))``) in one
  causal call over keys ``[0, (c + 1) C)``, one call per chunk, as a
  chunked prefill's extend does.

- ``retiled``: the decode rows with ``max_seqlen_q`` 2 at head sizes up to
  64 (the ``max_seqlen_q_2`` variant below; the plugin's decode rewrite until
  2026-12-05, removed when its GPU test found it left the bits as they were);
  at larger head sizes the call as SGLang makes it.
- ``decode_variants``: the decode rows as FA3 runs them with other flags,
  each against the prefill and against SGLang's own decode (0 there: the
  variant changed nothing) and against the explicitly unmasked call, with the
  rows past 128 keys that equal the prefill as ranges: ``sglang`` (as SGLang calls it), ``chunk`` (a
  whole-sequence attention chunk: the plugin's first rewrite, which did not
  change the bits), ``max_seqlen_q_2`` (the plugin's second rewrite, removed), ``unmasked``
  (``causal`` False, what FA3 makes of SGLang's call at head size <= 64),
  ``max_seqlen_q_2_unmasked`` (both: whether the bound alone changes a
  row), and ``two_row_extend`` (rows p - 1 and p of each position in one
  causal call per request, as a chain's verify makes it; row p compared).

Per configuration (head count, KV heads, head size, ``L``, chunk ``C``) it
counts the rows whose output differs in any bit, for chunked against decode,
prefill against decode, chunked against prefill (with the first differing
rows and their offsets in the chunk) and the re-tiled decode against the
prefill and the chunked prefill, and for the differing
rows of chunked against decode it records each row's offset inside its
chunk and its position modulo 128 (FA3's tile widths are multiples of 16 up
to 192), to tell a chunk-start effect from a tile effect. Variants force
``pack_gqa`` off and on in every call, since SGLang's decode packs query
heads and its prefill may not. It writes ``chunk_probe.json``; it asserts
nothing (a measurement, for deciding what to build).

    python benchmark/fa3_chunk_probe.py [--out DIR] [--lengths 1100,2100,3000] [--chunks 256,512]
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import torch

from sglang_detspec.config import FA3_UNMASKED_DECODE_MAX_HEAD_DIM

DEV = "cuda"
# (query heads, KV heads, head size): the tiny E2E target's, a common 8B model's, and one above 128 (FA3 drops a
# one-row call's causal flag there too).
SHAPES = ((4, 4, 64), (32, 8, 128), (8, 2, 256))
PACK_GQA = (None, False, True)  # None: FA3's own choice per call, as SGLang leaves it


def chunks_of(length: int, chunk: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` row ranges of a prefill of ``length`` tokens in chunks of ``chunk`` (the last may be short).

    Raises:
        ValueError: ``length`` < 1 or ``chunk`` < 1.
    """
    if length < 1 or chunk < 1:
        raise ValueError(f"length and chunk must be >= 1, got {length} and {chunk}")
    return [(s, min(s + chunk, length)) for s in range(0, length, chunk)]


def differing_rows(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Indices of the rows of two ``[rows, ...]`` tensors (same shape and dtype) that differ in any bit.

    Bits, not values: -0.0 against 0.0 differs, a NaN against the same NaN does not.
    """
    bits_a = a.contiguous().view(torch.uint8).reshape(a.shape[0], -1)
    bits_b = b.contiguous().view(torch.uint8).reshape(b.shape[0], -1)
    return torch.nonzero((bits_a != bits_b).any(dim=1)).flatten().tolist()


def _fa3(q, k, v, table, lens, cu_q, max_q, *, pack_gqa, cu_k_new=None, scheduler_metadata=None, retile=False):
    """One FA3 call as SGLang's backend makes it; ``retile``: the ``max_seqlen_q_2`` variant at head sizes <= 64."""
    from sglang.kernels.ops.attention.flash_attention import flash_attn_with_kvcache

    kwargs = dict(q=q, k_cache=k, v_cache=v, page_table=table, cache_seqlens=lens, cu_seqlens_q=cu_q,
                  cu_seqlens_k_new=cu_k_new, max_seqlen_q=max_q, softmax_scale=q.shape[-1] ** -0.5, causal=True,
                  window_size=(-1, -1), num_splits=1, pack_gqa=pack_gqa, scheduler_metadata=scheduler_metadata,
                  ver=3)
    if retile and q.shape[-1] <= FA3_UNMASKED_DECODE_MAX_HEAD_DIM:
        kwargs.update(DECODE_VARIANTS["max_seqlen_q_2"])
    return flash_attn_with_kvcache(**kwargs)


def ranges(rows: list[int], limit: int = 12) -> dict:
    """Sorted row indices as inclusive ``[first, last]`` runs: ``{"runs": the first limit, "of": how many runs}``."""
    runs: list[list[int]] = []
    for r in sorted(rows):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return {"runs": runs[:limit], "of": len(runs)}


# name -> the keywords that differ from SGLang's decode call (``decode_variants`` in the module docstring)
DECODE_VARIANTS = {"sglang": {}, "chunk": {"attention_chunk": 1 << 30, "scheduler_metadata": None},
                   "max_seqlen_q_2": {"max_seqlen_q": 2, "scheduler_metadata": None}, "unmasked": {"causal": False},
                   "max_seqlen_q_2_unmasked": {"max_seqlen_q": 2, "causal": False}}


def two_row_layout(n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Query rows and ``cu_seqlens_q`` of ``n`` requests where request p holds positions p - 1 and p (p = 0: 0 alone).

    Returns ``(rows int64 [2 n - 1], cu_seqlens_q int32 [n + 1])``; request p's
    last row (``cu_seqlens_q[p + 1] - 1``) is position p.
    """
    rows = [0] + [r for p in range(1, n) for r in (p - 1, p)]
    cu = [0] + [1 + 2 * p for p in range(n)]
    return (torch.tensor(rows, dtype=torch.int64, device=device),
            torch.tensor(cu[:n + 1], dtype=torch.int32, device=device))


def _decode_variants(q, k, v, table, lens, cu, prefill, pack_gqa) -> dict:
    from sglang.kernels.ops.attention.flash_attention import flash_attn_with_kvcache

    base = dict(q=q, k_cache=k, v_cache=v, page_table=table, cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=1,
                softmax_scale=q.shape[-1] ** -0.5, causal=True, window_size=(-1, -1), num_splits=1,
                pack_gqa=pack_gqa, ver=3)
    outs, found = {}, {}
    for name, over in DECODE_VARIANTS.items():
        try:
            outs[name] = flash_attn_with_kvcache(**{**base, **over})
        except Exception as exc:  # a variant FA3 refuses is a finding
            found[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    try:  # a verify-shaped call: rows p - 1 and p of position p's request (row 0 alone), row p kept
        flat, cu2 = two_row_layout(q.shape[0], q.device)
        out = flash_attn_with_kvcache(**{**base, "q": q[flat], "cu_seqlens_q": cu2, "max_seqlen_q": 2})
        outs["two_row_extend"] = out[(cu2[1:] - 1).long()]
    except Exception as exc:
        found["two_row_extend"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    for name, out in outs.items():
        apart = set(differing_rows(out, prefill))
        found[name] = {"vs_prefill": len(apart),
                       "vs_sglang_decode": None if "sglang" not in outs else len(differing_rows(out, outs["sglang"])),
                       "vs_unmasked": None if "unmasked" not in outs else len(differing_rows(out, outs["unmasked"])),
                       "equal_rows_past_128": ranges([r for r in range(128, out.shape[0]) if r not in apart]),
                       "error": None}
    return found


def _decode_metadata(heads: int, kv_heads: int, dim: int, lens: torch.Tensor, cu_q: torch.Tensor, pack_gqa):
    """The FA3 scheduler metadata SGLang's decode precomputes (``FlashAttentionBackend._compute_scheduler_metadata``).

    ``pack_gqa`` as the probe forces it on the call (SGLang leaves it None).
    """
    from sgl_kernel.flash_attn import get_scheduler_metadata

    return get_scheduler_metadata(batch_size=lens.numel(), max_seqlen_q=1, max_seqlen_k=int(lens.max()),
                                  num_heads=heads, num_heads_k=kv_heads, headdim=dim, cache_seqlens=lens,
                                  qkv_dtype=torch.bfloat16, cu_seqlens_q=cu_q, page_size=1, causal=True,
                                  has_softcap=False, num_splits=1, pack_gqa=pack_gqa)


def probe(heads: int, kv_heads: int, dim: int, length: int, chunk: int, pack_gqa, seed: int = 0) -> dict:
    """One configuration: the three comparisons of the module docstring."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    k = torch.randn(length + 8, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    v = torch.randn(length + 8, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    q = torch.randn(length, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    slots = torch.randperm(length + 8, generator=gen, device=DEV)[:length].to(torch.int32)  # page size 1
    i32 = dict(dtype=torch.int32, device=DEV)
    # decode: row p is request p, keys [0, p]; without and with SGLang's precomputed scheduler metadata
    table = slots.unsqueeze(0).expand(length, length).contiguous()
    lens, cu = torch.arange(1, length + 1, **i32), torch.arange(0, length + 1, **i32)
    decode = _fa3(q, k, v, table, lens, cu, 1, pack_gqa=pack_gqa)
    try:
        meta = _decode_metadata(heads, kv_heads, dim, lens, cu, pack_gqa)
        decode_meta = _fa3(q, k, v, table, lens, cu, 1, pack_gqa=pack_gqa, scheduler_metadata=meta)
    except Exception as exc:  # recorded, the other comparisons still count
        decode_meta, meta_error = None, f"{type(exc).__name__}: {exc}"[:200]
    else:
        meta_error = None
    # prefill: one request, all rows
    one = torch.tensor([0, length], **i32)
    prefill = _fa3(q, k, v, slots.unsqueeze(0), torch.tensor([length], **i32), one, length, pack_gqa=pack_gqa,
                   cu_k_new=one)
    # chunked: one call per chunk, keys [0, end)
    parts = []
    for start, end in chunks_of(length, chunk):
        cu_q = torch.tensor([0, end - start], **i32)
        parts.append(_fa3(q[start:end], k, v, slots[:end].unsqueeze(0), torch.tensor([end], **i32), cu_q,
                          end - start, pack_gqa=pack_gqa, cu_k_new=torch.tensor([0, end], **i32)))
    chunked = torch.cat(parts)
    apart = differing_rows(chunked, decode)
    try:  # FA3 refusing the re-tiled call is a finding of its own; the other comparisons still count
        retiled, retile_error = _fa3(q, k, v, table, lens, cu, 1, pack_gqa=pack_gqa, retile=True), None
    except Exception as exc:
        retiled, retile_error = None, f"{type(exc).__name__}: {exc}"[:200]
    chunk_apart = differing_rows(chunked, prefill)
    variants = _decode_variants(q, k, v, table, lens, cu, prefill, pack_gqa)
    return {"heads": heads, "kv_heads": kv_heads, "dim": dim, "length": length, "chunk": chunk,
            "pack_gqa": pack_gqa,
            "chunked_vs_decode": len(apart), "prefill_vs_decode": len(differing_rows(prefill, decode)),
            "chunked_vs_prefill": len(chunk_apart), "rows": length,
            "retiled_decode_vs_prefill": None if retiled is None else len(differing_rows(retiled, prefill)),
            "retiled_decode_vs_chunked": None if retiled is None else len(differing_rows(retiled, chunked)),
            "retile_error": retile_error,
            "chunked_vs_prefill_first_rows": chunk_apart[:16],
            "chunked_vs_prefill_ranges": ranges(chunk_apart),
            "chunked_vs_decode_ranges": ranges(apart),
            "decode_variants": variants,
            "chunked_vs_prefill_offset_in_chunk": dict(collections.Counter(p % chunk for p in chunk_apart).most_common(8)),
            "decode_with_metadata_vs_decode": None if decode_meta is None else len(differing_rows(decode_meta, decode)),
            "chunked_vs_decode_with_metadata": None if decode_meta is None else len(differing_rows(chunked,
                                                                                                   decode_meta)),
            "metadata_error": meta_error,
            "apart_offset_in_chunk": dict(collections.Counter(p % chunk for p in apart).most_common(8)),
            "apart_position_mod_128": dict(collections.Counter(p % 128 for p in apart).most_common(8)),
            "apart_first_chunk": sum(1 for p in apart if p < chunk)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--lengths", default="1100,2100,3000")
    parser.add_argument("--chunks", default="256,512")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for heads, kv_heads, dim in SHAPES:
        for length in (int(x) for x in args.lengths.split(",")):
            for chunk in (int(x) for x in args.chunks.split(",")):
                for pack in PACK_GQA:
                    try:
                        row = probe(heads, kv_heads, dim, length, chunk, pack)
                    except Exception as exc:  # a variant FA3 refuses is a row too
                        row = {"heads": heads, "kv_heads": kv_heads, "dim": dim, "length": length, "chunk": chunk,
                               "pack_gqa": pack, "error": f"{type(exc).__name__}: {exc}"[:300]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    # Written after every row: a run cut short by its time limit keeps what it measured.
                    with open(os.path.join(args.out, "chunk_probe.json"), "w") as f:
                        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f,
                                  indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
