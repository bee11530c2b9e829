"""Coupled verify wired into the real SGLang 0.5.23, on CPU.

Real ``ServerArgs`` resolved by SGLang give the bag (coupled / rejection /
auto, with and without speculative decoding); SGLang's own ``Sampler``
draws the non-speculative tokens through our hooks; the verify hooks are
called with SGLang's tensor layouts (a hand-built tree in the layout of
``build_tree_kernel_efficient``, whose kernel has no CPU build here) and
SGLang's own ``LogitsProcessorOutput`` / ``SamplingBatchInfo``. The oracle
for every token is the TARGET race of DESIGN section 5 computed independently
(``exponential_race`` over ``torch.softmax(logits / T)`` at the absolute
position), and the spec-on / spec-off check compares the verify's emitted
tokens with the tokens SGLang's sampler draws for the same logits and positions.
"""

import argparse
import logging
import types

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import (ENV_PREFIX, DetSpecConfig, current_config, env_settings, install_config,
                                   reset_config, unknown_env_names)
from sglang_detspec.ops import Stream, coupled_verify_tree, exponential_race
from sglang_detspec.ops.verify_outputs import write_verify_outputs
from sglang_detspec.sglang_plugin import draft_hook, resolve, startup_notes, verify_hook
from sglang_detspec.sglang_plugin.verify_hook import VerifyContext

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

COUPLED = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                        verify="coupled", source="server_args")
COUPLED_DRAFTS = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4,
                               rejection_sampling=True, verify="coupled", source="server_args")


@pytest.fixture(scope="module")
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    yield
    reset_config()


def server_args(model_dir, flags: str):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    # --device cuda resolves without touching a GPU; triton attention is what
    # deterministic inference accepts.
    argv = ["--model-path", model_dir, "--device", "cuda", "--attention-backend", "triton", *flags.split()]
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    sa.resolve_once()
    return sa


# -- the bag from real ServerArgs ---------------------------------------------------

DET = "--enable-deterministic-inference"
CHAIN = "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
TREE = "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"


def eagle(model_dir, shape):
    return f"--speculative-algorithm EAGLE --speculative-draft-model-path {model_dir} {shape}"


@pytest.mark.parametrize("flags, env, expect", [
    (DET, "", dict(algorithm=None, verify="coupled", coupled_drafts=False)),
    (f"{{eagle_chain}} {DET}", "", dict(algorithm="EAGLE", eagle_topk=1, verify="coupled", coupled_drafts=True)),
    (f"{{eagle_tree}} {DET}", "", dict(algorithm="EAGLE", eagle_topk=4, num_draft_tokens=8, verify="coupled")),
    (f"{{eagle_chain}} --speculative-use-rejection-sampling {DET}", "", dict(verify="rejection")),
    (f"{{eagle_chain}} --speculative-use-rejection-sampling {DET}", "auto", dict(verify="rejection")),
    (f"{{eagle_chain}} --speculative-use-rejection-sampling {DET}", "coupled",
     dict(verify="coupled", rejection_sampling=True, coupled_drafts=True)),
    (f"{{eagle_tree}} {DET}", "coupled", dict(verify="coupled", eagle_topk=4)),
])
def test_active_bag_and_verify_mode(loaded, model_dir, monkeypatch, flags, env, expect):
    if env:
        monkeypatch.setenv("SGLANG_DETSPEC_VERIFY", env)
    flags = flags.format(eagle_chain=eagle(model_dir, CHAIN), eagle_tree=eagle(model_dir, TREE))
    reset_config()
    bag = resolve.config_from_server_args(server_args(model_dir, flags))
    assert bag.active, bag.refusals()
    for field, value in expect.items():
        assert getattr(bag, field) == value, field
    assert current_config() == bag  # SGLang's resolution ran our AFTER hook
    reset_config()


def test_adaptive_chain_resolves_sglang_candidate_steps(loaded, model_dir, tmp_path):
    """--speculative-adaptive: the bag carries SGLang's own candidate step counts (its default table, or the
    config file), the start-up notes say what ran and that the serving cost is not measured; a tree has SGLang turn
    it off."""
    from sglang.srt.speculative.adaptive_spec_params import DEFAULT_ADAPTIVE_CONFIG

    default = sorted({s for slot in DEFAULT_ADAPTIVE_CONFIG.values() for s in slot["candidate_steps"]})
    bag = resolve.config_from_server_args(server_args(model_dir, f"{eagle(model_dir, CHAIN)} --speculative-adaptive {DET}"))
    assert bag.active and bag.adaptive_steps == tuple(default) and 3 in bag.adaptive_steps
    assert any("--speculative-adaptive" in note and "serving cost is not measured" in note
               for note in startup_notes.unmeasured_notes(bag))
    custom = tmp_path / "adaptive.json"
    custom.write_text('{"1": {"candidate_steps": [1, 3]}, "16": {"candidate_steps": [2, 3]}}')
    bag = resolve.config_from_server_args(server_args(
        model_dir, f"{eagle(model_dir, CHAIN)} --speculative-adaptive --speculative-adaptive-config {custom} {DET}"))
    assert bag.adaptive_steps == (1, 2, 3)
    tree = resolve.config_from_server_args(server_args(model_dir, f"{eagle(model_dir, TREE)} --speculative-adaptive {DET}"))
    assert tree.adaptive_steps == () and not any("adaptive" in n for n in startup_notes.unmeasured_notes(tree))
    plain = resolve.config_from_server_args(server_args(model_dir, f"{eagle(model_dir, CHAIN)} {DET}"))
    assert plain.adaptive_steps == () and "adaptive_steps" in plain.shown_fields()
    reset_config()


@pytest.mark.parametrize("flag, way_out", [
    (True, "drop --speculative-use-rejection-sampling (with SGLANG_DETSPEC_VERIFY unset or coupled: coupled verify "
           "serves trees)"),
    (False, "set SGLANG_DETSPEC_VERIFY=coupled or unset it (coupled verify serves trees)"),
])
def test_the_tree_refusal_names_what_asked_for_rejection_mode(flag, way_out):
    bag = DetSpecConfig(deterministic=True, verify="rejection", rejection_sampling=flag, algorithm="EAGLE",
                        num_steps=3, eagle_topk=4, num_draft_tokens=8)
    tree = [r for r in bag.refusals() if r.code == "rejection_tree"]
    assert len(tree) == 1 and tree[0] == ("--speculative-eagle-topk 4 drafts a tree; rejection mode verifies chains "
                                          f"only: set --speculative-eagle-topk 1, or {way_out}")
    # The flag it would have you drop is named only where it was given.
    assert ("--speculative-use-rejection-sampling" in tree[0]) == flag


def test_not_ours_without_deterministic_inference(loaded, model_dir):
    bag = resolve.config_from_server_args(server_args(model_dir, eagle(model_dir, TREE)))
    assert not bag.ours and not bag.active and bag.refusals() == []
    reset_config()


@pytest.mark.parametrize("flags, env, code", [
    (f"{{eagle_tree}} --speculative-use-rejection-sampling {DET}", "", "rejection_tree"),
    (f"{{eagle_chain}} {DET}", "rejection", "rejection_needs_flag"),
    (f"--speculative-algorithm EAGLE --speculative-draft-model-path {{model}} --speculative-use-rejection-sampling {DET}",
     "", "rejection_chain_unset"),
])
def test_rejection_mode_refusals(loaded, model_dir, monkeypatch, flags, env, code):
    if env:
        monkeypatch.setenv("SGLANG_DETSPEC_VERIFY", env)
    flags = flags.format(eagle_chain=eagle(model_dir, CHAIN), eagle_tree=eagle(model_dir, TREE), model=model_dir)
    with pytest.raises(ValueError, match="sglang-detspec cannot make this run deterministic") as err:
        server_args(model_dir, flags)
    # Matched by its stable code, which the message also carries; the wording is free to change.
    assert err.value.codes == [code] and f"[refusal: {code}]" in str(err.value)
    assert "(rejection verify)" in str(err.value)
    reset_config()


def test_every_refusal_carries_a_code():
    bags = [
        DetSpecConfig(deterministic=True, algorithm="UNO", eagle_topk=1),
        DetSpecConfig(deterministic=True, rl_on_policy=True, tokenizer_workers=2, block_verification=True),
        DetSpecConfig(deterministic=True, verify="rejection", algorithm="NGRAM", eagle_topk=4),
        DetSpecConfig(deterministic=True, verify="rejection", algorithm="EAGLE3", reduced_draft_vocab=True),
    ]
    codes = [r.code for bag in bags for r in bag.refusals()]
    assert codes == ["algorithm_not_covered", "rl_on_policy", "tokenizer_workers", "block_verification",
                     "rejection_needs_flag", "rejection_algorithm", "rejection_tree", "reduced_draft_vocab"]


def test_bad_verify_setting_names_the_variable(loaded, model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_VERIFY", "tree")
    with pytest.raises(ValueError, match=r"SGLANG_DETSPEC_VERIFY must be one of auto, coupled or rejection,"):
        server_args(model_dir, DET)
    reset_config()


def test_a_misspelled_setting_is_refused_with_the_nearest_name(loaded, model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_VERIFYY", "rejection")
    with pytest.raises(ValueError, match=r"^SGLANG_DETSPEC_VERIFYY is not a setting of sglang-detspec \(did you "
                                         r"mean SGLANG_DETSPEC_VERIFY\? its settings: SGLANG_DETSPEC_KERNEL, "):
        server_args(model_dir, DET)
    reset_config()


@pytest.mark.parametrize("name, meant", [
    ("SGLANG_DETPSEC_VERIFY", "SGLANG_DETSPEC_VERIFY"),  # letters of the prefix swapped
    ("SGLNAG_DETSPEC_VERIFY", "SGLANG_DETSPEC_VERIFY"),  # ... in SGLANG_ too
    ("SGLAN_DETSPEC_VERIFY", "SGLANG_DETSPEC_VERIFY"),  # a letter left out
    ("SGLANGDETSPEC_VERIFY", "SGLANG_DETSPEC_VERIFY"),
    ("SGL_DETSPEC_VERIFY", "SGLANG_DETSPEC_VERIFY"),  # SGLang's older SGL_ spelling
    ("SGLANG_DETSPEC_verify", "SGLANG_DETSPEC_VERIFY"),  # the setting's part in lower case
    ("DETSPEC_VERIFY", "SGLANG_DETSPEC_VERIFY"),  # the prefix without SGLANG_
    ("sglang_detspec_tree_attention", "SGLANG_DETSPEC_TREE_ATTENTION"),  # lower case
])
def test_a_setting_with_its_prefix_misspelt_is_refused_too(name, meant):
    with pytest.raises(ValueError, match=rf"^{name} is not a setting of sglang-detspec \(did you mean {meant}\?"):
        env_settings({name: "rejection"})


def test_variables_of_other_programs_are_not_taken_for_settings():
    # The E2E suites' and benchmarks' DETSPEC_*_ names, even ending in a setting's suffix, and others.
    env = {"SGLANG_DETERMINISTIC": "1", "SGLANG_DISABLE_LEAN_ATTENTION": "1", "DETSPEC_E2E_SERVER_ARGS": "--x",
           "DETSPEC_E2E_BACKENDS": "fa3", "DETSPEC_E2E_VERIFY": "x", "DETSPEC_E2E_TREE_ATTENTION": "x",
           "DETSPEC_BENCH_TREE_ATTENTION": "x", "MY_DETSPEC_VERIFY": "x", "DETSPEC_VERIFY_LOG": "x",
           "PATH": "/bin", "VERIFY": "1", "SGLANG_DISABLE": "1",
           # SGLang's own SGLANG_SPEC_* prefix, 3 edits from SGLANG_DETSPEC_
           "SGLANG_SPEC_VERIFY": "1", "SGLANG_SPEC_DISABLE": "1", "SGLANG_SPEC_TREE_ATTENTION": "x"}
    assert env_settings(env)["verify"] == "auto"


def test_no_variable_sglang_reads_is_taken_for_a_setting():
    from sglang.srt.environ import envs

    names = {n: "1" for n in dir(envs) if n.isupper() and not n.startswith(ENV_PREFIX)}
    assert len(names) > 100 and unknown_env_names(names) == []


def test_every_wrong_setting_is_named_in_one_error():
    env = {"SGLANG_DETSPEC_DISABLE": "maybe", "SGLANG_DETSPEC_MOE_TILE": "x", "SGLANG_DETSPEC_FOO": "1",
           "SGLANG_DETSPEC_GEMM": "plugin"}
    with pytest.raises(ValueError) as raised:
        env_settings(env)
    lines = str(raised.value).splitlines()
    assert lines[0] == "4 sglang-detspec settings are wrong:"
    assert [line.split()[1] for line in lines[1:]] == ["SGLANG_DETSPEC_GEMM", "SGLANG_DETSPEC_FOO",
                                                       "SGLANG_DETSPEC_DISABLE", "SGLANG_DETSPEC_MOE_TILE"]
    # No near name for FOO (the shared prefix alone makes no match), the removed name not offered as a setting,
    # and the empty value, which reads as the default, not listed as a word to type.
    offered = lines[2].split("its settings: ", 1)[1].rstrip(")").split(", ")
    assert "did you mean" not in lines[2] and "SGLANG_DETSPEC_VERIFY" in offered
    assert "SGLANG_DETSPEC_GEMM" not in offered and "SGLANG_DETSPEC_GEMM_WARMUP_S" in offered
    assert lines[3].endswith("must be one of 1, true, yes, on, 0, false, no or off, got 'maybe'")
    assert env_settings({"SGLANG_DETSPEC_GEMM": "sglang"})["verify"] == "auto"  # the removed default, accepted


def test_algorithm_coverage_per_mode():
    for algo in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", None):
        assert DetSpecConfig(deterministic=True, algorithm=algo, eagle_topk=4).active, algo
    for algo in ("DFLASH", "UNO", "DSPARK", "FROZEN_KV_MTP", "MY_PLUGIN_ALGO"):
        coupled = DetSpecConfig(deterministic=True, algorithm=algo)
        assert not coupled.active and "is not covered" in coupled.refusals()[0], algo
    for algo in ("STANDALONE", "NGRAM"):
        rejection = DetSpecConfig(deterministic=True, algorithm=algo, verify="rejection", rejection_sampling=True,
                                  num_steps=3, eagle_topk=1, num_draft_tokens=4)
        assert "not supported in rejection mode" in " ".join(rejection.refusals()), algo
    # Disabled, or deterministic inference off: not ours, nothing refused.
    assert DetSpecConfig(deterministic=True, disabled=True, algorithm="DFLASH").refusals() == []
    assert DetSpecConfig(algorithm="DFLASH").refusals() == []


def test_startup_line_names_the_verify_mode(loaded, model_dir, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger="sglang_detspec")
    server_args(model_dir, f"{eagle(model_dir, TREE)} {DET}")
    messages = [r.getMessage() for r in caplog.records if "sglang-detspec" in r.getMessage()]
    line = [m for m in messages if m.startswith("sglang-detspec active")][-1]
    assert line.startswith("sglang-detspec active: DetSpecConfig(active=True, ") and "verify='coupled'" in line
    # By default the positional split verifies a tree as its nodes' decodes: bitwise, no note.
    assert "logits='bitwise'" in line and "decode_attention='split'" in line
    assert not any("because of" in m for m in messages)
    # Without the split a tree on its backend claims tokens, and a note after the line says why.
    caplog.clear()
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "one_pass")
    server_args(model_dir, f"{eagle(model_dir, TREE)} {DET}")
    messages = [r.getMessage() for r in caplog.records if "sglang-detspec" in r.getMessage()]
    line = [m for m in messages if m.startswith("sglang-detspec active")][-1]
    assert "logits='tokens'" in line and any("logits='tokens' because of a tree (top-k" in m for m in messages)
    reset_config()


# -- SGLang's sampler: every sampled token on the TARGET stream ----------------------


@pytest.fixture(scope="module")
def published(loaded, model_dir):
    """SGLang's runtime context of a deterministic server without speculative decoding, and its bag.

    The bag is the one the plugin's publish hook installs, as in a scheduler
    process (nothing installed before the publish).
    """
    from sglang.srt.runtime_context import publish

    sa = server_args(model_dir, DET)
    reset_config()
    publish(sa, role="test")
    bag = current_config()
    assert bag.source == "runtime_context"
    yield bag
    reset_config()


@pytest.fixture
def runtime(published):
    """The published context's bag in force for one test (other tests install and forget their own)."""
    install_config(published)
    yield
    reset_config()


def sampling_info(top_ks, temps, seeds, top_ps=None, min_ps=None, vocab=1000):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    b = len(top_ks)
    top_ks = torch.tensor(top_ks, dtype=torch.int32)
    top_ps = torch.ones(b) if top_ps is None else torch.tensor(top_ps)
    min_ps = torch.zeros(b) if min_ps is None else torch.tensor(min_ps)
    return SamplingBatchInfo(
        temperatures=torch.tensor(temps, dtype=torch.float32).view(-1, 1), top_ps=top_ps, top_ks=top_ks,
        min_ps=min_ps, is_all_greedy=bool((top_ks <= 1).all()), is_any_greedy=bool((top_ks <= 1).any()),
        need_top_p_sampling=bool((top_ps < 1).any()), need_top_k_sampling=bool((top_ks < vocab).any()),
        need_min_p_sampling=bool((min_ps > 0).any()), vocab_size=vocab, sampling_seed=seeds, device="cpu",
    )


def sglang_sample(logits, info, positions):
    """Tokens from SGLang's own Sampler.forward (the non-speculative path), hooked."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.layers.sampler import Sampler
    from sglang.srt.runtime_context import get_parallel

    out = LogitsProcessorOutput(next_token_logits=logits.clone())
    # One process, no tensor parallelism: the sampler only keeps the group's handle
    # (it syncs token ids across ranks only with grammars or SYNC_TOKEN_IDS_ACROSS_TP).
    tp_group = object.__new__(GroupCoordinator)
    tp_group.device_group = None  # sampler.py, Sampler.__init__: get_parallel().tp_group.device_group
    with get_parallel().override(tp_group=tp_group):
        sampler = Sampler()
    return sampler(out, info, False, [], [], positions).long()


def target_oracle(logits, temps, seeds, decided, keep=None):
    """Independent TARGET draws: torch.softmax(logits / T) (optionally masked), raced at ``decided``."""
    w = torch.softmax(logits / temps.view(-1, 1), dim=-1)
    if keep is not None:
        w = torch.where(keep, w, torch.zeros_like(w))
    return exponential_race(w, seeds, decided, stream=Stream.TARGET)[:, 0]


def test_sglang_sampler_draws_the_target_race_at_the_decided_position(runtime):
    assert current_config().active and current_config().algorithm is None
    gen = torch.Generator().manual_seed(11)
    b, v = 6, 1000
    logits = torch.randn(b, v, generator=gen) * 3
    seeds = torch.randint(-(1 << 62), 1 << 62, (b,), generator=gen)
    positions = torch.randint(0, 1 << 20, (b,), generator=gen)
    temps = [0.7, 1.0, 1.3, 0.9, 1.1, 0.5]
    # Simple path: no row truncates.
    info = sampling_info([v] * b, temps, seeds)
    got = sglang_sample(logits, info, positions)
    want = target_oracle(logits, torch.tensor(temps), seeds, positions + 1)
    assert torch.equal(got, want)
    # Top-k path for the whole batch because one row is greedy and one truncates: untruncated rows
    # draw exactly the simple path's tokens, the greedy row its argmax, the top-k row within its top 5.
    info = sampling_info([1, v, v, 5, v, v], temps, seeds)
    mixed = sglang_sample(logits, info, positions)
    untruncated = torch.tensor([False, True, True, False, True, True])
    assert torch.equal(mixed[untruncated], want[untruncated])
    assert int(mixed[0]) == int(logits[0].argmax())
    top5 = (logits[3] / temps[3]).topk(5).indices
    keep = torch.zeros(b, v, dtype=torch.bool)
    keep[3, top5] = True
    assert int(mixed[3]) == int(target_oracle(logits[3:4], torch.tensor(temps[3:4]), seeds[3:4],
                                              positions[3:4] + 1, keep[3:4])[0])
    # Another position or seed gives another draw: the key is really used.
    assert not torch.equal(sglang_sample(logits, sampling_info([v] * b, temps, seeds), positions + 1), got)


# -- coupled verify on SGLang's tree layout ------------------------------------------


def sglang_tree(b, parents):
    """SGLang's tree tensors for ``parents`` (node -> parent, node 0 the root), as build_tree_kernel_efficient lays them out.

    retrieve_index[b, i] = b * N + i (the flat slot of node i); next_token is the
    first child, next_sibling the next child of the same parent, -1 when none.
    """
    n = len(parents)
    next_token = torch.full((b, n), -1, dtype=torch.long)
    next_sibling = torch.full((b, n), -1, dtype=torch.long)
    last_child = {}
    for i in range(1, n):
        p = parents[i]
        if p in last_child:
            next_sibling[:, last_child[p]] = i
        else:
            next_token[:, p] = i
        last_child[p] = i
    retrieve_index = torch.arange(b * n).view(b, n)
    return retrieve_index, next_token, next_sibling


def depths(parents):
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


# topk 2, 3 steps, 7 draft nodes: root -> {1, 2}; 1 -> {3, 4}; 2 -> {5}; 3 -> {6}
PARENTS = [-1, 0, 0, 1, 1, 2, 3]


def verify_case(seed=5, b=4, v=300, top_ks=None, temps=None):
    """Logits, SGLang sampling info and a tree whose candidates follow the coupled winners on some rows."""
    gen = torch.Generator().manual_seed(seed)
    n = len(PARENTS)
    top_ks = top_ks or [v] * b
    temps = temps or [1.0, 0.8, 1.2, 1.0][:b]
    logits = torch.randn(b * n, v, generator=gen) * 2
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen)
    seq_lens = torch.randint(5, 2000, (b,), generator=gen)
    info = sampling_info(top_ks, temps, seeds, vocab=v)
    candidates = torch.randint(0, v, (b, n), generator=gen)
    # Put the target's own token (the non-speculative sampler's, at the node's decided
    # position) on the second child of the root and the first child of node 2 on rows
    # 0 and 2, so those rows accept two drafts; rows 1 and 3 keep random drafts.
    d = depths(PARENTS)
    keep = top_k_mask(logits, torch.tensor(top_ks).repeat_interleave(n), torch.tensor(temps).repeat_interleave(n))
    rows = torch.arange(b)
    y = target_oracle(logits, torch.tensor(temps).repeat_interleave(n), seeds.repeat_interleave(n),
                      (seq_lens.repeat_interleave(n) + 1 + torch.tensor(d).repeat(b)), keep).view(b, n)
    for r in (0, 2):
        candidates[r, 2] = y[r, 0]
        candidates[r, 5] = y[r, 2]
    return logits, info, seeds, seq_lens, candidates, y, rows


def top_k_mask(logits, top_ks, temps):
    w = torch.softmax(logits / temps.view(-1, 1), dim=-1)
    order = w.sort(dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(w.shape[1]).expand_as(order))
    return ranks < top_ks.view(-1, 1)


def run_tree_hook(logits, info, seeds, seq_lens, candidates, hook=None):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    b, n = candidates.shape
    ri, nt, ns = sglang_tree(b, PARENTS)
    depth = max(depths(PARENTS)) + 1
    predicts = torch.zeros(b * n, dtype=torch.int32)
    accept_index = torch.full((b, depth), -1, dtype=torch.int32)
    accept_num = torch.empty(b, dtype=torch.int32)
    ctx = VerifyContext(seeds, seq_lens + 1, LogitsProcessorOutput(next_token_logits=logits.clone()), info)
    hook = hook or verify_hook.coupled_tree_sampling
    with verify_hook.verify_context(ctx):
        hook(None, predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
             candidates=candidates, retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns,
             uniform_samples=None, uniform_samples_for_final_sampling=None,
             target_probs=torch.empty(0), draft_probs=torch.empty(0), threshold_single=1.0,
             threshold_acc=1.0, deterministic=True)
    return predicts, accept_index, accept_num, (ri, nt, ns)


def test_tree_hook_writes_coupled_verify_tree_in_sglang_layout(loaded, bag):
    bag(COUPLED)
    logits, info, seeds, seq_lens, candidates, _, _ = verify_case()
    predicts, accept_index, accept_num, (ri, nt, ns) = run_tree_hook(logits, info, seeds, seq_lens, candidates)
    b, n = candidates.shape
    weights = torch.softmax(logits / info.temperatures.repeat_interleave(n, 0), dim=-1).view(b, n, -1)
    tokens, acc, path = coupled_verify_tree(candidates, nt, ns, weights, seeds, seq_lens + 1)
    assert torch.equal(accept_num.long(), acc)
    assert acc.tolist()[0] == 2 and acc.tolist()[2] == 2  # the planted paths root -> 2 -> 5
    for r in range(b):
        k = int(acc[r])
        slots = ri[r, path[r, : k + 1]]
        assert accept_index[r, : k + 1].tolist() == slots.tolist()
        assert (accept_index[r, k + 1 :] == -1).all()
        assert predicts[slots].tolist() == tokens[r, : k + 1].tolist()
        untouched = torch.ones(b * n, dtype=torch.bool)
        untouched[slots] = False
        assert (predicts[r * n : (r + 1) * n][untouched[r * n : (r + 1) * n]] == 0).all()


def test_verify_emits_what_the_sampler_draws_without_speculative_decoding(runtime):
    """Spec on vs off: each committed token equals SGLang's sampler token for the same logits row
    at the same absolute position (the sampler gets the position of the token before it)."""
    logits, info, seeds, seq_lens, candidates, _, _ = verify_case(seed=9)
    predicts, accept_index, accept_num, _ = run_tree_hook(logits, info, seeds, seq_lens, candidates)
    b, n = candidates.shape
    d = depths(PARENTS)
    for r in range(b):
        for j in range(int(accept_num[r]) + 1):
            slot = int(accept_index[r, j])
            node = slot - r * n
            row_info = sampling_info(info.top_ks[r : r + 1].tolist(), info.temperatures[r].tolist(),
                                     seeds[r : r + 1], vocab=logits.shape[1])
            off = sglang_sample(logits[slot : slot + 1], row_info, seq_lens[r : r + 1] + d[node])
            assert int(predicts[slot]) == int(off[0]), (r, j)
    assert accept_num.sum() >= 4


def test_greedy_and_top_k_rows_in_a_mixed_batch(runtime):
    v = 300
    logits, info, seeds, seq_lens, candidates, y, _ = verify_case(seed=3, v=v, top_ks=[1, v, 7, v])
    predicts, accept_index, accept_num, _ = run_tree_hook(logits, info, seeds, seq_lens, candidates)
    n = candidates.shape[1]
    for j in range(int(accept_num[0]) + 1):  # row 0 is greedy: every committed token is the argmax
        slot = int(accept_index[0, j])
        assert int(predicts[slot]) == int(logits[slot].argmax())
    assert int(accept_num[0]) == 2  # its planted path (the argmax at each node) is accepted
    for j in range(int(accept_num[2]) + 1):  # row 2: top-7 cut, as the sampler cuts it
        slot = int(accept_index[2, j])
        assert int(predicts[slot]) in (logits[slot] / info.temperatures[2]).topk(7).indices.tolist()
        assert int(predicts[slot]) == int(y.view(-1)[slot])
    assert n == len(PARENTS)


def test_chain_sampler_in_coupled_mode_equals_the_tree_hook_on_a_chain(loaded, bag):
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    bag(COUPLED_DRAFTS)
    gen = torch.Generator().manual_seed(2)
    b, w, v = 5, 4, 200
    logits = torch.randn(b * w, v, generator=gen)
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen)
    seq_lens = torch.randint(5, 500, (b,), generator=gen)
    info = sampling_info([v] * b, [1.0] * b, seeds, vocab=v)
    temps = torch.ones(b * w)
    pos = (seq_lens.view(-1, 1) + 1 + torch.arange(w)).view(-1)
    y = target_oracle(logits, temps, seeds.repeat_interleave(w), pos).view(b, w)
    candidates = torch.randint(0, v, (b, w), generator=gen)
    candidates[:, 1:3] = y[:, 0:2]  # first two drafts are the target's tokens: accept >= 2
    candidates[1, 2] = (y[1, 1] + 1) % v  # row 1 stops after one
    ri = torch.arange(b * w).view(b, w)
    outs = []
    for hook in ("chain", "tree"):
        predicts = torch.zeros(b * w, dtype=torch.int32)
        accept_index = torch.full((b, w), -1, dtype=torch.int32)
        accept_num = torch.empty(b, dtype=torch.int32)
        ctx = VerifyContext(seeds, seq_lens + 1, LogitsProcessorOutput(next_token_logits=logits.clone()), info)
        nt = torch.where(torch.arange(w) < w - 1, torch.arange(w) + 1, -1).expand(b, w)
        with verify_hook.verify_context(ctx):
            if hook == "chain":
                verify_hook.seeded_chain_sampling(
                    None, predicts, accept_index, accept_num, candidates, ri, None, None, None, None,
                    torch.empty(0), torch.empty(0), 1.0, 1.0, True)
            else:
                verify_hook.coupled_tree_sampling(
                    None, predicts, accept_index, accept_num, candidates, ri, nt, torch.full((b, w), -1),
                    None, None, torch.empty(0), torch.empty(0))
        outs.append((predicts, accept_index, accept_num))
    for a, c in zip(*outs):
        assert torch.equal(a, c)
    acc = outs[0][2]
    assert acc[1] == 1 and all(int(acc[r]) >= 2 for r in (0, 2, 3, 4))
    for r in range(b):
        k = int(acc[r])
        assert outs[0][0][r * w : r * w + k + 1].tolist() == y[r, : k + 1].tolist()  # accepted drafts, then y


# -- SGLang's own eagle_sample: coupled verify computes no target probabilities -------------


def softmaxes_of(shapes, run):
    """How many softmaxes over a tensor of one of ``shapes`` ``run()`` computes (torch's CPU profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
    wanted = [[list(shape)] for shape in shapes]
    return sum(1 for e in prof.events() if e.name == "aten::_softmax" and e.input_shapes[:1] in wanted)


@pytest.mark.parametrize("hooked", [True, False], ids=["hooked", "sglang_softmax"])
def test_sglang_eagle_sample_verifies_a_coupled_chain_without_its_target_probs(loaded, model_dir, monkeypatch,
                                                                              hooked):
    """SGLang's eagle_sample, sampling branch, on a coupled chain server's runtime context.

    On CPU eagle_sample always takes its greedy branch (``_is_cpu``); with that
    flag lowered its sampling branch runs as on CUDA, through the hooked chain
    sampler (start-up declares the rejection flag for coupled chains). Its
    softmax of the target logits and its temperature division are then left
    out: one softmax over the [B*W, V] logits remains (as [B, W, V]), the
    coupled verify's own. With the softmax hook taken out (``sglang_softmax``) SGLang's
    runs as well, and the emitted tokens are the same.
    """
    from sglang.kernels.ops import sampling as sampling_ops
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.runtime_context import get_parallel, publish, restore_context, snapshot_context
    from sglang.srt.speculative import eagle_utils
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    sa = server_args(model_dir, f"{eagle(model_dir, CHAIN)} {DET}")
    saved = snapshot_context()  # the module's published context (fixture ``published``) comes back afterwards
    reset_config()
    publish(sa, role="test")
    monkeypatch.setattr(eagle_utils, "_is_cpu", False)
    if not hooked:
        monkeypatch.setattr(eagle_utils, "sampling_softmax", sampling_ops.softmax.__wrapped__)
    try:
        bag = current_config()
        assert bag.coupled and bag.rejection_sampling
        gen = torch.Generator().manual_seed(21)
        b, w, v = 4, 4, 1000
        logits = torch.randn(b * w, v, generator=gen) * 2
        seeds = torch.randint(0, 1 << 62, (b,), generator=gen)
        seq_lens = torch.randint(5, 500, (b,), generator=gen)
        temps = [1.0, 0.7, 1.3, 1.0]
        # No row truncates: SGLang's renorm ops have no CPU build (test_sglang_plugin covers their hooks).
        info = sampling_info([v] * b, temps, seeds, vocab=v)
        pos = (seq_lens.view(-1, 1) + 1 + torch.arange(w)).view(-1)
        y = target_oracle(logits, info.temperatures.view(-1).repeat_interleave(w), seeds.repeat_interleave(w),
                          pos).view(b, w)
        candidates = torch.randint(0, v, (b, w), generator=gen)
        candidates[0, 1:] = y[0, :3]  # row 0 accepts all three drafts; row 3 its first
        candidates[3, 1] = y[3, 0]
        chain_next = torch.where(torch.arange(w) < w - 1, torch.arange(w) + 1, -1).expand(b, w).contiguous()
        verify_input = EagleVerifyInput(
            draft_token=candidates.reshape(-1), custom_mask=None, positions=pos,
            retrieve_index=torch.arange(b * w).view(b, w),
            retrieve_next_token=chain_next, retrieve_next_sibling=torch.full((b, w), -1), retrieve_cum_len=None,
            spec_steps=w - 1, topk=1, draft_token_num=w, capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=int(seq_lens.sum()), seq_lens_cpu=seq_lens,
            draft_probs=torch.softmax(torch.randn(b, w - 1, v, generator=gen), dim=-1),
        )
        batch = types.SimpleNamespace(device="cpu", forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=seq_lens,
                                      sampling_info=info, return_logprob=False)
        tp_group = object.__new__(GroupCoordinator)
        tp_group.world_size = 1
        out = []
        with get_parallel().override(tp_group=tp_group):
            count = softmaxes_of([(b * w, v), (b, w, v)], lambda: out.append(eagle_utils.eagle_sample(
                verify_input, batch, LogitsProcessorOutput(next_token_logits=logits.clone()))))
    finally:
        restore_context(saved)
        reset_config()
    assert count == (1 if hooked else 2)
    predict, accept_lens, accept_index = out[0]
    assert accept_lens.tolist()[0] == 4 and accept_lens.tolist()[3] >= 2
    for r in range(b):
        n = int(accept_lens[r])  # accepted drafts + the token after them
        assert predict[r * w : r * w + n].tolist() == y[r, :n].tolist(), r
        assert accept_index[r, :n].tolist() == list(range(r * w, r * w + n))


# -- coupled draft proposals at the exact drafted position -----------------------------


def draft_case(b=5, v=300, seed=4):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, v, generator=gen) * 2
    temps = torch.rand(b, 1, generator=gen) + 0.5
    seeds = torch.randint(-(1 << 62), 1 << 62, (b,), generator=gen)
    key = torch.randint(0, 1 << 20, (b,), generator=gen)
    return logits, temps, seeds, key


def test_eagle_v2_coupled_drafts_race_on_target_at_key_plus_one(loaded, bag):
    from sglang.srt.speculative import eagle_worker_v2, spec_utils

    bag(COUPLED_DRAFTS)
    logits, temps, seeds, key = draft_case()
    for step in (0, 1, 2):  # the draft step does not enter the key: column = token id
        q, q_x, x = spec_utils.sample_draft_proposal(logits, temps, sampling_seed=seeds, positions=key,
                                                     draft_step=step)
        assert torch.equal(x, exponential_race(q, seeds, key + 1, stream=Stream.TARGET))
        assert torch.equal(q_x, q.gather(1, x))
    _, x0 = eagle_worker_v2.fast_sample(q, 1, sampling_seed=seeds, positions=key)  # prefill draft extend binding
    assert torch.equal(x0, x)


def test_coupled_draft_equals_the_target_token_when_q_equals_p(runtime, bag):
    """Gumbel coupling: a drafter with the target's distribution proposes the target's token."""
    from sglang.srt.speculative import spec_utils

    bag(dataclasses_replace(current_config(), verify="coupled", rejection_sampling=True,
                            algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4))
    logits, temps, seeds, key = draft_case(v=1000)
    _, _, x = spec_utils.sample_draft_proposal(logits, temps, sampling_seed=seeds, positions=key)
    info = sampling_info([1000] * len(key), temps.view(-1).tolist(), seeds)
    # The sampler is keyed by the token before the one it decides: the drafted token's is key + 1.
    y = sglang_sample(logits, info, key)
    # On CPU tensors SGLang's sampling softmax is torch.softmax(logits / T), the sampler's kernel.
    assert torch.equal(spec_utils.sampling_softmax(logits, temperatures=temps), torch.softmax(logits / temps, dim=-1))
    assert torch.equal(x[:, 0], y)


def dataclasses_replace(bag, **kw):
    import dataclasses

    return dataclasses.replace(bag, **kw)


def test_multi_layer_draft_positions(loaded, bag, monkeypatch):
    """The multi-layer sites publish their rule; SGLang's own sample_draft_proposal then keys the race.

    Single-CUDA-graph runner: SGLang's own ``_sample_draft_proposal``, hooked by SGLang's
    registry, runs on a real runner object that has only the attributes SGLang's code
    and the plugin's hook read. The worker methods run a draft model, so for them the
    probe bodies stand in, calling SGLang's sample_draft_proposal with the key positions
    those methods pass; the hooks get SGLang's own ScheduleBatch and GenerationBatchResult,
    and SGLang's signatures are checked to pass them where the hooks read them.
    """
    import dataclasses
    import inspect

    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.speculative import multi_layer_eagle_draft_extend_cuda_graph_runner as ml_graph
    from sglang.srt.speculative import spec_utils
    from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleDraftWorker

    bag(COUPLED_DRAFTS)
    logits, temps, seeds, _ = draft_case()
    b = len(seeds)
    s_len = torch.tensor([10, 200, 37, 5, 1000])  # pre-verify length S (prompt length for prefill)
    accept_lens = torch.tensor([1, 4, 2, 3, 1], dtype=torch.int32)
    width = 4

    def body(key):
        def run(*args, **kwargs):
            return [spec_utils.sample_draft_proposal(logits, temps, sampling_seed=seeds, positions=key,
                                                     draft_step=s)[2] for s in range(3)]
        return run

    def unhooked(method):
        while hasattr(method, "__wrapped__"):
            method = method.__wrapped__
        return method

    worker = object.__new__(MultiLayerEagleDraftWorker)  # the hooks read nothing of the worker
    # Prefill: SGLang keys every MTP layer with the prompt length.
    prefill = list(inspect.signature(unhooked(MultiLayerEagleDraftWorker._draft_extend_for_prefill)).parameters)
    assert prefill[:4] == ["self", "batch", "target_hidden_states", "next_token_ids"], prefill
    xs = draft_hook.ml_prefill_positions(body(s_len), worker, ScheduleBatch(reqs=[], seq_lens=s_len), None, None)
    for s, x in enumerate(xs):
        q = spec_utils.sampling_softmax(logits, temperatures=temps)
        assert torch.equal(x, exponential_race(q, seeds, s_len + 1 + s, stream=Stream.TARGET)), s
    # Decode, eager / per-step graphs: SGLang keys with S + width; the token is S + accept_lens + 1 + s.
    # multi_layer_eagle_worker_v2.py MultiLayerEagleDraftWorker._draft_extend_for_decode(self, batch, batch_result,
    # ...), called by MultiLayerEagleWorkerV2.forward_batch_generation with the ScheduleBatch and the verify's
    # GenerationBatchResult; the hook reads batch.seq_lens and batch_result.accept_lens, SGLang's field names
    # (the constructors below refuse any other).
    decode = list(inspect.signature(unhooked(MultiLayerEagleDraftWorker._draft_extend_for_decode)).parameters)
    assert decode[:3] == ["self", "batch", "batch_result"], decode
    batch = ScheduleBatch(reqs=[], seq_lens=s_len)
    result = GenerationBatchResult(accept_lens=accept_lens)
    xs = draft_hook.ml_decode_positions(lambda self, bt, br: body(s_len + width)(), worker, batch, result)
    for s, x in enumerate(xs):
        q = spec_utils.sampling_softmax(logits, temperatures=temps)
        assert torch.equal(x, exponential_race(q, seeds, s_len + accept_lens + 1 + s, stream=Stream.TARGET)), s
    # Single-CUDA-graph runner: the same from its input buffers, through SGLang's hooked method.
    runner_cls = ml_graph.MultiLayerEagleDraftExtendCudaGraphRunner
    assert hasattr(runner_cls._sample_draft_proposal, "__wrapped__"), "the graph runner's sampler is not hooked"
    # The plugin's hook reads speculative_num_draft_tokens, which SGLang's own method does not:
    # its name is checked in SGLang's __init__ (multi_layer_eagle_draft_extend_cuda_graph_runner.py).
    assert "self.speculative_num_draft_tokens = " in inspect.getsource(runner_cls.__init__)
    runner = object.__new__(runner_cls)
    runner.speculative_num_draft_tokens = width  # __init__: get_spec().speculative_num_draft_tokens
    runner.prune_draft_extend_logits = True  # __init__; _select_step_logits then takes ret.next_token_logits as is
    # init_buffers_and_capture: self.buffers = buffers, the shared set (every field required; those
    # _sample_draft_proposal and the hook read are given, by SGLang's names, the rest left None; a
    # name the dataclass no longer has is refused by its constructor).
    fields = dict.fromkeys(f.name for f in dataclasses.fields(ml_graph.MultiLayerEagleDraftExtendInputBuffers))
    runner.buffers = ml_graph.MultiLayerEagleDraftExtendInputBuffers(**{
        **fields,
        "seq_lens": (s_len + width).to(torch.int32),  # SGLang's graph key: pre-verify length + num_draft_tokens
        "num_accept_tokens": accept_lens,  # the verify's committed count
        "temperatures": temps,
        "draft_probs": torch.empty(b, 3, logits.shape[1]),
        "sampling_seed": seeds,
    })
    # wide_row_softmax_triton has no CPU build: SGLang's CPU sampling softmax, written into the
    # same draft_probs slot, in its place.
    monkeypatch.setattr(ml_graph, "wide_row_softmax_triton",
                        lambda lg, t, out: out.copy_(spec_utils.sampling_softmax(lg, temperatures=t)))
    ret = LogitsProcessorOutput(next_token_logits=logits)
    for s in range(3):
        runner.step = s  # __init__: self.step = step (the MTP layer)
        runner._sample_draft_proposal(ret, b)  # writes ret.topk_p, ret.topk_index
        q = spec_utils.sampling_softmax(logits, temperatures=temps)
        want = exponential_race(q, seeds, s_len + accept_lens + 1 + s, stream=Stream.TARGET)
        assert torch.equal(ret.topk_index, want), s
    # Outside any multi-layer site the EAGLE v2 rule applies again.
    assert torch.equal(draft_hook.coupled_draft_position(s_len, 2), s_len + 1)


def test_rejection_mode_keeps_the_draft_stream(loaded, bag):
    from sglang.srt.speculative import spec_utils

    bag(dataclasses_replace(COUPLED_DRAFTS, verify="rejection"))
    logits, temps, seeds, key = draft_case()
    q, _, x = spec_utils.sample_draft_proposal(logits, temps, sampling_seed=seeds, positions=key, draft_step=2)
    assert torch.equal(x, exponential_race(q, seeds, key, stream=Stream.DRAFT, draft_step=2))


def test_write_verify_outputs_keeps_unaccepted_slots(loaded):
    b, n = 2, 5
    tokens = torch.tensor([[7, 8, -1, -1, -1], [9, -1, -1, -1, -1]])
    accepted = torch.tensor([1, 0])
    path = torch.tensor([[0, 3, -1, -1, -1], [0, -1, -1, -1, -1]])
    ri = torch.arange(b * n).view(b, n)
    predicts = torch.full((b * n,), 42, dtype=torch.int32)
    accept_index = torch.full((b, 3), -1, dtype=torch.int32)
    num = torch.empty(b, dtype=torch.int32)
    write_verify_outputs(tokens, accepted, path, ri, predicts, accept_index, num)
    assert predicts.tolist() == [7, 42, 42, 8, 42, 9, 42, 42, 42, 42]
    assert accept_index.tolist() == [[0, 3, -1], [5, -1, -1]] and num.tolist() == [1, 0]


def test_hooked_verify_samplers_bind_where_sglang_calls_them(loaded):
    """eagle_utils calls the registry's wrapper around SGLang's chain sampler, not the bare kernel.

    The tree sampler is None on CPU builds, so its binding is proven on the GPU instead: the
    coupled tree server gives the tokens of the server without speculative decoding
    (test/registered/e2e/test_invariance.py), which SGLang's own tree sampler does not.
    """
    from sglang.kernels.ops.speculative import verify_sampling
    from sglang.srt.speculative import eagle_utils

    bound = eagle_utils.chain_speculative_sampling_triton
    assert bound is verify_sampling.chain_speculative_sampling_triton
    assert hasattr(bound, "__wrapped__"), "eagle_utils calls SGLang's chain sampler unhooked"
    original = bound
    while hasattr(original, "__wrapped__"):
        original = original.__wrapped__
    assert original is not bound and original.__name__ == "chain_speculative_sampling_triton"

def test_verify_weights_broadcast_equals_the_repeated_rows_bit_for_bit(loaded):
    """Without a cut, each request's temperature is broadcast over its nodes instead of repeated per row:
    the weights must be the repeated rows' own, bit for bit; with a cut, the repeated path runs."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang_detspec.ops.weights import target_weights
    from sglang_detspec.sglang_plugin.positions import sampling_rows

    gen = torch.Generator().manual_seed(5)
    b, width, v = 3, 8, 1000
    logits = torch.randn(b * width, v, generator=gen) * 4
    seeds = torch.tensor([1, 2, 3])
    for info in (sampling_info([v] * 3, [1.0, 0.7, 1.3], seeds, vocab=v),  # no row truncates
                 sampling_info([v, 5, v], [1.0, 0.7, 1.3], seeds, top_ps=[1.0, 1.0, 0.9], vocab=v)):
        ctx = VerifyContext(seeds, torch.tensor([10, 20, 30]), LogitsProcessorOutput(next_token_logits=logits), info)
        got = verify_hook.verify_weights(ctx, width)
        rows = sampling_rows(info, width)
        want = target_weights(logits, rows.temperatures, *rows.cut_args()).view(b, width, v)
        assert got.shape == (b, width, v) and torch.equal(got, want)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
