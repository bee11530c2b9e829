"""What "speculative decoding on = off" holds down to, per server, and the Triton decode hook that makes chains bitwise.

The rule (``config.logits_guarantee``) is read from SGLang's real resolved
server arguments and published runtime context; the hook is installed on
SGLang's real ``TritonAttnBackend`` class (its constructor needs a GPU model
runner, so the instance carries only the attributes the hook reads, named as
SGLang's constructor names them). The kernel itself runs on the GPU
(``test/registered/cuda/test_decode_attention_cuda.py``); here the decode's
argument mapping is checked against a direct softmax attention with a torch
implementation of the extend kernel's contract standing in for the kernel.
"""

import dataclasses
import json
import sys

import pytest
from sglang.test.ci.ci_register import register_cpu_ci
import torch

from sglang_detspec.config import (DetSpecConfig, guarantee_and_reason, kv_cache_reason, logits_guarantee,
                                   reset_config)
from sglang_detspec.sglang_plugin.decode_attention import decode_as_extend
from sglang_detspec.sglang_plugin import attention_hook, resolve

register_cpu_ci(est_time=45, suite="detspec-unit-cpu")

CHAIN = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
TREE = "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"


@pytest.mark.parametrize("backend, topk, want", [
    ("triton", None, "bitwise"), ("triton", 1, "bitwise"), ("triton", 4, "bitwise"),
    ("fa3", 1, "bitwise"), ("fa3", 4, "bitwise"), ("flashinfer", 1, "tokens"), ("fa4", 1, "tokens"),
    ("fa3/triton", 1, "tokens"), (None, 1, "tokens"),
])
def test_logits_guarantee(backend, topk, want):
    """By default (the positional split) trees are bitwise on triton and fa3 as chains are."""
    assert logits_guarantee(backend, topk) == want


@pytest.mark.parametrize("backend, topk, want", [
    ("triton", 1, "bitwise"), ("triton", 4, "tokens"), ("fa3", 1, "bitwise"), ("fa3", 4, "tokens"),
])
def test_logits_guarantee_without_the_split(backend, topk, want):
    """The earlier paths (one_pass: Triton's one-pass decode, SGLang's FA3 calls): chains only."""
    assert logits_guarantee(backend, topk, decode_attention="one_pass") == want


def test_the_start_up_line_says_the_guarantee():
    line = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend="triton").describe()
    assert "logits='bitwise'" in line and "attention_backend='triton'" in line
    tree = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=4, attention_backend="triton")
    assert tree.logits == "bitwise" and tree.decode_attention == "split"
    assert dataclasses.replace(tree, decode_attention="one_pass").logits == "tokens"
    # Without speculative decoding a stale top-k flag does not matter.
    assert DetSpecConfig(deterministic=True, eagle_topk=4, attention_backend="fa3").logits == "bitwise"


def shown(**fields):
    return DetSpecConfig(deterministic=True, **fields).shown_fields()


def test_the_start_up_line_leaves_out_fields_that_do_not_apply():
    # Without speculative decoding: no verify mode, no draft shape, no tree setting.
    plain = shown(attention_backend="fa3", eagle_topk=4)
    assert not {"verify", "eagle_topk", "num_steps", "tree_attention", "rejection_sampling"} & plain.keys()
    assert plain["attention_backend"] == "fa3" and plain["kernel"] == "auto"
    # The decode setting applies to Triton's decode (also as the decode half of a pair) ...
    assert "decode_attention" in shown(algorithm="EAGLE", eagle_topk=1, attention_backend="triton")
    assert "decode_attention" in shown(algorithm="EAGLE", eagle_topk=1, attention_backend="fa3/triton")
    # ... and FA3's (its split setting, fa3_split_hook), not the other backends'.
    assert "decode_attention" in shown(algorithm="EAGLE", eagle_topk=1, attention_backend="fa3")
    for backend in ("fa4", "flashinfer"):
        assert "decode_attention" not in shown(algorithm="EAGLE", eagle_topk=1, attention_backend=backend)
    # The node path applies to FA3 trees only.
    assert shown(algorithm="EAGLE", eagle_topk=4, attention_backend="fa3")["tree_attention"] == "cascade"
    for backend, topk in (("fa3", 1), ("fa4", 4), ("triton", 4)):
        assert "tree_attention" not in shown(algorithm="EAGLE", eagle_topk=topk, attention_backend=backend)
    # Unknown until SGLang resolves them: kept.
    unknown = shown(algorithm="EAGLE")
    assert unknown["decode_attention"] == "split" and unknown["tree_attention"] == "cascade"
    # NGRAM: its top-k is its BFS breadth, and it has no draft model.
    ngram = shown(algorithm="NGRAM", eagle_topk=10, attention_backend="fa3")
    assert ngram["ngram_max_bfs_breadth"] == 10
    assert not {"eagle_topk", "multi_layer_eagle", "reduced_draft_vocab"} & ngram.keys()
    line = DetSpecConfig(deterministic=True, algorithm="NGRAM", eagle_topk=10, attention_backend="fa3").describe()
    assert "ngram_max_bfs_breadth=10" in line and "eagle_topk" not in line


def _server_args(model_dir, flags):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ["--model-path", model_dir, "--device", "cuda", "--speculative-draft-model-path", model_dir,
            "--enable-deterministic-inference", *flags.split()]
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    sa.resolve_once()
    return sa


@pytest.mark.parametrize("flags, backend, logits", [
    (f"{CHAIN} --attention-backend triton", "triton", "bitwise"),
    (f"{TREE} --attention-backend triton", "triton", "bitwise"),
    (f"{TREE} --attention-backend fa3", "fa3", "bitwise"),
    (f"{CHAIN} --attention-backend fa3", "fa3", "bitwise"),
    (f"{CHAIN} --attention-backend triton --prefill-attention-backend fa3", "fa3/triton", "tokens"),
    # Pages of more than one token: FA3's decode and prefill may tile keys apart; Triton's tile keys by index,
    # which argues for the same bits, measured at pages of 16 tokens on one head size only.
    (f"{CHAIN} --attention-backend fa3 --page-size 16", "fa3", "tokens"),
    (f"{CHAIN} --attention-backend triton --page-size 16", "triton", "tokens"),
    # A quantized KV cache: no exact path reads it and SGLang's descaled calls are not measured.
    (f"{CHAIN} --attention-backend fa3 --kv-cache-dtype fp8_e4m3", "fa3", "tokens"),
    (f"{TREE} --attention-backend triton --kv-cache-dtype fp8_e5m2", "triton", "tokens"),
    # An explicit bf16 KV cache: the FA3 paths take SGLang's default (auto) only, and no server has run it.
    (f"{CHAIN} --attention-backend triton --kv-cache-dtype bf16", "triton", "tokens"),
    (f"{TREE} --attention-backend fa3 --kv-cache-dtype bf16", "fa3", "tokens"),
    (f"{TREE} --attention-backend fa3 --kv-cache-dtype auto", "fa3", "bitwise"),
])
def test_the_bag_reads_the_resolved_attention_backend(model_dir, flags, backend, logits):
    reset_config()
    bag = resolve.config_from_server_args(_server_args(model_dir, flags))
    assert (bag.attention_backend, bag.logits) == (backend, logits)
    reset_config()


def test_a_tree_keeps_its_own_reason_at_a_small_head_size():
    """Without the split the head-size rule applies to what would be bitwise; a cascade tree's reason still
    names both ways out; with it (the default) FA3 trees are bitwise at every head size FA3 takes."""
    claim, reason = guarantee_and_reason("fa3", 4, "cascade", "one_pass", head_dim=64)
    assert claim == "tokens" and "SGLANG_DETSPEC_TREE_ATTENTION=nodes" in reason
    assert "SGLANG_DETSPEC_DECODE_ATTENTION=split" in reason
    claim, reason = guarantee_and_reason("fa3", 4, "nodes", "one_pass", head_dim=64)
    assert claim == "tokens" and "fa3 at head size 64" in reason
    assert guarantee_and_reason("fa3", 4, "nodes", "one_pass", head_dim=128) == ("bitwise", None)
    for head_dim in (64, 128, 256):
        assert guarantee_and_reason("fa3", 4, "cascade", head_dim=head_dim) == ("bitwise", None)
    claim, reason = guarantee_and_reason("fa3", 4, "cascade", head_dim=512)
    assert claim == "tokens" and "FA3 takes head sizes up to 256" in reason


@pytest.mark.parametrize("head_dim, backend, decode, logits", [
    (64, "fa3", "one_pass", "tokens"), (32, "fa3", "one_pass", "tokens"), (96, "fa3", "one_pass", "bitwise"),
    (128, "fa3", "one_pass", "bitwise"), (256, "fa3", "one_pass", "tokens"), (64, "triton", "one_pass", "bitwise"),
    (256, "triton", "one_pass", "bitwise"),
    # The prefix / tail split (the default) runs every FA3 call on the prefill's kernel, at every head size.
    (32, "fa3", "split", "bitwise"), (64, "fa3", "split", "bitwise"), (256, "fa3", "split", "bitwise"),
])
def test_an_fa3_chain_claims_bitwise_only_at_head_sizes_65_to_128(tmp_path, monkeypatch, head_dim, backend, decode,
                                                                  logits):
    """Without the split FA3 drops a decode call's causal flag at head sizes up to 64 (measured apart) and above
    128 (not measured)."""
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", decode)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4 * head_dim,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 1000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    reset_config()
    bag = resolve.config_from_server_args(_server_args(str(tmp_path), f"{CHAIN} --attention-backend {backend}"))
    assert (bag.head_dim, bag.logits) == (head_dim, logits)
    assert (f"head_dim={head_dim}" in bag.describe()) is (backend == "fa3")  # shown where the rule reads it
    if logits == "tokens":
        assert f"fa3 at head size {head_dim}" in bag.logits_reason and "Triton chains" in bag.logits_reason
    reset_config()


def test_the_runtime_context_bag_reads_the_attention_backend(model_dir):
    from sglang.srt.runtime_context import publish

    reset_config()
    publish(_server_args(model_dir, f"{CHAIN} --attention-backend triton"), role="test")
    bag = resolve.config_from_runtime_context()
    assert (bag.source, bag.attention_backend, bag.logits) == ("runtime_context", "triton", "bitwise")
    reset_config()


def test_the_runtime_context_bag_reads_the_page_size(model_dir):
    from sglang.srt.runtime_context import publish

    reset_config()
    publish(_server_args(model_dir, f"{CHAIN} --attention-backend fa3 --page-size 16"), role="test")
    bag = resolve.config_from_runtime_context()
    assert (bag.attention_backend, bag.page_size, bag.logits) == ("fa3", 16, "tokens")
    reset_config()


def test_the_runtime_context_bag_reads_the_kv_cache_dtype(model_dir):
    from sglang.srt.runtime_context import publish

    reset_config()
    publish(_server_args(model_dir, f"{TREE} --attention-backend fa3 --kv-cache-dtype fp8_e4m3"), role="test")
    bag = resolve.config_from_runtime_context()
    assert (bag.kv_cache_dtype, bag.logits) == ("fp8_e4m3", "tokens")
    assert "--kv-cache-dtype fp8_e4m3: the plugin's exact" in bag.logits_reason
    assert "kv_cache_dtype='fp8_e4m3'" in bag.describe()
    reset_config()


@pytest.mark.parametrize("dtype, reason", [(None, False), ("auto", False), ("bf16", True), ("bfloat16", True),
                                           ("fp8_e4m3", True), ("fp8_e5m2", True), ("mxfp8", True), ("nvfp4", True)])
def test_only_the_default_kv_cache_keeps_the_claim(dtype, reason):
    assert (kv_cache_reason(dtype) is not None) is reason
    want = "tokens" if reason else "bitwise"
    for backend, topk in (("fa3", 1), ("fa3", 4), ("triton", 1), ("triton", 4)):
        assert logits_guarantee(backend, topk, kv_cache_dtype=dtype) == want, (backend, topk)
    # A claim already 'tokens' keeps the reason of the rule that applied first.
    assert "flashinfer attention" in guarantee_and_reason("flashinfer", 1, kv_cache_dtype=dtype)[1]
    shown = "kv_cache_dtype" in DetSpecConfig(deterministic=True, kv_cache_dtype=dtype).describe()
    assert shown is reason


def test_fa3_pages_of_one_token_keep_the_bitwise_claim():
    assert logits_guarantee("fa3", 1, page_size=1) == logits_guarantee("fa3", 1, page_size=None) == "bitwise"
    assert logits_guarantee("fa3", 4, "nodes", page_size=64) == "tokens"


# SGLang resolves each algorithm's top-k its own way: NGRAM's is --speculative-ngram-max-bfs-breadth
# (10 by default, whatever --speculative-eagle-topk says), STANDALONE left unset gets a chain, NEXTN is EAGLE.
# The claims without the split (one_pass); with it (the default) every one of these is bitwise on triton.
RESOLVED_CLAIMS = [
    (CHAIN, 1, "bitwise"),
    (TREE, 4, "tokens"),
    (CHAIN.replace("EAGLE", "NEXTN"), 1, "bitwise"),
    ("--speculative-algorithm NGRAM", 10, "tokens"),
    ("--speculative-algorithm NGRAM --speculative-eagle-topk 1", 10, "tokens"),
    # Breadth 1 is still a tree: SGLang pads a short match with children of the root.
    ("--speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 1", 1, "tokens"),
    ("--speculative-algorithm STANDALONE", 1, "bitwise"),
    (TREE.replace("EAGLE", "STANDALONE"), 4, "tokens"),
]


@pytest.mark.parametrize("decode", ["one_pass", "split"])
@pytest.mark.parametrize("flags, topk, one_pass_logits", RESOLVED_CLAIMS, ids=[c[0] for c in RESOLVED_CLAIMS])
def test_start_up_and_the_dry_run_claim_what_sglang_resolves(model_dir, capsys, monkeypatch, flags, topk,
                                                            one_pass_logits, decode):
    from sglang.srt.arg_groups.overrides import resolved_view

    from sglang_detspec.cli.main import main

    for name in ("SGLANG_PLUGINS", "SGLANG_DETSPEC_DISABLE", "SGLANG_DETSPEC_VERIFY", "SGLANG_DETSPEC_TREE_ATTENTION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", decode)
    logits = one_pass_logits if decode == "one_pass" else "bitwise"
    flags = f"{flags} --attention-backend triton"
    reset_config()
    record = _server_args(model_dir, flags)
    view = resolved_view(record)
    sglang_topk, sglang_backend = view.speculative_eagle_topk, resolve.attention_backend_of(view)
    assert (sglang_topk, sglang_backend) == (topk, "triton")
    bag = resolve.config_from_server_args(record)  # what the start-up hook installs and logs
    assert bag.active and bag.eagle_topk == sglang_topk
    assert bag.logits == logits
    if "NGRAM" not in flags:
        assert logits_guarantee(sglang_backend, sglang_topk, decode_attention=decode) == logits
    assert main(["serve", "--dry-run", "--verbose", "--", "--model-path", model_dir, "--device", "cuda",
                 "--speculative-draft-model-path", model_dir, *flags.split()]) == 0
    passed = [line for line in capsys.readouterr().err.splitlines() if "flags check passed" in line]
    assert len(passed) == 1 and f"logits={logits!r}" in passed[0]
    reset_config()


def test_the_dry_run_says_when_sglang_picks_the_tree_shape(model_dir, capsys, monkeypatch):
    from sglang_detspec.cli.main import main

    for name in ("SGLANG_PLUGINS", "SGLANG_DETSPEC_DISABLE", "SGLANG_DETSPEC_VERIFY", "SGLANG_DETSPEC_TREE_ATTENTION"):
        monkeypatch.delenv(name, raising=False)
    flags = "--speculative-algorithm EAGLE --attention-backend triton"
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "one_pass")  # where a tree claims less than a chain
    reset_config()
    # The tiny model is a Llama: SGLang gives it a tree at start-up, so the server claims 'tokens' ...
    assert resolve.config_from_server_args(_server_args(model_dir, flags)).logits == "tokens"
    reset_config()
    # ... which the flags alone do not tell; SGLang's own resolution, run by the dry run on the model's config,
    # gives the tree, and the dry run describes that server, as start-up reads it.
    assert main(["serve", "--dry-run", "--verbose", "--", "--model-path", model_dir, *flags.split()]) == 0
    err = capsys.readouterr().err
    (note,) = [line for line in err.splitlines() if "SGLang resolves these flags to" in line]
    assert "--speculative-eagle-topk 4" in note and "the line below describes that server" in note
    (passed,) = [line for line in err.splitlines() if "flags check passed" in line]
    assert "eagle_topk=4" in passed and "logits='tokens'" in passed
    # Where SGLang's resolution cannot run here (no local model folder), the note says what the claim assumes.
    reset_config()
    assert main(["serve", "--dry-run", "--verbose", "--", "--model-path", "org/model", *flags.split()]) == 0
    assert "the logits claim above assumes a chain" in capsys.readouterr().err


def test_the_dry_run_says_ngram_and_standalone_are_not_measured(model_dir, capsys, monkeypatch):
    from sglang_detspec.cli.main import main

    for name in ("SGLANG_PLUGINS", "SGLANG_DETSPEC_DISABLE", "SGLANG_DETSPEC_VERIFY", "SGLANG_DETSPEC_TREE_ATTENTION"):
        monkeypatch.delenv(name, raising=False)
    for algorithm, noted in (("NGRAM", True), ("EAGLE", False)):
        reset_config()
        flags = ["--speculative-algorithm", algorithm, "--attention-backend", "triton", "--speculative-eagle-topk", "1",
                 "--speculative-num-steps", "3"]
        extra = ["--speculative-draft-model-path", model_dir] if algorithm == "EAGLE" else []
        assert main(["serve", "--dry-run", "--verbose", "--", "--model-path", model_dir, *extra, *flags]) == 0
        assert ("has not yet run on a server" in capsys.readouterr().err) == noted
    reset_config()


# -- the decode hook ----------------------------------------------------------------


def extend_contract(q, o, k_buffer, v_buffer, k_scale, v_scale, qo_indptr, kv_indptr, kv_indices, prefix_lens,
                    max_len_extend, custom_mask=None, mask_indptr=None, sm_scale=None, logit_cap=0.0, is_causal=True,
                    **kwargs):
    """The unified extend kernel's contract in torch: query j of request b sees keys < prefix_len + j + 1.

    With ``custom_mask`` (uint8, request b's rows flattened from ``mask_indptr[b]``, one entry per key):
    the keys its row marks.
    """
    for b in range(qo_indptr.numel() - 1):
        keys = kv_indices[kv_indptr[b]:kv_indptr[b + 1]].long()
        for j in range(int(qo_indptr[b + 1] - qo_indptr[b])):
            row = int(qo_indptr[b]) + j
            visible = keys[:int(prefix_lens[b]) + j + 1] if is_causal else keys
            if custom_mask is not None:
                at = int(mask_indptr[b]) + j * len(keys)
                visible = keys[custom_mask[at:at + len(keys)].bool()]
            group = q.shape[1] // k_buffer.shape[1]
            k = k_buffer[visible].float().repeat_interleave(group, dim=1)
            v = v_buffer[visible].float().repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,nhd->hn", q[row].float(), k) * sm_scale * k_scale
            o[row] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v * v_scale).to(o.dtype)
    return o


def test_decode_as_extend_attends_to_every_key_of_each_request():
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, slots = 4, 2, 16, 64
    k = torch.randn(slots, kv_heads, dim, generator=gen)
    v = torch.randn(slots, kv_heads, dim, generator=gen)
    lengths = [1, 5, 17]
    order = torch.randperm(slots, generator=gen).to(torch.int32)
    indptr = torch.tensor([0, 1, 6, 23, 23], dtype=torch.int32)  # one spare entry, like SGLang's max-size buffer
    q = torch.randn(len(lengths), heads, dim, generator=gen)
    o = torch.empty_like(q)
    rows = torch.arange(8)
    decode_as_extend(extend_contract, rows, q, k, v, o, indptr, order, 0.25, 1.0, 1.0)
    for b, n in enumerate(lengths):
        keys = order[indptr[b]:indptr[b] + n].long()
        kk, vv = k[keys].repeat_interleave(2, dim=1), v[keys].repeat_interleave(2, dim=1)
        want = torch.einsum("hn,nhd->hd", (torch.einsum("hd,nhd->hn", q[b], kk) * 0.25).softmax(-1), vv)
        torch.testing.assert_close(o[b], want)


def _backend(**attrs):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = object.__new__(TritonAttnBackend)
    # The attributes TritonAttnBackend.__init__ sets and the hook reads (triton_backend.py:188-411).
    values = dict(enable_deterministic=True, is_draft_runner=False, use_mla=False, dcp_size=1,
                  kv_indptr=torch.zeros(9, dtype=torch.int32), decode_attention_fwd="sglang's decode",
                  extend_attention_fwd_unified=extend_contract)
    values.update(attrs)
    for name, value in values.items():
        setattr(backend, name, value)
    return backend


@pytest.mark.parametrize("attrs, replaced", [
    ({}, True),
    ({"is_draft_runner": True}, False),
    ({"use_mla": True}, True),  # _mla_one_pass: SGLang's absorbed MLA extend kernel serves its decode too
    ({"dcp_size": 2}, False),
    ({"enable_deterministic": False}, False),
])
def test_the_hook_replaces_only_the_target_backends_decode(monkeypatch, attrs, replaced):
    from sglang_detspec import config

    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, attention_backend="triton",
                                                                 decode_attention="one_pass"))
    backend = _backend(**attrs)
    attention_hook.use_one_pass_decode(None, backend)
    assert (backend.decode_attention_fwd != "sglang's decode") is replaced


@pytest.mark.parametrize("setting", ["split", "one_pass"])
def test_an_mla_targets_decode_runs_the_absorbed_extend_kernel(monkeypatch, setting):
    """MLA: the latent cache as one KV head (kv_lora_rank + rope dims), the value its first kv_lora_rank dims."""
    from sglang_detspec import config

    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend="triton",
                        decode_attention=setting, model_family="mla+moe")
    monkeypatch.setattr(config, "_current", bag)
    backend = _backend(use_mla=True)
    attention_hook.use_one_pass_decode(None, backend)
    # The positional split takes no MLA shape: the bag states the one-pass decode that serves.
    assert config.current_config().decode_attention == "one_pass"
    # The family's claim is its attention's on triton, measured there (model_family.MEASURED_BITWISE).
    assert config.current_config().logits == "bitwise"
    gen = torch.Generator().manual_seed(1)
    heads, rank, rope, slots = 4, 32, 8, 40
    latent = torch.randn(slots, 1, rank + rope, generator=gen)
    q = torch.randn(2, heads, rank + rope, generator=gen)
    o = torch.empty(2, heads, rank)
    indptr = torch.tensor([0, 3, 10], dtype=torch.int32)
    indices = torch.randperm(slots, generator=gen)[:10].to(torch.int32)
    backend.decode_attention_fwd(q, latent, latent[..., :rank], o, indptr, indices, None, None, None, 1, 0.1, 1.0,
                                 1.0, logit_cap=0.0, sinks=None, xai_temperature_len=-1, has_mla=True, page_size=1)
    for b in range(2):
        keys = latent[indices[indptr[b]:indptr[b + 1]].long(), 0]
        want = ((q[b] @ keys.T) * 0.1).softmax(-1) @ keys[:, :rank]
        torch.testing.assert_close(o[b], want)


@pytest.mark.parametrize("topk, dropped", [(1, True), (0, False)])
def test_an_mla_chain_verify_runs_the_kernels_causal_path(monkeypatch, topk, dropped):
    """A chain's verify mask marks what the causal rule marks: the MLA target's kernel gets no mask, same rows.

    ``topk`` 0: no speculative decoding (SGLang's ``speculative_eagle_topk or 0``), the extend is SGLang's.
    """
    from sglang_detspec import config

    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, attention_backend="triton",
                                                          model_family="mla+moe"))
    masks_seen = []

    def kernel(*args, custom_mask=None, **kwargs):
        masks_seen.append(custom_mask)
        return extend_contract(*args, custom_mask=custom_mask, **kwargs)

    # NGRAM's breadth-1 drafts are trees under top-k 1: their mask is kept. Start-up refuses NGRAM on an MLA
    # target it can read; one whose config was unreadable (family unknown) reaches the hook active.
    ngram_bag = DetSpecConfig(deterministic=True, attention_backend="triton", algorithm="NGRAM", eagle_topk=1)
    assert ngram_bag.active
    monkeypatch.setattr(config, "_current", ngram_bag)
    ngram = _backend(use_mla=True, topk=1, extend_attention_fwd_unified=kernel)
    attention_hook.use_one_pass_decode(None, ngram)
    assert ngram.extend_attention_fwd_unified is kernel and ngram.decode_attention_fwd != "sglang's decode"
    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, attention_backend="triton",
                                                          model_family="mla+moe"))
    backend = _backend(use_mla=True, topk=topk, extend_attention_fwd_unified=kernel)
    attention_hook.use_one_pass_decode(None, backend)
    assert (backend.extend_attention_fwd_unified is not kernel) is dropped
    gen = torch.Generator().manual_seed(2)
    heads, rank, rope, slots, draft = 4, 32, 8, 40, 4
    latent = torch.randn(slots, 1, rank + rope, generator=gen)
    prefixes = [3, 9]
    q = torch.randn(draft * len(prefixes), heads, rank + rope, generator=gen)
    lengths = [p + draft for p in prefixes]
    kv_indptr = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    indices = torch.randperm(slots, generator=gen)[:sum(lengths)]
    # SGLang's chain verify mask: every prefix key, then the draft tokens up to the row's own.
    rows = [torch.cat([torch.ones(draft, p, dtype=torch.uint8), torch.tril(torch.ones(draft, draft)).to(torch.uint8)],
                      dim=1).flatten() for p in prefixes]
    mask = torch.cat(rows)
    mask_indptr = torch.tensor([0, *torch.tensor([r.numel() for r in rows]).cumsum(0).tolist()])
    qo_indptr = torch.arange(0, draft * len(prefixes) + 1, draft)
    args = (latent, latent[..., :rank], 1.0, 1.0, qo_indptr, kv_indptr, indices, torch.tensor(prefixes), draft)
    got = backend.extend_attention_fwd_unified(q, torch.empty(len(q), heads, rank), *args, custom_mask=mask,
                                               mask_indptr=mask_indptr, sm_scale=0.1, is_causal=True)
    assert (masks_seen[-1] is None) is dropped
    want = extend_contract(q, torch.empty(len(q), heads, rank), *args, custom_mask=mask, mask_indptr=mask_indptr,
                           sm_scale=0.1)
    torch.testing.assert_close(got, want)
    # A window keeps its mask (not a plain causal call).
    backend.extend_attention_fwd_unified(q, torch.empty(len(q), heads, rank), *args, custom_mask=mask,
                                         mask_indptr=mask_indptr, sm_scale=0.1, is_causal=True, sliding_window_size=4)
    assert masks_seen[-1] is mask


def test_an_mla_target_keeps_sglangs_decode_when_told(monkeypatch):
    from sglang_detspec import config

    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, attention_backend="triton",
                                                          decode_attention="sglang", model_family="mla+moe"))
    backend = _backend(use_mla=True)
    attention_hook.use_one_pass_decode(None, backend)
    assert backend.decode_attention_fwd == "sglang's decode"


def test_the_replaced_decode_hands_grok_temperature_layers_to_sglang(monkeypatch):
    from sglang_detspec import config

    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, attention_backend="triton",
                                                                 decode_attention="one_pass"))
    calls = []
    backend = _backend(decode_attention_fwd=lambda *a, **k: calls.append((a, k)))
    attention_hook.use_one_pass_decode(None, backend)
    q = torch.zeros(1, 2, 4)
    args = (q, torch.zeros(4, 2, 4), torch.zeros(4, 2, 4), torch.empty_like(q), torch.tensor([0, 1]),
            torch.tensor([0]), None, None, None, 1, 0.5, 1.0, 1.0)
    backend.decode_attention_fwd(*args, logit_cap=0.0, sinks=None, xai_temperature_len=8, has_mla=False, page_size=1)
    assert len(calls) == 1 and calls[0][1]["has_mla"] is False
    backend.decode_attention_fwd(*args, logit_cap=0.0, sinks=None, xai_temperature_len=-1, has_mla=False, page_size=1)
    assert len(calls) == 1  # the single-pass kernel ran (the torch contract above), not SGLang's decode


def test_the_packed_decode_serves_only_the_shapes_its_start_up_check_ran(monkeypatch):
    """A layer whose head dims, head counts or KV dtype differ from the checked first layer takes the one-row path."""
    from sglang_detspec import config

    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, attention_backend="triton",
                                                                 decode_attention="one_pass"))
    packed_calls = []
    monkeypatch.setattr(attention_hook, "_packed_kernel",
                        lambda backend, unified: ("kernel", "blocks", (2, 2, 4, 4, torch.float32)))
    monkeypatch.setattr(attention_hook, "decode_packed", lambda *a, **k: packed_calls.append(a[3].shape))
    backend = _backend()
    attention_hook.use_one_pass_decode(None, backend)

    def call(heads, dim, kv_dtype=torch.float32, **kw):
        q = torch.randn(1, heads, dim)
        kv = torch.randn(4, 2, dim).to(kv_dtype)
        backend.decode_attention_fwd(q, kv, kv, torch.empty_like(q), torch.tensor([0, 2], dtype=torch.int32),
                                     torch.tensor([1, 3]), None, None, None, 1, 0.5, 1.0, 1.0, **kw)

    call(2, 4)
    assert packed_calls == [(1, 2, 4)]
    call(2, 8)  # another head dim
    call(4, 4)  # another head count
    call(2, 4, torch.float16)  # another KV dtype
    call(2, 4, sinks=torch.zeros(2))  # sinks index query heads
    call(2, 4, logit_cap=30.0)  # a soft cap the start-up check did not run
    assert packed_calls == [(1, 2, 4)]


def test_the_hook_says_when_a_model_is_only_tokens(monkeypatch, caplog):
    from sglang_detspec import config

    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, attention_backend="triton",
                                                                 decode_attention="one_pass"))
    with caplog.at_level("WARNING", logger="sglang_detspec"):
        attention_hook.use_one_pass_decode(None, _backend(dcp_size=2))
        attention_hook.use_one_pass_decode(None, _backend(sliding_window_size=4096))
    assert sum("'tokens', not 'bitwise'" in r.getMessage() for r in caplog.records) == 2


def test_decode_attention_sglang_keeps_sglangs_split_kv_decode_and_claims_tokens(monkeypatch, caplog):
    from sglang_detspec import config

    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend="triton",
                        decode_attention="sglang")
    monkeypatch.setattr(config, "_current", bag)
    backend = _backend()
    with caplog.at_level("WARNING", logger="sglang_detspec"):
        attention_hook.use_one_pass_decode(None, backend)
    assert backend.decode_attention_fwd == "sglang's decode"
    assert any("SGLANG_DETSPEC_DECODE_ATTENTION=sglang" in r.getMessage() for r in caplog.records)
    assert bag.logits == "tokens" and "logits='tokens'" in bag.describe()
    # FA3 has no decode hook: the setting leaves its claim alone.
    assert logits_guarantee("fa3", 1, decode_attention="sglang") == "bitwise"
    assert logits_guarantee("triton", None, decode_attention="one_pass") == "bitwise"


@pytest.mark.parametrize("value, want", [(None, "split"), ("sglang", "sglang"), ("ONE_PASS", "one_pass"),
                                         ("split", "split")])
def test_decode_attention_setting_is_read_from_the_environment(value, want):
    from sglang_detspec.config import DECODE_ATTENTION_ENV, env_settings

    env = {} if value is None else {DECODE_ATTENTION_ENV: value}
    assert env_settings(env)["decode_attention"] == want


def test_a_bad_decode_attention_setting_is_named():
    from sglang_detspec.config import DECODE_ATTENTION_ENV, env_settings

    with pytest.raises(ValueError, match="SGLANG_DETSPEC_DECODE_ATTENTION must be one of"):
        env_settings({DECODE_ATTENTION_ENV: "split_kv"})


def test_an_inactive_line_claims_nothing():
    assert "logits=" not in DetSpecConfig(deterministic=False, attention_backend="triton").describe()


def test_the_hook_keeps_sglangs_decode_when_the_run_is_not_ours(monkeypatch):
    from sglang_detspec import config

    monkeypatch.setattr(config, "_current", DetSpecConfig(deterministic=True, disabled=True))
    backend = _backend()
    attention_hook.use_one_pass_decode(None, backend)
    assert backend.decode_attention_fwd == "sglang's decode"


def test_the_hook_is_in_the_table_and_required():
    from sglang_detspec import sglang_plugin

    rows = [r for r in sglang_plugin.hook_table() if r.target == attention_hook.TARGET]
    assert len(rows) == 1 and rows[0].kind == "AFTER" and rows[0].absent_ok is None


@pytest.mark.parametrize("backend", [None, "fa3", "triton", "flashinfer", "fa4", "fa3/triton", "trtllm_mha"])
@pytest.mark.parametrize("topk", [None, 1, 4])
@pytest.mark.parametrize("tree_attention", ["cascade", "nodes"])
@pytest.mark.parametrize("decode_attention", ["one_pass", "sglang", "split"])
@pytest.mark.parametrize("page_size", [None, 1, 16])
def test_every_tokens_claim_has_a_reason_and_every_bitwise_claim_none(backend, topk, tree_attention,
                                                                     decode_attention, page_size):
    from sglang_detspec.config import guarantee_and_reason

    claim, reason = guarantee_and_reason(backend, topk, tree_attention, decode_attention, page_size)
    assert claim == logits_guarantee(backend, topk, tree_attention, decode_attention, page_size)
    assert (reason is None) == (claim == "bitwise"), (claim, reason)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
