"""The FA3 prefix / tail split's wiring (sglang_plugin/fa3_split_hook.py) on CPU: checks, layouts, routing, claim.

SGLang's FA3 backend imports sgl_kernel's CUDA library at module level, so it
cannot be built here: the backend is a stand-in with the attributes the hooks
read, the forward modes are SGLang's own ``ForwardMode``, and the KV write
goes through SGLang's ``KVWriteLoc``. FA3 itself is replaced by the torch
statement of its contract (``ops.prefix_split.part_call_reference``), so what
is checked is the routing: which forwards take the split, which layout each
mode builds from SGLang's metadata, that a forward builds it once and the
metadata hooks forget it, that K/V is written first and the output is
attention over each row's keys. The FA3 bits are the GPU suite's
(``test/registered/cuda/test_fa3_split_cuda.py``).
"""

import dataclasses
import logging
import sys
import types

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import DetSpecConfig
from sglang_detspec.ops import prefix_split as ps
from sglang_detspec.sglang_plugin import fa3_split_hook as fsh
from sglang_detspec.sglang_plugin import tree_attention_hook as tah
from sglang_detspec.sglang_plugin.channels import FA3_SPLIT, FA3_SPLIT_OK

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

HEADS, KV_HEADS, DIM = 4, 2, 16
SPLIT_BAG = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                          attention_backend="fa3", decode_attention="split", source="server_args", kernel="torch")


@dataclasses.dataclass
class Meta:
    """The FlashAttentionMetadata fields the split reads (SGLang's class needs CUDA to import)."""

    page_table: torch.Tensor = None
    cache_seqlens_int32: torch.Tensor = None
    cu_seqlens_q: torch.Tensor = None
    max_seq_len_q: int = 1
    swa_out_cache_loc: torch.Tensor = None


class Pool:
    """A KV pool over ``[slots, kv_heads, dim]`` buffers that records writes (SGLang's pool API)."""

    def __init__(self, slots):
        gen = torch.Generator().manual_seed(0)
        self.k = torch.randn(slots, KV_HEADS, DIM, generator=gen).to(torch.bfloat16)
        self.v = torch.randn(slots, KV_HEADS, DIM, generator=gen).to(torch.bfloat16)
        self.writes = []

    def set_kv_buffer(self, layer, loc, k, v, k_scale, v_scale):
        self.writes.append(loc.loc.clone())
        self.k[loc.loc] = k.view(-1, KV_HEADS, DIM)
        self.v[loc.loc] = v.view(-1, KV_HEADS, DIM)


def fa3_backend(**overrides):
    fields = dict(fa_impl_ver=3, use_mla=False, page_size=1, has_swa=False, local_attn_builder=None,
                  kv_cache_dtype_str="auto", kv_cache_dtype=torch.bfloat16, attn_cp_size=1, fa_skip_kv_cache=False,
                  is_draft_runner=False, topk=4, speculative_num_steps=3, speculative_num_draft_tokens=8,
                  head_dim=DIM, num_attention_heads=HEADS, num_kv_heads=KV_HEADS, device="cpu")
    fields.update(overrides)
    backend = types.SimpleNamespace(**fields)
    backend.get_paged_mha_kv_cache = lambda layer: (backend.pool.k.unsqueeze(1), backend.pool.v.unsqueeze(1))
    return backend


@pytest.mark.parametrize("overrides, why", [
    ({}, "no CUDA device"),
    ({"fa_impl_ver": 4}, "FA4"),
    ({"use_mla": True}, "MLA"),
    ({"page_size": 16}, "page size 16"),
    ({"has_swa": True}, "sliding-window"),
    ({"kv_cache_dtype_str": "fp8_e4m3", "kv_cache_dtype": torch.float8_e4m3fn}, "fp8_e4m3 KV cache"),
    ({"attn_cp_size": 2}, "context parallelism"),
    ({"fa_skip_kv_cache": True}, "skips the KV cache"),
    ({"speculative_num_draft_tokens": 66}, "trees of 66 draft tokens"),
    ({"head_dim": 512}, "head size 512"),
])
def test_the_backend_check_names_why_the_split_cannot_serve_and_lowers_the_claim(bag, caplog, overrides, why):
    bag(SPLIT_BAG)
    assert SPLIT_BAG.logits == "bitwise"
    backend = fa3_backend(**overrides)
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        fsh.check_backend(None, backend)
    assert not fsh._serves(backend)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and why in warnings[0] and fsh.SPLIT_OFF in warnings[0]
    # The bag now states what runs: SGLang's cascade for this tree server, 'tokens'.
    from sglang_detspec.config import current_config

    assert current_config().decode_attention == "one_pass" and current_config().logits == "tokens"
    assert "'tokens', not 'bitwise'" in warnings[0]


def test_other_servers_and_the_draft_are_left_alone(bag, caplog):
    for config, backend in ((dataclasses.replace(SPLIT_BAG, decode_attention="one_pass"), fa3_backend()),
                            (SPLIT_BAG, fa3_backend(is_draft_runner=True)),
                            (dataclasses.replace(SPLIT_BAG, deterministic=False), fa3_backend(use_mla=True))):
        bag(config)
        with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
            fsh.check_backend(None, backend)
        assert not fsh._serves(backend) and not caplog.records


def test_the_start_up_check_is_asked_once_per_shape(bag, monkeypatch):
    calls = []
    monkeypatch.setattr(fsh, "split_modes_agree", lambda *a: calls.append(a) or True)
    monkeypatch.setattr(fsh, "_CHECKED", {})
    monkeypatch.setattr(fsh.torch.version, "hip", None)
    bag(SPLIT_BAG)
    for _ in range(2):  # a switching tree's second state: the same answer, no second check
        backend = fa3_backend(device="cuda:0")
        fsh.check_backend(None, backend)
        assert fsh._serves(backend)
    assert len(calls) == 1
    monkeypatch.setattr(fsh, "_CHECKED", {})
    monkeypatch.setattr(fsh, "split_modes_agree", lambda *a: False)
    bag(SPLIT_BAG)
    backend = fa3_backend(device="cuda:0")
    fsh.check_backend(None, backend)
    assert not fsh._serves(backend)
    assert fsh._CHECKED[((HEADS, KV_HEADS, DIM, torch.bfloat16), "cuda:0")].startswith("its start-up check found")


def test_the_node_path_stands_down_where_the_split_serves(bag):
    bag(dataclasses.replace(SPLIT_BAG, tree_attention="nodes"))
    backend = types.SimpleNamespace(is_draft_runner=False, topk=4)
    from sglang_detspec.sglang_plugin.channels import TREE_NODES_OK

    TREE_NODES_OK.write(backend, True)
    assert not tah._serves(backend)
    bag(dataclasses.replace(SPLIT_BAG, tree_attention="nodes", decode_attention="one_pass"))  # the split fell back
    assert tah._serves(backend)


def serving_backend(bag, pool_slots=4096, **overrides):
    bag(SPLIT_BAG)
    backend = fa3_backend(**overrides)
    FA3_SPLIT_OK.write(backend, True)
    backend.pool = Pool(pool_slots)
    backend.token_to_kv_pool = backend.pool
    return backend


@pytest.fixture
def reference_fa3(monkeypatch):
    """FA3 replaced by the torch statement of its contract, output in q's dtype."""
    def split_attention(q, k, v, split, scale, *, softcap=0.0, out=None):
        assert softcap == 0.0
        result = ps.prefix_split_reference(q, k, v, split, scale).to(q.dtype)
        if out is not None:
            out.copy_(result)
            return out
        return result

    monkeypatch.setattr(fsh, "split_attention", split_attention)


def test_the_start_up_check_passes_with_fa3s_contract_and_sees_a_misaddressed_row(monkeypatch):
    """``fa3_split.split_modes_agree`` run with FA3 replaced by its contract's torch statement passes; with a
    kernel that reads the next request's page-table row through ``cache_batch_idx`` it fails (only its batched
    calls have more than one row), so a kernel that mis-addresses the prefix calls keeps SGLang's calls."""
    from sglang_detspec.sglang_plugin import fa3_split

    def contract(q, k, v, call, scale, softcap=0.0, out=None):
        o, lse = ps.part_call_reference(q, k, v, call, scale)
        return (o, lse) if out is None else (out.copy_(o), lse)

    monkeypatch.setattr(fa3_split, "fa3_part", contract)
    args = (2, 1, 16, torch.float32, torch.device("cpu"))
    assert fa3_split.split_modes_agree(*args, lengths=(5, 193, 300))

    def misaddressed(q, k, v, call, scale, softcap=0.0, out=None):
        if call.table_rows is not None:
            call = dataclasses.replace(call, table_rows=(call.table_rows + 1) % call.page_table.shape[0])
        return contract(q, k, v, call, scale, out=out)

    monkeypatch.setattr(fa3_split, "fa3_part", misaddressed)
    assert not fa3_split.split_modes_agree(*args, lengths=(5, 193, 300))


def layer(**overrides):
    fields = dict(sliding_window_size=-1, is_cross_attention=False, head_dim=DIM, v_head_dim=DIM, tp_q_head_num=HEADS,
                  scaling=DIM ** -0.5, logit_cap=0.0, k_scale=None, v_scale=None, layer_id=0)
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


def batch(mode, out_cache_loc, spec_info=None):
    return types.SimpleNamespace(forward_mode=mode, out_cache_loc=out_cache_loc, out_cache_loc_is_physical=False,
                                 spec_info=spec_info, _attn_output=None)


def oracle(q, pool, keys, scale=DIM ** -0.5):
    """float64 softmax attention of one row ``[heads, dim]`` over the slots ``keys``."""
    group = HEADS // KV_HEADS
    k = pool.k[keys].double().repeat_interleave(group, 1)
    v = pool.v[keys].double().repeat_interleave(group, 1)
    w = torch.softmax(torch.einsum("hd,nhd->hn", q.double(), k) * scale, dim=1)
    return torch.einsum("hn,nhd->hd", w, v)


def test_an_extend_writes_its_kv_then_attends_over_each_rows_keys(bag, reference_fa3):
    backend = serving_backend(bag)
    gen = torch.Generator().manual_seed(1)
    prefix, ext = [0, 250], [300, 7]
    rows = torch.randperm(4000, generator=gen)[:sum(prefix) + sum(ext)].view(-1)
    seqs = [rows[:300].tolist(), rows[300:].tolist()]
    table = torch.zeros(2, 300, dtype=torch.int32)
    for b, s in enumerate(seqs):
        table[b, :len(s)] = torch.tensor(s)
    lens = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    backend.forward_metadata = Meta(page_table=table, cache_seqlens_int32=lens,
                                    cu_seqlens_q=torch.tensor([0, 300, 307], dtype=torch.int32), max_seq_len_q=300)
    new = torch.tensor(seqs[0] + seqs[1][250:])
    q = torch.randn(307, HEADS * DIM, generator=gen).to(torch.bfloat16)
    k = torch.randn(307, KV_HEADS * DIM, generator=gen).to(torch.bfloat16)
    v = torch.randn(307, KV_HEADS * DIM, generator=gen).to(torch.bfloat16)
    fb = batch(ForwardMode.EXTEND, new)

    def original(*a, **kw):
        raise AssertionError("SGLang's extend ran")

    out = fsh.split_extend_around(original, backend, q, k, v, layer(), fb)
    assert out.shape == (307, HEADS * DIM)
    assert torch.equal(backend.pool.writes[0], new)  # K/V written before the attention read it
    layout = FA3_SPLIT.read(backend)
    assert layout is not None and layout[0].has_prefix.shape == (307,) and layout[1] is False
    # The next layer of the forward reuses the layout; the next forward's metadata forgets it.
    fsh.split_extend_around(original, backend, q, k, v, layer(layer_id=1), fb)
    assert FA3_SPLIT.read(backend) is layout
    # A capture after warm-up forwards with the same metadata rebuilds it, so the graph holds its kernels.
    assert fsh._layout(backend, fb, 307, capturing=True) is not layout[0]
    assert FA3_SPLIT.read(backend)[1] is True
    assert fsh._layout(backend, fb, 307, capturing=True) is FA3_SPLIT.read(backend)[0]
    fsh.forget_split(None, backend, fb)
    assert FA3_SPLIT.read(backend) is None
    qr = q.view(307, HEADS, DIM)
    for r, keys in ((0, seqs[0][:1]), (299, seqs[0]), (300, seqs[1][:251]), (306, seqs[1])):
        got = out.view(307, HEADS, DIM)[r].double()
        assert torch.allclose(got, oracle(qr[r], backend.pool, keys), atol=2e-2), r


def test_each_mode_builds_its_layout(bag):
    backend = serving_backend(bag)
    table = torch.arange(2 * 50, dtype=torch.int32).view(2, 50)
    backend.forward_metadata = Meta(page_table=table, cache_seqlens_int32=torch.tensor([40, 50], dtype=torch.int32),
                                    cu_seqlens_q=torch.arange(3, dtype=torch.int32), max_seq_len_q=1)
    split = fsh._layout(backend, batch(ForwardMode.DECODE, None), 2)
    # 50 keys at most (the table's width): below the first split key, so the tail call alone.
    assert split.prefix is None and split.tail.cu_seqlens_q.tolist() == [0, 1, 2]
    # A chain verify (top-k 1): an extend of the draft tokens after the committed keys.
    FA3_SPLIT.write(backend, None)
    backend.topk = 1
    backend.forward_metadata = Meta(page_table=table, cache_seqlens_int32=torch.tensor([48, 50], dtype=torch.int32),
                                    cu_seqlens_q=torch.tensor([0, 8, 16], dtype=torch.int32), max_seq_len_q=8)
    split = fsh._layout(backend, batch(ForwardMode.TARGET_VERIFY, None), 16)
    # Both requests' rows sit below the first split key: one element each over all their keys (the second empty).
    assert split.tail.cu_seqlens_q.tolist() == [0, 8, 8, 16, 16] and split.tail.seqlens.tolist() == [48, 0, 50, 0]
    assert split.prefix_index is None and not split.has_prefix.any()
    # A tree verify: the cascade's prefix and expand metadata, two prefix elements per request.
    FA3_SPLIT.write(backend, None)
    backend.topk = 4
    backend.forward_metadata = Meta(page_table=table, cache_seqlens_int32=torch.tensor([40, 50], dtype=torch.int32))
    anc = torch.arange(16 * 8, dtype=torch.int32).view(16, 8)
    backend.forward_metadata_spec_decode_expand = Meta(page_table=anc,
                                                       cache_seqlens_int32=torch.tensor([1, 2, 2, 3] * 4,
                                                                                        dtype=torch.int32))
    split = fsh._layout(backend, batch(ForwardMode.TARGET_VERIFY, None), 16)
    assert split.prefix.cu_seqlens_q.shape == (5,) and split.prefix_index is not None
    # A draft model's own modes and a draft decode (spec info set) are not the target's: no layout.
    for mode, spec in ((ForwardMode.DRAFT_EXTEND_V2, None), (ForwardMode.DECODE, "spec"),
                       (ForwardMode.IDLE, None), (ForwardMode.SPLIT_PREFILL, None)):
        FA3_SPLIT.write(backend, None)
        assert fsh._layout(backend, batch(mode, None, spec), 2) is None


def test_uncovered_calls_run_sglangs_forward(bag, reference_fa3, caplog):
    backend = serving_backend(bag)
    backend.forward_metadata = Meta(page_table=torch.zeros(1, 4, dtype=torch.int32),
                                    cache_seqlens_int32=torch.tensor([4], dtype=torch.int32),
                                    cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32))
    q = torch.zeros(1, HEADS * DIM, dtype=torch.bfloat16)
    kv = torch.zeros(1, KV_HEADS * DIM, dtype=torch.bfloat16)

    def original(*a, **kw):
        return "sglang"

    fb = batch(ForwardMode.DECODE, torch.tensor([3]))
    bidirectional = types.SimpleNamespace(name="DECODER_BIDIRECTIONAL")
    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        for bad_layer in (layer(sliding_window_size=512), layer(is_cross_attention=True), layer(v_head_dim=8),
                          layer(attn_type=bidirectional)):
            assert fsh.split_decode_around(original, backend, q, kv, kv, bad_layer, fb) == "sglang"
    # A serving backend says once that a layer left to SGLang makes its logits 'tokens'.
    warned = [r.getMessage() for r in caplog.records if "does not cover" in r.getMessage()]
    assert len(warned) == 1 and "'tokens', not 'bitwise'" in warned[0]
    for name in ("sinks", "q_rope", "score_mod", "rel_bias", "k_descale"):
        assert fsh.split_decode_around(original, backend, q, kv, kv, layer(), fb, **{name: "x"}) == "sglang"
    assert fsh.split_decode_around(original, backend, q, kv, kv, layer(), fb, return_lse=True) == "sglang"
    assert fsh.split_decode_around(original, backend, q, kv, kv, layer(), fb, True, "positional") == "sglang"
    assert fsh.split_decode_around(original, backend, q, kv, kv, layer(), batch(ForwardMode.IDLE, None)) == "sglang"
    bag(dataclasses.replace(SPLIT_BAG, decode_attention="one_pass"))
    assert fsh.split_decode_around(original, backend, q, kv, kv, layer(), fb) == "sglang"
    bag(SPLIT_BAG)
    assert fsh.split_decode_around(original, backend, q, kv, kv, layer(), fb) != "sglang"



@pytest.mark.parametrize("head_dim, causal, rows, want", [
    # Up to head size 64 FA3 sizes its query tile from max_seqlen_q: every call passes the prefill's bound.
    (64, True, 1, 192), (64, False, 1, 192), (32, True, 300, 300),
    # Above it a call's own rows, and at least 2 for a causal call (FA3 drops the flag of a one-row call
    # above head size 128; the tail call must stay on the prefill's causal kernel).
    (96, True, 1, 2), (128, False, 1, 1), (256, True, 1, 2), (256, True, 8, 8), (256, False, 8, 8),
])
def test_every_fa3_call_passes_the_max_seqlen_q_its_head_size_needs(head_dim, causal, rows, want):
    from sglang_detspec.sglang_plugin import fa3_split

    call = ps.PartCall(None, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                       torch.tensor([0, rows], dtype=torch.int32), rows, causal=causal)
    assert fa3_split.max_seqlen_q(call, head_dim) == want


def test_the_node_path_stands_by_under_the_split_and_says_so(caplog):
    """Asked for on a split server, the node path checks its backend but logs that the split verifies trees."""
    backend = types.SimpleNamespace(fa_impl_ver=3, use_mla=False, page_size=1, has_swa=False, local_attn_builder=None,
                                    kv_cache_dtype_str="auto", attn_cp_size=1, fa_skip_kv_cache=False,
                                    is_draft_runner=False, topk=4)
    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=4, num_draft_tokens=8,
                        attention_backend="fa3", tree_attention="nodes", source="server_args")
    from sglang_detspec import config

    config.install_config(bag)
    try:
        with caplog.at_level(logging.INFO, logger="sglang_detspec"):
            tah.check_backend(None, backend)
        text = " ".join(r.getMessage() for r in caplog.records)
        assert "node path stands by" in text and tah.NODE_PATH_ON not in text
        assert not tah._serves(backend)  # the split serves while the bag keeps it
        config.install_config(dataclasses.replace(bag, decode_attention="one_pass"))  # the split declined
        assert tah._serves(backend)
    finally:
        config.reset_config()


@pytest.mark.parametrize("overrides, why", [({"has_swa": True}, "sliding-window"), ({"fa_impl_ver": 4}, "FA4")])
def test_a_node_path_the_backend_turns_down_lowers_the_claim(caplog, overrides, why):
    """The FA3 tree default's node path, declined by its backend: the bag in force says the cascade's 'tokens'."""
    fields = dict(fa_impl_ver=3, use_mla=False, page_size=1, has_swa=False, local_attn_builder=None,
                  kv_cache_dtype_str="auto", attn_cp_size=1, fa_skip_kv_cache=False, is_draft_runner=False, topk=4)
    backend = types.SimpleNamespace(**{**fields, **overrides})
    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                        attention_backend="fa3", head_dim=128, page_size=1, tree_attention="nodes",
                        decode_attention="sglang", tree_chain_batch=16, tree_chain_tokens=12288, source="server_args",
                        set_tree_settings=("tree_chain_batch",))
    assert bag.logits == "bitwise" and bag.fa3_defaults_taken == ("tree_attention", "decode_attention",
                                                                  "tree_chain_tokens")
    from sglang_detspec import config

    config.install_config(bag)
    try:
        with caplog.at_level(logging.INFO, logger="sglang_detspec"):
            tah.check_backend(None, backend)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and tah.NODE_PATH_OFF in warnings[0] and why in warnings[0]
        assert "tree logits are 'tokens', not 'bitwise'" in warnings[0]
        kept = config.current_config()
        assert kept.tree_attention == "cascade" and kept.logits == "tokens"
        # The token bound the default gave the node path goes with it; the batch bound that was set stays.
        assert (kept.tree_chain_batch, kept.tree_chain_tokens) == (16, 0)
        assert not tah._serves(backend)
    finally:
        config.reset_config()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
