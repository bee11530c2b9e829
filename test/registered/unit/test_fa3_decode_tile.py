"""FA3 decode on the causal kernel (``sglang_plugin/fa3_decode_tile_hook.py``): which calls it rewrites, and how.

The kernel-level proof (decode bits = prefill bits at head size 64) is the
GPU test ``test/registered/cuda/test_fa3_decode_tile_cuda.py``; here the
rewrite's rules, and that SGLang 0.5.23's FA3 decode call passes the
keywords the rules read (read from SGLang's installed source: its FA3 backend
does not import without CUDA).
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import sys
import types

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import DetSpecConfig
from sglang_detspec.sglang_plugin import fa3_decode_tile_hook as tile

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

ACTIVE = DetSpecConfig(deterministic=True, attention_backend="fa3", source="server_args")


def decode_kwargs(head_dim: int = 64, **over) -> tuple[torch.Tensor, dict]:
    """A query and the keywords of SGLang's FA3 decode call (``forward_decode``'s main call)."""
    q = torch.zeros(3, 4, head_dim, dtype=torch.bfloat16)
    kwargs = {"q": q, "k_cache": None, "v_cache": None, "page_table": None, "cache_seqlens": None,
              "cu_seqlens_q": torch.arange(4, dtype=torch.int32), "max_seqlen_q": 1, "softmax_scale": head_dim ** -0.5, "causal": True,
              "window_size": (-1, -1), "softcap": 0.0, "return_softmax_lse": False, "num_splits": 1, "out": None,
              "ver": 3, "scheduler_metadata": object()}
    kwargs.update(over)
    return q, kwargs


@pytest.mark.parametrize("head_dim", [8, 32, 64])
def test_a_decode_call_at_small_head_sizes_keeps_fa3s_causal_flag(head_dim):
    q, kwargs = decode_kwargs(head_dim)
    before = dict(kwargs)

    new = tile.retiled_kwargs(q, kwargs)

    assert new["max_seqlen_q"] == tile.CAUSAL_MAX_SEQLEN_Q == 2 and new["scheduler_metadata"] is None
    assert new["causal"] is True and "attention_chunk" not in new
    assert {k: v for k, v in new.items() if k not in ("max_seqlen_q", "scheduler_metadata")} == \
        {k: v for k, v in before.items() if k not in ("max_seqlen_q", "scheduler_metadata")}
    assert new["cu_seqlens_q"] is before["cu_seqlens_q"]  # each request keeps its one row
    assert kwargs == before  # the caller's dict is left as it was


@pytest.mark.parametrize("why, head_dim, over", [
    ("head size 65: FA3 keeps the causal tile for paged KV", 65, {}),
    ("head size 128", 128, {}),
    ("FA4", 64, {"ver": 4}),
    ("not causal (a cascade's prefix or draft call)", 64, {"causal": False}),
    ("a verify: several rows per request stay causal in FA3", 64, {"max_seqlen_q": 4}),
    ("sliding window", 64, {"window_size": (127, 0)}),
    ("an attention chunk of the model's own", 64, {"attention_chunk": 8192}),
    ("MLA's absorbed form", 64, {"qv": torch.zeros(1)}),
    ("no cu_seqlens_q: FA3 would read max_seqlen_q as every request's rows", 64, {"cu_seqlens_q": None}),
])
def test_other_calls_are_left_as_made(why, head_dim, over):
    q, kwargs = decode_kwargs(head_dim, **over)
    assert tile.retiled_kwargs(q, kwargs) is None, why


def _recording():
    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return "out"
    return calls, original


def test_the_hook_rewrites_only_in_active_runs(bag):
    q, kwargs = decode_kwargs()
    calls, original = _recording()

    bag(ACTIVE)
    assert tile.decode_on_prefill_tiles(original, **kwargs) == "out"
    assert calls[-1][1]["max_seqlen_q"] == tile.CAUSAL_MAX_SEQLEN_Q

    bag(dataclasses.replace(ACTIVE, disabled=True))
    tile.decode_on_prefill_tiles(original, **kwargs)
    assert calls[-1][1]["max_seqlen_q"] == 1 and calls[-1][1]["scheduler_metadata"] is kwargs["scheduler_metadata"]


def test_the_hook_reads_a_positional_query(bag):
    q, kwargs = decode_kwargs()
    del kwargs["q"]
    calls, original = _recording()
    bag(ACTIVE)
    tile.decode_on_prefill_tiles(original, q, **kwargs)
    assert calls[-1][0] == (q,) and calls[-1][1]["max_seqlen_q"] == tile.CAUSAL_MAX_SEQLEN_Q


def _fa3_backend_source() -> ast.Module:
    import sglang

    path = os.path.join(os.path.dirname(sglang.__file__), "srt", "layers", "attention", "flashattention_backend.py")
    with open(path) as f:
        return ast.parse(f.read())


def test_sglangs_decode_call_passes_the_keywords_the_rule_reads():
    """SGLang 0.5.23's main FA3 decode call names q, cu_seqlens_q, causal, max_seqlen_q, window_size, ver and the metadata.

    A renamed keyword would make the rule silently skip every call; the
    decode call must also not set an attention chunk of its own.
    """
    module = _fa3_backend_source()
    decode = next(n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == "forward_decode")
    calls = [c for c in ast.walk(decode) if isinstance(c, ast.Call) and getattr(c.func, "id", None)
             == "flash_attn_with_kvcache"]
    main = [c for c in calls if "scheduler_metadata" in {k.arg for k in c.keywords}]

    assert len(main) == 1
    names = {k.arg for k in main[0].keywords}
    assert {"q", "cu_seqlens_q", "causal", "max_seqlen_q", "window_size", "ver", "scheduler_metadata"} <= names
    assert "attention_chunk" not in names


def test_sglangs_backend_calls_the_module_level_function_the_hook_wraps():
    """Every FA3 call of the backend goes through the module-level name (the registry rebinds it), none through ``self``."""
    module = _fa3_backend_source()
    names = [c.func for c in ast.walk(module) if isinstance(c, ast.Call)]
    assert sum(isinstance(f, ast.Name) and f.id == "flash_attn_with_kvcache" for f in names) >= 1
    assert not any(isinstance(f, ast.Attribute) and f.attr == "flash_attn_with_kvcache" for f in names)
    assert tile.TARGET.rsplit(".", 1)[1] == "flash_attn_with_kvcache"


def _backend(head_dim=64, ver=3, mla=False, draft=False):
    return types.SimpleNamespace(head_dim=head_dim, fa_impl_ver=ver, use_mla=mla, is_draft_runner=draft)


def test_start_up_line_only_where_the_rewrite_applies(bag, caplog):
    bag(ACTIVE)
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        tile.log_retiling(None, _backend())
        tile.log_retiling(None, _backend(draft=True))
        for other in (_backend(head_dim=128), _backend(ver=4), _backend(mla=True)):
            tile.log_retiling(None, other)
    lines = [r.getMessage() for r in caplog.records if tile.RETILED_LOG in r.getMessage()]
    assert len(lines) == 2 and "target model, head size 64" in lines[0] and "draft model" in lines[1]

    caplog.clear()
    bag(dataclasses.replace(ACTIVE, deterministic=False))
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        tile.log_retiling(None, _backend())
    assert not caplog.records


def test_the_row_is_registered_around_the_backend_module_function():
    from sglang_detspec import sglang_plugin

    rows = [r for r in sglang_plugin.registry_rows() if r.hook is tile.decode_on_prefill_tiles]
    assert [(r.target, r.kind) for r in rows] == [(tile.TARGET, "AROUND")]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
