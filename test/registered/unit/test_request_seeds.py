"""Request seeds (docs/design.md §6): the derivation, and SGLang's request path through the seed hooks.

The derivation is checked against the independent ``mmh3`` package and the
torch keyed-hash op. The request path runs SGLang 0.5.23's own
``TokenizerManager.generate_request`` (normalisation, ``n > 1`` expansion,
tokenisation, ``SamplingParams`` construction and checks, request states,
response streaming) and its OpenAI response builders on CPU. Only the
scheduler is absent: the one method that hands a tokenized request to the
scheduler process is replaced by a stand-in that finishes the request at
once and echoes the seed it received, so the test sees exactly what a
scheduler would have been sent.
"""

import argparse
import asyncio
import dataclasses
import json
import re
import struct

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig, reset_config
from sglang_detspec.seed_encoding import from_int64, to_int64
from sglang_detspec.seeds import SAMPLE_SALT, derive_sample_seed, fresh_seed, murmur3_x86_32
from sglang_detspec.sglang_plugin import seed_hook

register_cpu_ci(est_time=90, suite="detspec-unit-cpu")

U32, U64 = 1 << 32, 1 << 64
ACTIVE = DetSpecConfig(deterministic=True, source="server_args")
INACTIVE = dataclasses.replace(ACTIVE, deterministic=False)
seeds64 = st.integers(0, U64 - 1)


# -- the derivation ---------------------------------------------------------------


def oracle(seed: int, index: int) -> int:
    key = (seed + SAMPLE_SALT) % U64
    h = [mmh3.hash(struct.pack("<4I", key % U32, key >> 32, index, c), 0, signed=False) for c in (0, 1)]
    return (h[1] << 32) | h[0]


@settings(max_examples=300, deadline=None)
@given(seeds64, st.integers(1, U32 - 1))
def test_derivation_matches_mmh3(seed, index):
    assert derive_sample_seed(seed, index) == oracle(seed, index)


@pytest.mark.parametrize("seed", [0, 1, 42, 2**63 - 1, 2**63, U64 - 1, U64 - SAMPLE_SALT, U64 - SAMPLE_SALT - 1])
def test_derivation_edges_match_mmh3_and_the_torch_stream(seed):
    from sglang_detspec.ops import Stream, keyed_hash

    assert Stream.SAMPLE.salt == SAMPLE_SALT
    indices = [1, 2, 3, 1000, U32 - 1]
    words = keyed_hash([seed] * len(indices), indices, [0, 1], salt=Stream.SAMPLE)
    for row, index in enumerate(indices):
        want = oracle(seed, index)
        assert derive_sample_seed(seed, index) == want == (int(words[row, 1]) << 32) | int(words[row, 0])


@given(st.binary(max_size=64), st.integers(0, U32 - 1))
def test_murmur3_matches_mmh3_on_any_message(data, hash_seed):
    assert murmur3_x86_32(data, hash_seed) == mmh3.hash(data, hash_seed, signed=False)


@given(seeds64)
def test_sample_zero_is_the_seed(seed):
    assert derive_sample_seed(seed, 0) == seed


@settings(max_examples=50, deadline=None)
@given(seeds64)
def test_samples_of_one_seed_are_distinct_and_off_nearby_seeds(seed):
    samples = [derive_sample_seed(seed, j) for j in range(64)]
    assert len(set(samples)) == 64
    nearby = {(seed + d) % U64 for d in range(-64, 65)}
    # Sample 1 of s is not s + 1, and no derived sample lands on a nearby plain seed.
    assert derive_sample_seed(seed, 1) != (seed + 1) % U64
    assert not nearby & set(samples[1:])
    # Nor on a sample of a nearby seed: samples of seeds s-8..s+8 never collide.
    others = {derive_sample_seed((seed + d) % U64, j) for d in range(-8, 9) if d for j in range(1, 16)}
    assert not others & set(samples[1:16])


def test_seed_42_sample_1_is_not_seed_43():
    assert derive_sample_seed(42, 1) != 43
    assert derive_sample_seed(42, 1) not in {derive_sample_seed(43, j) for j in range(16)}


@pytest.mark.parametrize("seed, index, match", [
    (-1, 1, r"^seed must be an int in \[0, 2\*\*64\), got -1"),
    (U64, 1, r"^seed must be an int in \[0, 2\*\*64\)"),
    (1.0, 1, r"^seed must be an int in \[0, 2\*\*64\), got float"),
    (True, 1, r"^seed must be an int"),
    (5, -1, r"^index must be an int in \[0, 2\*\*32\), got -1"),
    (5, U32, r"^index must be an int in \[0, 2\*\*32\)"),
    (5, 1.0, r"^index must be an int"),
    (5, True, r"^index must be an int"),
])
def test_bad_inputs_name_the_argument(seed, index, match):
    with pytest.raises(ValueError, match=match):
        derive_sample_seed(seed, index)


def test_murmur3_bad_inputs():
    with pytest.raises(ValueError, match="^data must be bytes"):
        murmur3_x86_32("abc")
    with pytest.raises(ValueError, match=r"^seed must be an int in \[0, 2\*\*32\)"):
        murmur3_x86_32(b"abc", U32)


def test_fresh_seeds_are_uint64_and_differ():
    seeds = [fresh_seed() for _ in range(1000)]
    assert all(isinstance(s, int) and 0 <= s < U64 for s in seeds)
    assert len(set(seeds)) == 1000
    assert max(seeds) >= 2**63  # the top bit is used (fails with probability 2**-1000)


def test_seeds_module_needs_no_torch():
    import subprocess
    import sys

    code = ("import sys; import sglang_detspec.seeds as s; s.derive_sample_seed(1, 2); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# -- SGLang's request path ----------------------------------------------------------


@pytest.fixture(scope="module")
def hooked():
    """The plugin's hooks applied by SGLang's own loader (and the seed hooks, if the table lacks them)."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    load_plugins()
    listed = {row.hook for row in sglang_plugin.hook_table()}
    missing = [(t, h, k) for t, h, k in seed_hook.HOOKS if h not in listed]
    for target, hook, kind in missing:
        HookRegistry.register(target, hook, HookType[kind])
    if missing:
        HookRegistry.apply_hooks()
    yield
    reset_config()


@pytest.fixture(scope="module")
def server_args(model_dir):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sa = ServerArgs.from_cli_args(parser.parse_args([
        "--model-path", model_dir, "--device", "cuda", "--attention-backend", "triton",
        "--enable-deterministic-inference", "--skip-tokenizer-init"]))
    sa.resolve_once()
    return sa


@pytest.fixture(scope="module")
def manager(hooked, server_args):
    """SGLang's TokenizerManager, set up by its own init steps where they need no other process.

    The constructor opens ZMQ sockets and loads a tokenizer,
    so the instance is built field by field from the published server
    arguments; ``_dispatch_to_scheduler`` (the ZMQ send) is the stand-in
    scheduler: it finishes each request at once, returning the
    ``sampling_seed`` it received as the only output token id.
    """
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.lora.lora_registry import LoRARegistry
    from sglang.srt.managers import tokenizer_manager as tm_module
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.sampling.sampling_params import SamplingParams

    publish(server_args, role="test")
    tm = tm_module.TokenizerManager.__new__(tm_module.TokenizerManager)
    tm.server_args = server_args
    tm.model_config = ModelConfig.from_server_args(server_args)
    tm.context_len = tm.model_config.context_len
    tm.max_req_input_len = tm.context_len - 1
    tm.preferred_sampling_params = None
    tm.sampling_params_class = SamplingParams
    tm.tokenized_generate_req_type = TokenizedGenerateReqInput
    tm.tokenizer = tm.mm_processor = None
    tm.rid_to_state = {}
    tm.encoder_dispatch_ready = {}
    tm.enable_trace = tm.enable_metrics = tm.incremental_streaming_output = False
    tm.enable_priority_scheduling = False
    tm.default_priority_value = None
    tm.disaggregation_mode = None
    tm.allow_auto_truncate = False
    tm.is_generation = True
    tm.num_reserved_tokens = 0
    tm.validate_total_tokens = True
    tm.fake_bootstrap_room_counter = 0
    tm.event_loop = object()  # the output-handling loop is the stand-in scheduler below
    tm.elastic_worker_count = 1
    tm.cuda_vmm_feature_transport = tm_module.CudaVmmFeatureTransport(server_args, None)
    tm.positional_embeds_transport = tm_module.PositionalEmbedsTransport(server_args.base_gpu_id, None)
    tm.lora_registry = LoRARegistry(None)
    tm.enable_lora = False
    tm.served_model_name = "m"
    tm.init_request_logging_and_dumping()
    tm.init_weight_update()
    tm.sent = []

    def finish(tokenized):
        # As SGLang's output loop does for a finished request: drop the state, then deliver.
        state = tm.rid_to_state.pop(tokenized.rid)
        seed = tokenized.sampling_params.sampling_seed
        state.out_list.append({"text": "", "output_ids": [seed],
                               "meta_info": {"id": tokenized.rid, "finish_reason": {"type": "length", "length": 1},
                                             "prompt_tokens": len(tokenized.input_ids), "completion_tokens": 1,
                                             "cached_tokens": 0, "weight_version": "default", "num_retractions": 0}})
        state.finished = True
        state.event.set()

    def dispatch(message):
        for tokenized in getattr(message, "batch", None) or [message]:  # one request or a batched send
            if hasattr(tokenized, "sampling_params"):  # not an abort or control message
                tm.sent.append(tokenized)
                # Outputs arrive later, from the output loop, never inside the send.
                asyncio.get_running_loop().call_soon(finish, tokenized)

    tm._dispatch_to_scheduler = dispatch
    yield tm
    reset_context()


def generate(tm, **fields):
    """SGLang's TokenizerManager.generate_request for a native /generate body: every output."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    async def run():
        return [out async for out in tm.generate_request(GenerateReqInput(**fields), None)]

    tm.sent.clear()
    outs = asyncio.run(run())
    return outs[0] if len(outs) == 1 and isinstance(outs[0], list) else outs


def echoed(out) -> int | None:
    """The sampling_seed the scheduler received for this output, as a uint64 (None: none)."""
    seed = out["output_ids"][0]
    return None if seed is None else from_int64(seed)


SAMPLED = {"temperature": 1.0, "max_new_tokens": 4}


def test_unseeded_requests_get_fresh_reported_seeds(manager, bag):
    bag(ACTIVE)
    outs = [generate(manager, input_ids=[1, 2, 3], sampling_params=dict(SAMPLED))[0] for _ in range(4)]
    reported = [o["meta_info"]["sampling_seed"] for o in outs]
    assert len(set(reported)) == 4 and all(0 <= s < U64 for s in reported)
    assert reported == [echoed(o) for o in outs]


def test_seeded_request_keeps_its_seed_and_seeds_above_2_63_travel_as_int64(manager, bag):
    bag(ACTIVE)
    for seed in (0, 42, 2**63, U64 - 1):
        (out,) = generate(manager, input_ids=[1, 2], sampling_params={**SAMPLED, "sampling_seed": seed})
        assert out["meta_info"]["sampling_seed"] == seed == echoed(out)
        assert manager.sent[-1].sampling_params.sampling_seed == to_int64(seed)


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 0.7, "top_k": 1}])
def test_greedy_requests_get_no_seed_and_report_null(manager, bag, params):
    bag(ACTIVE)
    (out,) = generate(manager, input_ids=[1, 2], sampling_params={"max_new_tokens": 4, **params})
    assert "sampling_seed" in out["meta_info"] and out["meta_info"]["sampling_seed"] is None
    assert echoed(out) is None
    (out,) = generate(manager, input_ids=[1, 2], sampling_params={"max_new_tokens": 4, "sampling_seed": 9, **params})
    assert out["meta_info"]["sampling_seed"] is None  # greedy: the seed is not used


def test_parallel_samples_use_derived_seeds(manager, bag):
    bag(ACTIVE)
    outs = generate(manager, input_ids=[5, 6, 7], sampling_params={**SAMPLED, "sampling_seed": 42, "n": 4})
    want = [derive_sample_seed(42, j) for j in range(4)]
    assert [o["meta_info"]["sampling_seed"] for o in outs] == want == [echoed(o) for o in outs]
    assert want[0] == 42 and len(set(want)) == 4
    # SGLang prefills the shared prompt once (max_new_tokens = 0) before the samples: seed unchanged.
    warmups = [t for t in manager.sent if t.sampling_params.max_new_tokens == 0]
    assert len(warmups) == 1 and warmups[0].sampling_params.sampling_seed == 42
    # n = 1 is sample 0 of n = 4.
    (single,) = generate(manager, input_ids=[5, 6, 7], sampling_params={**SAMPLED, "sampling_seed": 42})
    assert echoed(single) == echoed(outs[0])


def test_unseeded_parallel_samples_derive_from_one_fresh_seed(manager, bag):
    bag(ACTIVE)
    outs = generate(manager, input_ids=[5, 6], sampling_params={**SAMPLED, "n": 3})
    seeds = [o["meta_info"]["sampling_seed"] for o in outs]
    assert seeds == [derive_sample_seed(seeds[0], j) for j in range(3)] == [echoed(o) for o in outs]


def test_batch_of_prompts_with_n_and_mixed_seeds(manager, bag):
    bag(ACTIVE)
    # SGLang returns prompt i's sample j at i * n + j.
    outs = generate(manager, input_ids=[[1, 2], [3, 4]],
                    sampling_params=[{**SAMPLED, "sampling_seed": 7, "n": 2},
                                     {**SAMPLED, "sampling_seed": 2**64 - 2, "n": 2}])
    assert [o["meta_info"]["sampling_seed"] for o in outs] == [
        7, derive_sample_seed(7, 1), 2**64 - 2, derive_sample_seed(2**64 - 2, 1)] == [echoed(o) for o in outs]
    outs = generate(manager, input_ids=[[1, 2], [3, 4], [5]],
                    sampling_params=[{**SAMPLED, "sampling_seed": 3}, dict(SAMPLED), {"temperature": 0.0}])
    seeds = [o["meta_info"]["sampling_seed"] for o in outs]
    assert seeds[0] == 3 and seeds[1] is not None and seeds[1] != 3 and seeds[2] is None
    assert seeds == [echoed(o) for o in outs]


def test_streamed_outputs_report_the_seed(manager, bag):
    bag(ACTIVE)
    outs = generate(manager, input_ids=[1, 2], stream=True, sampling_params={**SAMPLED, "sampling_seed": 11, "n": 2})
    assert sorted(o["meta_info"]["sampling_seed"] for o in outs) == sorted([11, derive_sample_seed(11, 1)])
    assert all(o["meta_info"]["sampling_seed"] == echoed(o) for o in outs)


def test_seed_check_covers_parallel_and_batched_requests(manager, bag):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=r"sampling_seed must be in \[0, 2\*\*64 - 1\]"):
        generate(manager, input_ids=[1], sampling_params={**SAMPLED, "sampling_seed": -1, "n": 2})
    with pytest.raises(ValueError, match=r"sampling_seed must be in \[0, 2\*\*64 - 1\]"):
        generate(manager, input_ids=[[1], [2]], sampling_params=[dict(SAMPLED), {**SAMPLED, "sampling_seed": U64}])


def test_inactive_bag_leaves_sglang_alone(manager, bag):
    bag(INACTIVE)
    outs = generate(manager, input_ids=[5, 6], sampling_params={**SAMPLED, "sampling_seed": 42, "n": 3})
    assert all("sampling_seed" not in o["meta_info"] for o in outs)
    assert [echoed(o) for o in outs] == [42, 42, 42]  # SGLang's own n > 1: one shared seed
    (out,) = generate(manager, input_ids=[5], sampling_params=dict(SAMPLED))
    assert echoed(out) is None  # SGLang's own: the scheduler substitutes 42


# -- OpenAI-compatible endpoints ---------------------------------------------------------


def openai_completion(manager, **fields):
    """SGLang's /v1/completions handler for a non-streamed request: the response model."""
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager

    serving = OpenAIServingCompletion(manager, TemplateManager())
    request = CompletionRequest(model="m", prompt=[1, 2, 3], max_tokens=4, **fields)
    adapted, request = serving._convert_to_internal_request(request)
    manager.sent.clear()
    return asyncio.run(serving._handle_non_streaming_request(adapted, request, None))


def test_openai_completions_seed_and_n(manager, bag):
    bag(ACTIVE)
    response = openai_completion(manager, temperature=1.0, seed=5, n=3)
    want = [derive_sample_seed(5, j) for j in range(3)]
    assert [c.sampling_seed for c in response.choices] == want
    samples = [t for t in manager.sent if t.sampling_params.max_new_tokens]  # not the shared-prompt prefill
    assert [from_int64(t.sampling_params.sampling_seed) for t in samples] == want
    body = json.loads(response.model_dump_json())
    assert [c["sampling_seed"] for c in body["choices"]] == want
    # Unseeded: a fresh seed, its samples derived from it.
    seeds = [c.sampling_seed for c in openai_completion(manager, temperature=1.0, n=2).choices]
    assert seeds[1] == derive_sample_seed(seeds[0], 1)
    # Greedy: null in every choice.
    body = json.loads(openai_completion(manager, temperature=0.0).model_dump_json())
    assert "sampling_seed" in body["choices"][0] and body["choices"][0]["sampling_seed"] is None


def test_openai_chat_choices_report_their_seeds(manager, bag):
    # Chat requests reach the tokenizer manager as /generate bodies with the same seed and n (the
    # conversion needs a chat template); the chat response builder is SGLang's own.
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.template_manager import TemplateManager

    bag(ACTIVE)
    serving = OpenAIServingChat(manager, TemplateManager())
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], n=2, seed=U64 - 3,
                                    temperature=1.0)
    ret = generate(manager, input_ids=[1, 2, 3], sampling_params={**SAMPLED, "sampling_seed": U64 - 3, "n": 2})
    body = json.loads(serving._build_chat_response(request, ret, 0).model_dump_json())
    assert [c["sampling_seed"] for c in body["choices"]] == [U64 - 3, derive_sample_seed(U64 - 3, 1)]


def test_openai_request_models_admit_uint64_seeds():
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

    chat = {"messages": [{"role": "user", "content": "x"}]}
    for cls, extra in ((CompletionRequest, {"prompt": "x"}), (ChatCompletionRequest, chat)):
        assert cls(model="m", seed=U64 - 1, n=2, **extra).seed == U64 - 1


# -- start-up --------------------------------------------------------------------------


def test_tokenizer_workers_refused_while_ours(bag, server_args):
    import copy

    from sglang_detspec.sglang_plugin import resolve

    workers = copy.copy(server_args)
    workers.tokenizer_worker_num = 2
    bag_2 = resolve.config_from_server_args(workers)
    assert bag_2.tokenizer_workers == 2 and not bag_2.active
    assert any(re.search(r"--tokenizer-worker-num 2 is not supported.*use --tokenizer-worker-num 1", p)
               for p in bag_2.refusals())
    assert resolve.config_from_server_args(server_args).refusals() == []
    assert dataclasses.replace(bag_2, deterministic=False).refusals() == []  # not ours: nothing refused


def test_hook_table_entries_are_real_targets():
    import pkgutil

    for target, hook, kind in seed_hook.HOOKS:
        obj_path, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(obj_path), attr)), target
        assert kind in ("AROUND", "AFTER", "BEFORE") and callable(hook)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
