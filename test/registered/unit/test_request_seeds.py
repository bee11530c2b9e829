"""Request seeds (docs/design.md §6): the derivation, and SGLang's request path through the seed hooks.

The derivation is checked against the independent ``mmh3`` package and the
torch keyed-hash op. The request path runs SGLang 0.5.23's own
``TokenizerManager``, built by its own constructor (a tiny word-level
tokenizer and no model; its ZMQ IPC sockets bound as in a server), on CPU:
``generate_request`` (normalisation, ``n > 1`` expansion, ``SamplingParams``
construction and checks, request states, the send to the scheduler), its
output loop (meta_info, response streaming), and its OpenAI response
builders. Only the scheduler and detokenizer processes are a stand-in: it
connects to the manager's IPC sockets as they do, finishes every request at
once and echoes the seed it received over the wire, so the test sees exactly
what a scheduler would have been sent.
"""

import argparse
import asyncio
import dataclasses
import json
import re
import struct

import mmh3
import pytest
from _sglang_outputs import NO_PER_TOKEN_EXTRAS
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig, reset_config
from sglang_detspec.ops.seed_encoding import from_int64, to_int64
from sglang_detspec.ops.murmur import murmur3_x86_32
from sglang_detspec.seeds import derive_sample_seed, fresh_seed
from sglang_detspec.sglang_plugin import request_seeds

register_cpu_ci(est_time=90, suite="detspec-unit-cpu")

# The registry rows of the request-seed hooks, as (target, hook, kind).
SEED_ROWS = [(r.target, r.hook, r.kind) for r in sglang_plugin.registry_rows() if r.hook.__module__ == request_seeds.__name__]

U32, U64 = 1 << 32, 1 << 64
SAMPLE_SALT = 0x53414D504C450000  # docs/design.md §2: the SAMPLE stream's salt, written out as an oracle
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
    missing = [(t, h, k) for t, h, k in SEED_ROWS if h not in listed]
    for target, hook, kind in missing:
        HookRegistry.register(target, hook, HookType[kind])
    if missing:
        HookRegistry.apply_hooks()
    yield
    reset_config()


@pytest.fixture(scope="module")
def model_with_tokenizer(model_dir, tmp_path_factory):
    """The tiny Llama config plus a word-level tokenizer of its 1000 ids ("t0" .. "t999"), built here:
    the OpenAI endpoints need the text of a tokenizer-ful server (--skip-tokenizer-init outputs have none)."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tiny_llama_tokenizer")
    shutil.copy(f"{model_dir}/config.json", d)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(1000)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", eos_token="t1").save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def server_args(model_with_tokenizer):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sa = ServerArgs.from_cli_args(parser.parse_args([
        "--model-path", model_with_tokenizer, "--device", "cuda", "--attention-backend", "triton",
        "--enable-deterministic-inference", "--served-model-name", "m"]))
    sa.resolve_once()
    return sa


def finished_output(tokenized, output_ids):
    """A real ``BatchStrOutput`` finishing one request with ``output_ids`` and an empty text, as SGLang's
    detokenizer sends it to the tokenizer manager; fields unrelated to the meta_info left empty."""
    from array import array

    from sglang.srt.managers.io_struct import BatchStrOutput
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    return BatchStrOutput(
        rids=[tokenized.rid], finished_reasons=[FINISH_LENGTH(1).to_json()], output_strs=[""],
        output_ids=[array("q", output_ids)], prompt_tokens=[len(tokenized.input_ids)], completion_tokens=[1],
        reasoning_tokens=[0], cached_tokens=[0],
        **NO_PER_TOKEN_EXTRAS,
        retraction_counts=[0],
    )


class Served:
    """SGLang's TokenizerManager, built by its own constructor, talking to a stand-in scheduler over IPC.

    The manager binds its ZMQ sockets and runs its own output loop
    (``handle_loop``, started by ``generate_request``) on an event loop in a
    background thread. The stand-in is a task on that loop that plays the
    scheduler and the detokenizer: it connects to the manager's sockets as
    they do (``scheduler_components/ipc_channels.py``: PULL from
    ``scheduler_input_ipc_name``; ``detokenizer_manager.py``: PUSH to
    ``tokenizer_ipc_name``), finishes every request it receives at once,
    with the ``sampling_seed`` it received as the only output token id (no
    token for a request without a seed), and keeps what it received in
    :attr:`sent`.
    """

    def __init__(self, server_args):
        import threading

        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.server_args import PortArgs

        self.port_args = PortArgs.init_new(server_args)
        self.manager = TokenizerManager(server_args, self.port_args, start_pd_bootstrap_service=False)
        self.sent = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="served-loop", daemon=True)
        self._thread.start()
        self._scheduler = asyncio.run_coroutine_threadsafe(self._schedule(), self.loop)

    async def _schedule(self):
        import zmq
        import zmq.asyncio
        from sglang.srt.managers.io_struct import async_sock_recv, async_sock_send
        from sglang.srt.utils.network import get_zmq_socket

        context = zmq.asyncio.Context(2)
        recv = get_zmq_socket(context, zmq.PULL, self.port_args.scheduler_input_ipc_name, False)
        send = get_zmq_socket(context, zmq.PUSH, self.port_args.tokenizer_ipc_name, False)
        try:
            while True:
                message = await async_sock_recv(recv)
                for tokenized in getattr(message, "batch", None) or [message]:  # one request or a batched send
                    if hasattr(tokenized, "sampling_params"):  # not an abort or control message
                        self.sent.append(tokenized)
                        seed = tokenized.sampling_params.sampling_seed
                        await async_sock_send(send, finished_output(tokenized, [] if seed is None else [seed]))
        finally:
            context.destroy(linger=0)

    def run(self, coro, timeout=60):
        """Run ``coro`` on the manager's event loop; its result, or its exception raised here."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        import os

        async def cancel_all():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        # The manager's sockets share one ZMQ context (tokenizer_manager.py:677-689). Left to the
        # garbage collector, its __del__ waits without end for a socket's unsent messages, at
        # whatever later moment the collector runs: close them all now, dropping what is unsent.
        self.manager.recv_from_detokenizer.context.destroy(linger=0)
        self.loop.close()
        for name in (self.port_args.tokenizer_ipc_name, self.port_args.scheduler_input_ipc_name,
                     self.port_args.detokenizer_ipc_name, self.port_args.rpc_ipc_name,
                     self.port_args.metrics_ipc_name):
            if name and name.startswith("ipc://") and os.path.exists(name[len("ipc://"):]):
                os.unlink(name[len("ipc://"):])


@pytest.fixture(scope="module")
def served(hooked, server_args):
    """SGLang's TokenizerManager with the plugin's hooks, from SGLang's own constructor, and its stand-in scheduler."""
    from sglang.srt.runtime_context import publish, reset_context

    publish(server_args, role="tokenizer")  # as SGLang's server entry does before it builds the manager
    served = Served(server_args)
    yield served
    served.close()
    reset_context()


def generate(served, **fields):
    """SGLang's TokenizerManager.generate_request for a native /generate body: every output."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    async def run():
        return [out async for out in served.manager.generate_request(GenerateReqInput(**fields), None)]

    served.sent.clear()
    outs = served.run(run())
    return outs[0] if len(outs) == 1 and isinstance(outs[0], list) else outs


def echoed(out) -> int | None:
    """The sampling_seed the scheduler received for this output, as a uint64 (None: none)."""
    ids = out["output_ids"]
    return from_int64(ids[0]) if ids else None


SAMPLED = {"temperature": 1.0, "max_new_tokens": 4}


def test_unseeded_requests_get_fresh_reported_seeds(served, bag):
    bag(ACTIVE)
    outs = [generate(served, input_ids=[1, 2, 3], sampling_params=dict(SAMPLED))[0] for _ in range(4)]
    reported = [o["meta_info"]["sampling_seed"] for o in outs]
    assert len(set(reported)) == 4 and all(0 <= s < U64 for s in reported)
    assert reported == [echoed(o) for o in outs]


def test_seeded_request_keeps_its_seed_and_seeds_above_2_63_travel_as_int64(served, bag):
    bag(ACTIVE)
    for seed in (0, 42, 2**63, U64 - 1):
        (out,) = generate(served, input_ids=[1, 2], sampling_params={**SAMPLED, "sampling_seed": seed})
        assert out["meta_info"]["sampling_seed"] == seed == echoed(out)
        assert served.sent[-1].sampling_params.sampling_seed == to_int64(seed)


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 0.7, "top_k": 1}])
def test_greedy_requests_get_no_seed_and_report_null(served, bag, params):
    bag(ACTIVE)
    (out,) = generate(served, input_ids=[1, 2], sampling_params={"max_new_tokens": 4, **params})
    assert "sampling_seed" in out["meta_info"] and out["meta_info"]["sampling_seed"] is None
    assert echoed(out) is None
    (out,) = generate(served, input_ids=[1, 2], sampling_params={"max_new_tokens": 4, "sampling_seed": 9, **params})
    assert out["meta_info"]["sampling_seed"] is None  # greedy: the seed is not used


def test_parallel_samples_use_derived_seeds(served, bag):
    bag(ACTIVE)
    outs = generate(served, input_ids=[5, 6, 7], sampling_params={**SAMPLED, "sampling_seed": 42, "n": 4})
    want = [derive_sample_seed(42, j) for j in range(4)]
    assert [o["meta_info"]["sampling_seed"] for o in outs] == want == [echoed(o) for o in outs]
    assert want[0] == 42 and len(set(want)) == 4
    # SGLang prefills the shared prompt once (max_new_tokens = 0) before the samples: seed unchanged.
    warmups = [t for t in served.sent if t.sampling_params.max_new_tokens == 0]
    assert len(warmups) == 1 and warmups[0].sampling_params.sampling_seed == 42
    # n = 1 is sample 0 of n = 4.
    (single,) = generate(served, input_ids=[5, 6, 7], sampling_params={**SAMPLED, "sampling_seed": 42})
    assert echoed(single) == echoed(outs[0])


def test_unseeded_parallel_samples_derive_from_one_fresh_seed(served, bag):
    bag(ACTIVE)
    outs = generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "n": 3})
    seeds = [o["meta_info"]["sampling_seed"] for o in outs]
    assert seeds == [derive_sample_seed(seeds[0], j) for j in range(3)] == [echoed(o) for o in outs]


def test_batch_of_prompts_with_n_and_mixed_seeds(served, bag):
    bag(ACTIVE)
    # SGLang returns prompt i's sample j at i * n + j.
    outs = generate(served, input_ids=[[1, 2], [3, 4]],
                    sampling_params=[{**SAMPLED, "sampling_seed": 7, "n": 2},
                                     {**SAMPLED, "sampling_seed": 2**64 - 2, "n": 2}])
    assert [o["meta_info"]["sampling_seed"] for o in outs] == [
        7, derive_sample_seed(7, 1), 2**64 - 2, derive_sample_seed(2**64 - 2, 1)] == [echoed(o) for o in outs]
    outs = generate(served, input_ids=[[1, 2], [3, 4], [5]],
                    sampling_params=[{**SAMPLED, "sampling_seed": 3}, dict(SAMPLED), {"temperature": 0.0}])
    seeds = [o["meta_info"]["sampling_seed"] for o in outs]
    assert seeds[0] == 3 and seeds[1] is not None and seeds[1] != 3 and seeds[2] is None
    assert seeds == [echoed(o) for o in outs]


def test_streamed_outputs_report_the_seed(served, bag):
    bag(ACTIVE)
    outs = generate(served, input_ids=[1, 2], stream=True, sampling_params={**SAMPLED, "sampling_seed": 11, "n": 2})
    assert sorted(o["meta_info"]["sampling_seed"] for o in outs) == sorted([11, derive_sample_seed(11, 1)])
    assert all(o["meta_info"]["sampling_seed"] == echoed(o) for o in outs)


def test_seed_check_covers_parallel_and_batched_requests(served, bag):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=r"sampling_seed must be in \[0, 2\*\*64 - 1\]"):
        generate(served, input_ids=[1], sampling_params={**SAMPLED, "sampling_seed": -1, "n": 2})
    with pytest.raises(ValueError, match=r"sampling_seed must be in \[0, 2\*\*64 - 1\]"):
        generate(served, input_ids=[[1], [2]], sampling_params=[dict(SAMPLED), {**SAMPLED, "sampling_seed": U64}])


def test_inactive_bag_leaves_sglang_alone(served, bag):
    bag(INACTIVE)
    outs = generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "sampling_seed": 42, "n": 3})
    assert all("sampling_seed" not in o["meta_info"] for o in outs)
    assert [echoed(o) for o in outs] == [42, 42, 42]  # SGLang's own n > 1: one shared seed
    (out,) = generate(served, input_ids=[5], sampling_params=dict(SAMPLED))
    assert echoed(out) is None  # SGLang's own: the scheduler substitutes 42


# -- OpenAI-compatible endpoints ---------------------------------------------------------


def openai_completion(served, **fields):
    """SGLang's /v1/completions handler for a non-streamed request: the response model."""
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager

    serving = OpenAIServingCompletion(served.manager, TemplateManager())
    request = CompletionRequest(model="m", prompt=[1, 2, 3], max_tokens=4, **fields)
    adapted, request = serving._convert_to_internal_request(request)
    served.sent.clear()
    return served.run(serving._handle_non_streaming_request(adapted, request, None))


def test_openai_completions_seed_and_n(served, bag):
    bag(ACTIVE)
    response = openai_completion(served, temperature=1.0, seed=5, n=3)
    want = [derive_sample_seed(5, j) for j in range(3)]
    assert [c.sampling_seed for c in response.choices] == want
    samples = [t for t in served.sent if t.sampling_params.max_new_tokens]  # not the shared-prompt prefill
    assert [from_int64(t.sampling_params.sampling_seed) for t in samples] == want
    body = json.loads(response.model_dump_json())
    assert [c["sampling_seed"] for c in body["choices"]] == want
    # Unseeded: a fresh seed, its samples derived from it.
    seeds = [c.sampling_seed for c in openai_completion(served, temperature=1.0, n=2).choices]
    assert seeds[1] == derive_sample_seed(seeds[0], 1)
    # Greedy: null in every choice.
    body = json.loads(openai_completion(served, temperature=0.0).model_dump_json())
    assert "sampling_seed" in body["choices"][0] and body["choices"][0]["sampling_seed"] is None


def test_openai_chat_choices_report_their_seeds(served, bag):
    # Chat requests reach the tokenizer manager as /generate bodies with the same seed and n (the
    # conversion needs a chat template); the chat response builder is SGLang's own.
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.template_manager import TemplateManager

    bag(ACTIVE)
    serving = OpenAIServingChat(served.manager, TemplateManager())
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], n=2, seed=U64 - 3,
                                    temperature=1.0)
    ret = generate(served, input_ids=[1, 2, 3], sampling_params={**SAMPLED, "sampling_seed": U64 - 3, "n": 2})
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

    for target, hook, kind in SEED_ROWS:
        obj_path, attr = target.rsplit(".", 1)
        assert callable(getattr(pkgutil.resolve_name(obj_path), attr)), target
        assert kind in ("AROUND", "AFTER", "BEFORE") and callable(hook)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
