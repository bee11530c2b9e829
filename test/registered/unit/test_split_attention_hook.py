"""``SGLANG_DETSPEC_DECODE_ATTENTION=split``: where the Triton hook routes each call, and what the server claims.

The hook is installed on SGLang's real ``TritonAttnBackend`` class with a
real ``MHATokenToKVPool`` on CPU (the constructor of the backend needs a GPU
model runner, so the instance carries the attributes the hook reads, named
as SGLang's constructor names them). The kernels are replaced by recorders
here: what runs them is ``test_split_attention.py`` (CPU interpreter) and
the GPU suite.
"""

import dataclasses
import inspect
import sys
import types

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import DECODE_ATTENTION_ENV, DetSpecConfig, env_settings, logits_guarantee
from sglang_detspec.sglang_plugin import attention_hook, startup_notes

register_cpu_ci(est_time=15, suite="detspec-unit-cpu")

HEADS, KV_HEADS, DIM = 4, 2, 16


def _refuse(layer):
    raise ValueError(f"layer {layer} is not a full-attention layer")  # as SGLang's hybrid linear-attention pools


def _pool(page_size=1, dtype=torch.bfloat16):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return MHATokenToKVPool(64, page_size, dtype, KV_HEADS, DIM, 2, "cpu", False)


def _backend(**attrs):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = object.__new__(TritonAttnBackend)
    values = dict(enable_deterministic=True, is_draft_runner=False, use_mla=False, dcp_size=1, page_size=1,
                  kv_indptr=torch.zeros(9, dtype=torch.int32), decode_attention_fwd="sglang's decode",
                  extend_attention_fwd_unified="sglang's extend", max_context_len=4096, max_kv_splits=16,
                  num_head=HEADS, num_kv_head=KV_HEADS, token_to_kv_pool=_pool(), topk=1)
    values.update(attrs)
    for name, value in values.items():
        setattr(backend, name, value)
    return backend


@pytest.fixture
def split_bag(monkeypatch):
    from sglang_detspec import config

    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend="triton",
                        decode_attention="split")
    monkeypatch.setattr(config, "_current", bag)
    return bag


@pytest.mark.parametrize("attrs, reason", [
    ({}, "no CUDA device"),
    ({"page_size": 16}, "KV page size 16 (the kernels read pages of one token)"),
    ({"max_kv_splits": 15}, "SGLang's decode scratch holds 15 splits, the context needs 16 segments of 256 keys"),
    ({"num_head": 130}, "65 query heads per KV head: the decode tile holds at most 64"),
    ({"token_to_kv_pool": _pool(dtype=torch.float32)}, "dtype must be bfloat16 or float16, got torch.float32"),
    ({"topk": 4, "num_draft_tokens": 257}, "257 draft tokens per verify (the split verify takes at most 256)"),
    ({"topk": 1, "num_draft_tokens": 257}, "257 draft tokens per verify"),  # a chain's verify takes the same kernels
    ({"topk": 4, "num_draft_tokens": 256}, "no CUDA device"),
    ({"token_to_kv_pool": types.SimpleNamespace(start_layer=0, get_key_buffer=_refuse, get_value_buffer=_refuse)},
     "the KV cache's first layer is not readable as full attention"),
])
def test_split_names_why_it_cannot_serve_a_backend(attrs, reason):
    assert attention_hook.split_unavailable(_backend(**attrs)).startswith(reason)


def test_a_backend_split_cannot_serve_keeps_the_one_pass_decode_and_says_so(split_bag, caplog):
    from sglang_detspec.config import current_config

    backend = _backend()
    with caplog.at_level("WARNING", logger="sglang_detspec"):
        attention_hook.use_one_pass_decode(None, backend)
    assert callable(backend.decode_attention_fwd)  # the one-pass decode
    assert backend.extend_attention_fwd_unified == "sglang's extend"
    assert any("SGLANG_DETSPEC_DECODE_ATTENTION=split not used (no CUDA device)" in r.getMessage()
               for r in caplog.records)
    # A chain keeps its claim; the bag now names the path that runs.
    assert current_config().decode_attention == "one_pass" and current_config().logits == "bitwise"
    assert not any("logits are" in r.getMessage() for r in caplog.records)


def test_a_tree_server_split_cannot_serve_says_its_claim_drops_to_tokens(monkeypatch, caplog):
    from sglang_detspec import config

    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=4, num_steps=3, num_draft_tokens=8,
                        attention_backend="triton", decode_attention="split")
    assert bag.logits == "bitwise"
    monkeypatch.setattr(config, "_current", bag)
    with caplog.at_level("WARNING", logger="sglang_detspec"):
        attention_hook.use_one_pass_decode(None, _backend(topk=4))
    assert config.current_config().logits == "tokens"
    assert any("this server's logits are 'tokens', not 'bitwise'" in r.getMessage() for r in caplog.records)


@pytest.fixture
def routed(monkeypatch):
    """A split-routed backend's ``(decode, extend, calls)``, the kernels and fallbacks recording their calls."""
    calls = []
    monkeypatch.setattr(attention_hook, "split_decode", lambda *a, **k: calls.append("split decode"))
    monkeypatch.setattr(attention_hook, "split_extend", lambda *a, **k: calls.append(("split extend", a[-2], a[-1])))
    monkeypatch.setattr(attention_hook, "split_tree_verify",
                        lambda *a, **k: calls.append(("split tree", a[-2], a[-1])))

    def make(**attrs):
        backend = _backend(**attrs)
        decode, extend = attention_hook._split_paths(
            backend, lambda *a, **k: calls.append("one-pass decode"),
            lambda *a, **k: calls.append("sglang extend"))
        return decode, extend

    return make, calls


def _decode_args(heads=HEADS, dim=DIM, dtype=torch.bfloat16):
    q = torch.zeros(2, heads, dim, dtype=dtype)
    kv = torch.zeros(8, KV_HEADS, dim, dtype=dtype)
    scratch = torch.zeros(2, heads, 16, dim)
    return (q, kv, kv, torch.empty_like(q), torch.tensor([0, 3, 5]), torch.arange(5), scratch,
            torch.zeros(2, heads, 16), None, 16, 0.25, 1.0, 1.0)


def _extend_args():
    q = torch.zeros(5, HEADS, DIM, dtype=torch.bfloat16)
    kv = torch.zeros(8, KV_HEADS, DIM, dtype=torch.bfloat16)
    ptr = torch.tensor([0, 3, 5], dtype=torch.int32)
    return (q, torch.empty_like(q), kv, kv, 1.0, 1.0, ptr, ptr, torch.arange(5), torch.zeros(2, dtype=torch.int32), 3)


@pytest.mark.parametrize("kwargs, want", [
    ({}, "split decode"),
    ({"logit_cap": 30.0}, "one-pass decode"),
    ({"sinks": torch.zeros(HEADS)}, "one-pass decode"),
    ({"xai_temperature_len": 8}, "one-pass decode"),
    ({"page_size": 16}, "one-pass decode"),
    ({"score_mod": object()}, "one-pass decode"),
])
def test_decode_runs_split_unless_the_layer_needs_what_it_lacks(routed, kwargs, want):
    make, calls = routed
    decode, _ = make()
    decode(*_decode_args(), **kwargs)
    assert calls == [want]


def test_a_layer_of_another_shape_or_kv_scale_keeps_the_one_pass_pair(routed):
    make, calls = routed
    decode, extend = make()
    decode(*_decode_args(dim=32))
    args = list(_decode_args())
    args[11] = 0.5  # k_scale
    decode(*args)
    ext = list(_extend_args())
    ext[4] = 0.5
    extend(*ext)
    assert calls == ["one-pass decode", "one-pass decode", "sglang extend"]


MASK = {"custom_mask": torch.ones(4, dtype=torch.bool), "mask_indptr": torch.zeros(3)}


@pytest.mark.parametrize("topk, kwargs, want", [
    (1, {}, "split extend"),
    (4, {}, "split extend"),  # a tree server's prefill
    # A verify (SGLang's verify mask): each draft token over its prefix and path, chain or tree.
    (1, MASK, "split tree"),
    (4, MASK, "split tree"),
    (1, {"custom_mask": torch.ones(4, dtype=torch.bool)}, "sglang extend"),  # no mask offsets: not a verify
    (1, {"is_causal": False}, "sglang extend"),
    (1, {"sliding_window_size": 128}, "sglang extend"),
    (1, {"logit_cap": 30.0}, "sglang extend"),
    (1, {"sinks": torch.zeros(HEADS)}, "sglang extend"),
])
def test_extend_runs_split_for_causal_calls_and_verifies(routed, topk, kwargs, want):
    make, calls = routed
    _, extend = make(topk=topk)
    extend(*_extend_args(), sm_scale=0.25, **kwargs)
    assert [c if isinstance(c, str) else c[0] for c in calls] == [want]
    if want != "sglang extend":
        assert calls[0][1:] == (3, 0.25)  # max_len_extend as an int, SGLang's scale


def test_an_extend_without_queries_goes_to_sglang(routed):
    make, calls = routed
    _, extend = make()
    args = list(_extend_args())
    args[-1] = 0
    extend(*args)
    assert calls == ["sglang extend"]


def test_a_tree_verify_the_kernels_do_not_cover_says_once_that_trees_are_tokens(routed, caplog):
    make, calls = routed
    _, tree_extend = make(topk=4)
    _, chain_extend = make(topk=1)
    with caplog.at_level("WARNING", logger="sglang_detspec"):
        # A layer the kernels do not cover decodes one-pass, which a chain's masked verify still matches.
        chain_extend(*_extend_args(), logit_cap=30.0, **MASK)
        assert not caplog.records
        tree_extend(*_extend_args(), logit_cap=30.0, **MASK)
        tree_extend(*_extend_args(), logit_cap=30.0, **MASK)
    assert calls == ["sglang extend"] * 3
    assert len(caplog.records) == 1 and "this server's tree logits are 'tokens'" in caplog.records[0].getMessage()


def test_a_covered_layers_verify_that_cannot_run_split_says_the_verify_is_tokens(routed, caplog):
    """The layer's decode runs split, so SGLang's masked verify no longer matches it, chain or tree."""
    make, calls = routed
    _, chain_extend = make(topk=1)
    with caplog.at_level("WARNING", logger="sglang_detspec"):
        chain_extend(*_extend_args(), custom_mask=torch.ones(4, dtype=torch.bool))  # no mask offsets
    assert calls == ["sglang extend"]
    assert len(caplog.records) == 1 and "this server's verify logits are 'tokens'" in caplog.records[0].getMessage()


def test_extend_without_a_scale_takes_sglangs_default(routed):
    make, calls = routed
    _, extend = make()
    extend(*_extend_args())
    assert calls == [("split extend", 3, DIM ** -0.5)]


def test_where_split_can_serve_both_kernels_are_swapped_and_logged(split_bag, monkeypatch, caplog):
    monkeypatch.setattr(attention_hook, "split_unavailable", lambda backend: None)
    backend = _backend()
    with caplog.at_level("INFO", logger="sglang_detspec"):
        attention_hook.use_one_pass_decode(None, backend)
    assert backend.decode_attention_fwd.__name__ == "decode" and backend.extend_attention_fwd_unified.__name__ == "extend"
    assert any(attention_hook.SPLIT_ON in r.getMessage() for r in caplog.records)
    assert not any(attention_hook.SPLIT_OFF in r.getMessage() for r in caplog.records)


def test_the_start_up_check_runs_once_per_shape_and_device_in_a_process(monkeypatch):
    runs = []
    monkeypatch.setattr(attention_hook, "_CHECKED", {})
    monkeypatch.setattr(attention_hook, "split_modes_agree", lambda *a: runs.append(a) or True)
    # A device-only stand-in for kv_indptr: this machine has no CUDA tensors to give the backend.
    on_gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    assert attention_hook.split_unavailable(_backend(kv_indptr=on_gpu)) is None
    assert attention_hook.split_unavailable(_backend(kv_indptr=on_gpu, topk=4)) is None  # a second backend
    assert len(runs) == 1
    monkeypatch.setattr(attention_hook, "split_modes_agree", lambda *a: 1 / 0)
    assert attention_hook.split_unavailable(_backend(kv_indptr=on_gpu, num_head=8)).startswith(
        "its start-up check failed: ZeroDivisionError")


@pytest.mark.parametrize("ours, sglangs", [
    ("decode", "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd"),
    ("extend", "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd_unified"),
])
def test_the_wrappers_take_sglangs_arguments_by_position_and_name(routed, ours, sglangs):
    import importlib

    module, name = sglangs.rsplit(".", 1)
    theirs = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    make, _ = routed
    wrapper = dict(zip(("decode", "extend"), make()))[ours]
    mine = inspect.signature(inspect.unwrap(wrapper)).parameters
    positional = [n for n, p in mine.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in mine.values())
    # Each of SGLang's parameters binds to ours of the same name: at the same position where ours takes it
    # positionally, else by keyword (keyword-only, or passed on through **kwargs to the fallback).
    for position, pname in enumerate(theirs):
        if pname in positional:
            assert positional.index(pname) == position, (ours, pname)
        else:
            assert pname in mine or has_var_kw, (ours, pname)
    assert len(positional) <= len(theirs)


def test_split_is_a_bitwise_setting_read_from_the_environment():
    assert env_settings({DECODE_ATTENTION_ENV: "split"})["decode_attention"] == "split"
    assert logits_guarantee("triton", 1, decode_attention="split") == "bitwise"
    assert logits_guarantee("triton", 4, decode_attention="split") == "bitwise"  # trees too
    assert logits_guarantee("triton", 4, decode_attention="one_pass") == "tokens"
    from sglang_detspec.config import guarantee_and_reason

    assert env_settings({})["decode_attention"] == "split"  # the default
    assert guarantee_and_reason("triton", 4) == ("bitwise", None)
    assert "SGLANG_DETSPEC_DECODE_ATTENTION=split makes it bitwise" in guarantee_and_reason("triton", 4,
                                                                                            decode_attention="one_pass")[1]
    assert "DECODE_ATTENTION" not in guarantee_and_reason("flashinfer", 4)[1]
    assert logits_guarantee("triton", 1, decode_attention="sglang") == "tokens"
    assert logits_guarantee("fa3", 4, decode_attention="split") == "bitwise"  # the FA3 prefix / tail split
    assert logits_guarantee("fa3", 4, decode_attention="one_pass") == "tokens"  # SGLang's cascade
    # Under the split FA3's tail calls keep the causal kernel at every head size: no head-size rule.
    assert logits_guarantee("fa3", 1, decode_attention="split", head_dim=64) == "bitwise"
    assert logits_guarantee("fa3", 1, decode_attention="one_pass", head_dim=64) == "tokens"
    assert logits_guarantee("fa3", 4, decode_attention="split", page_size=16) == "tokens"
    # ... within FA3's head sizes and the split's tree size.
    assert logits_guarantee("fa3", 1, decode_attention="split", head_dim=512) == "tokens"
    assert logits_guarantee("fa3", 4, decode_attention="split", head_dim=256) == "bitwise"
    assert logits_guarantee("fa3", 4, decode_attention="split", num_draft_tokens=65) == "bitwise"
    assert logits_guarantee("fa3", 4, decode_attention="split", num_draft_tokens=66) == "tokens"
    # Where the split declines a large tree, the node path asked for serves it: its claim.
    assert logits_guarantee("fa3", 4, "nodes", "split", head_dim=128, num_draft_tokens=80) == "bitwise"
    assert logits_guarantee("fa3", 4, "nodes", "split", head_dim=64, num_draft_tokens=80) == "tokens"
    # Trees only where the kernels run: pages of one token, head sizes up to 256.
    assert logits_guarantee("triton", 4, decode_attention="split", page_size=16) == "tokens"
    assert logits_guarantee("triton", 4, decode_attention="split", head_dim=512) == "tokens"
    assert logits_guarantee("triton", 4, decode_attention="split", page_size=1, head_dim=256) == "bitwise"
    # A chain's one-pass pair at pages above one token: measured at one page size and head size, no rule; a tree
    # keeps its own reason.
    from sglang_detspec.config import guarantee_and_reason

    for decode, split_said in (("split", True), ("one_pass", False)):
        claim, why = guarantee_and_reason("triton", 1, decode_attention=decode, page_size=16)
        assert claim == "tokens" and why.startswith("a chain on triton with a KV page size of 16: measured only at pages "
                                                    "of 16 tokens on one head size")
        assert ("the positional split reads pages of one token" in why) is split_said
    claim, why = guarantee_and_reason("triton", 4, decode_attention="split", page_size=16)
    assert claim == "tokens" and "the split kernels read pages of 1 token" in why


def test_a_breadth_1_ngram_draft_is_claimed_as_the_tree_it_can_be():
    """SGLang pads a short n-gram match with root children, so breadth 1 is not always a path."""
    ngram = dict(deterministic=True, algorithm="NGRAM", eagle_topk=1, num_draft_tokens=8, attention_backend="triton")
    one_pass = DetSpecConfig(**ngram, decode_attention="one_pass")
    assert one_pass.logits == "tokens"
    assert one_pass.logits_reason.startswith("NGRAM at breadth 1 (a short match pads its draft with root children)")
    assert "top-k" not in one_pass.logits_reason
    assert DetSpecConfig(**ngram, decode_attention="split").logits == "bitwise"
    assert DetSpecConfig(**{**ngram, "eagle_topk": 1, "algorithm": "EAGLE"}).logits == "bitwise"


def test_a_tree_above_the_kernels_draft_bound_claims_tokens():
    big = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=8, num_draft_tokens=300,
                        attention_backend="triton", decode_attention="split")
    assert big.logits == "tokens" and "300 draft tokens" in big.logits_reason


def test_the_start_up_notes_say_what_the_split_s_measurements_cover():
    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend="triton",
                        decode_attention="split")
    notes = startup_notes.unmeasured_notes(bag)
    assert any("SGLANG_DETSPEC_DECODE_ATTENTION=split" in n and "0.97-1.13x" in n
               and "2026-12-06-h100-triton-split" in n for n in notes)
    fa3 = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend="fa3",
                        decode_attention="split")
    assert any("split on fa3" in n and "serving cost on the 8B shape" in n and "2026-12-05-h200-split" in n
               for n in startup_notes.unmeasured_notes(fa3))
    flashinfer = dataclasses.replace(fa3, attention_backend="flashinfer")
    assert not any("DECODE_ATTENTION=split" in n for n in startup_notes.unmeasured_notes(flashinfer))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
