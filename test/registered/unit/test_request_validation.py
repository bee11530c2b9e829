"""Bad requests get a clear error before the scheduler; a missing hook target stops start-up.

Request validation goes through SGLang's own ``TokenizerManager.generate_request``
(the ``served`` of ``test_request_seeds.py``, model vocabulary 1000, context
2048), the path of ``/generate`` and ``Engine.generate``, and through SGLang's
own ``/v1/completions`` and ``/v1/chat/completions`` handlers: every rule of
``request_rules.RULES`` (token ids outside the vocabulary, ``n``, a batch's
per-request lists, ``sampling_seed``, logprob fields, ``top_k``,
``min_new_tokens``, stop ids, logit bias, grammars, number types) refuses a bad value with a ``ValueError`` naming the field, value and
bound and carrying the rule's code (SGLang's HTTP server answers it with 400),
and the request never reaches the scheduler; ``top_k`` above 2**30 is clamped. The batch rule
covers every list SGLang's real ``GenerateReqInput.__getitem__`` indexes (read from its source),
each shorter and longer than the batch, where SGLang alone fails. The hook table: every
required target resolves in the installed SGLang and is wrapped after
``load_plugins``; a target that is missing or unpatched is named, with the
SGLang version, by the start-up check and by ``detspec serve --dry-run``.
"""

import json
import re
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig
from sglang_detspec.sglang_plugin import request_rules, request_validation
from test_request_seeds import ACTIVE, generate, hooked, model_with_tokenizer, served, server_args  # noqa: F401

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

SAMPLED = {"temperature": 1.0, "max_new_tokens": 4, "sampling_seed": 3}


@pytest.mark.parametrize("input_ids, message", [
    ([5000, 7], "input_ids[0] = 5000 is outside the model's vocabulary: token ids must be in [0, 1000)"),
    ([1, -1], "input_ids[1] = -1 is outside the model's vocabulary: token ids must be in [0, 1000)"),
    ([1, 2, 1000], "input_ids[2] = 1000 is outside"),
    ([1, 2.0], "input_ids[1] must be an integer token id in [0, 1000), got 2.0"),
    ([True, 2], "input_ids[0] must be an integer token id in [0, 1000), got True"),
])
def test_out_of_vocabulary_and_non_integer_ids_are_refused(served, bag, input_ids, message):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(message)):
        generate(served, input_ids=input_ids, sampling_params=dict(SAMPLED))
    assert served.sent == []  # nothing reached the scheduler


def test_batched_and_parallel_requests_are_checked_per_request(served, bag):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape("input_ids[1] = 4096 is outside")):
        generate(served, input_ids=[[1, 2], [3, 4096]], sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    with pytest.raises(ValueError, match=re.escape("input_ids[0] = -5 is outside")):
        generate(served, input_ids=[-5, 2], sampling_params={**SAMPLED, "n": 3})
    outs = generate(served, input_ids=[[1, 2], [3, 999]], sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    assert len(outs) == 2  # ids at the bounds pass


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True, None, request_rules.MAX_N + 1, 10**6])
def test_n_outside_its_range_or_not_an_integer_is_refused(served, bag, n):
    bag(ACTIVE)
    message = f"n must be an integer in [1, {request_rules.MAX_N}] (samples per prompt), got {n!r}"
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        generate(served, input_ids=[1, 2], sampling_params={**SAMPLED, "n": n})
    assert caught.value.code == "n_out_of_range" and served.sent == []


def test_only_active_runs_are_checked(served, bag):
    for inactive in (DetSpecConfig(source="server_args"),  # no --enable-deterministic-inference
                     DetSpecConfig(deterministic=True, disabled=True, source="server_args")):  # DISABLE=1
        bag(inactive)  # SGLang's own path, untouched
        served.sent.clear()
        generate(served, input_ids=[1000], sampling_params=dict(SAMPLED))
        assert len(served.sent) == 1


def test_multimodal_requests_and_text_vocabularies_are_left_to_sglang(served, bag):
    from types import SimpleNamespace

    from sglang.srt.managers.io_struct import GenerateReqInput

    bag(ACTIVE)
    calls = []
    text_model = SimpleNamespace(vocab_size=16512, hf_text_config=SimpleNamespace(vocab_size=168064))
    assert request_rules.embedding_rows(text_model) == 168064
    with_image = GenerateReqInput(input_ids=[128256, 5], image_data=["img"], sampling_params={})
    request_validation.validate_request(lambda *a: calls.append(a), served.manager, with_image, [128256, 5])
    assert len(calls) == 1  # placeholder ids beyond the vocabulary: SGLang's processors own them


def test_check_input_ids_accepts_tensors_and_empty():
    torch = pytest.importorskip("torch")
    request_rules.check_input_ids(torch.tensor([0, 999]), 1000)
    request_rules.check_input_ids([], 1000)
    with pytest.raises(ValueError, match=re.escape("input_ids[1] = 1000")):
        request_rules.check_input_ids(torch.tensor([0, 1000]), 1000)


def test_an_empty_prompt_is_refused_alone_and_in_a_batch(served, bag):
    # An empty prompt in a batch ended an H200 tree server: the last-position gather's device-side assert.
    bag(ACTIVE)
    with pytest.raises(ValueError, match="input_ids cannot be empty"):  # SGLang refuses a single one itself
        generate(served, input_ids=[], sampling_params=dict(SAMPLED))
    assert served.sent == []
    for ids in ([[5, 6], []], [[], [5, 6], [7]]):  # but not an element of a batch
        with pytest.raises(ValueError, match=re.escape("input_ids must hold at least one token")) as caught:
            generate(served, input_ids=ids, sampling_params=[dict(SAMPLED) for _ in ids])
        assert caught.value.code == "input_ids_empty" and served.sent == []


# -- the rules of request_rules.RULES, through SGLang's request path ----------------------


def test_the_known_killer_is_refused_naming_field_value_and_bound(served, bag):
    # top_logprobs_num past the vocabulary: logprobs.topk(max_k) raised in the scheduler and the server died.
    bag(ACTIVE)
    with pytest.raises(ValueError) as caught:
        generate(served, input_ids=[5, 6], return_logprob=True, top_logprobs_num=1000000,
                 sampling_params={"max_new_tokens": 4, "temperature": 1.0})
    message = str(caught.value)
    assert "top_logprobs_num" in message and "[0, 1000]" in message and "got 1000000" in message
    assert message.endswith("(error code: top_logprobs_num_out_of_range)")
    assert caught.value.code == "top_logprobs_num_out_of_range" and served.sent == []


BIG_GRAMMAR = "a" * (request_rules.MAX_GRAMMAR_BYTES + 1)


@pytest.mark.parametrize("fields, params, code, words", [
    ({"top_logprobs_num": -1, "return_logprob": True}, {}, "top_logprobs_num_out_of_range", "got -1"),
    ({"top_logprobs_num": 1001, "return_logprob": True}, {}, "top_logprobs_num_out_of_range", "[0, 1000]"),
    # Without return_logprob too: the scheduler takes max(top_logprobs_num) over every request of a logprob batch.
    ({"top_logprobs_num": 5000}, {}, "top_logprobs_num_out_of_range", "got 5000"),
    ({"token_ids_logprob": [3, 1000], "return_logprob": True}, {}, "token_ids_logprob_out_of_vocabulary",
     "token_ids_logprob[1] must be a token id in [0, 1000), got 1000"),
    ({"token_ids_logprob": [-1], "return_logprob": True}, {}, "token_ids_logprob_out_of_vocabulary", "got -1"),
    ({"logprob_start_len": -2, "return_logprob": True}, {}, "logprob_start_len_out_of_range", "[-1, 2]"),
    ({"logprob_start_len": 3, "return_logprob": True}, {}, "logprob_start_len_out_of_range", "got 3"),
    ({}, {"min_new_tokens": 2**40, "max_new_tokens": None}, "min_new_tokens_out_of_range", "[0, 2048]"),
    ({}, {"stop_token_ids": [7, 1000]}, "stop_token_ids_out_of_vocabulary", "[0, 1000), got 1000"),
    ({}, {"stop_token_ids": [-3], "min_new_tokens": 2}, "stop_token_ids_out_of_vocabulary", "got -3"),
    ({}, {"logit_bias": {"5": "x"}}, "logit_bias_invalid", "must be a finite number in float32's range"),
    ({}, {"logit_bias": {"5": float("inf")}}, "logit_bias_invalid", "got inf"),
    ({}, {"logit_bias": {"5": 1e308}}, "logit_bias_invalid", "[-3.402823e+38, 3.402823e+38], got 1e+308"),
    ({}, {"logit_bias": {"1000": 1.0}}, "logit_bias_invalid", "keys must be token ids in [0, 1000), got '1000'"),
    ({}, {"temperature": "hot"}, "sampling_param_not_a_number", "sampling_params.temperature must be a number"),
    ({}, {"top_p": [0.5]}, "sampling_param_not_a_number", "sampling_params.top_p"),
    ({}, {"top_k": 2.5}, "top_k_not_integer", "sampling_params.top_k must be an integer"),
    ({}, {"regex": BIG_GRAMMAR}, "grammar_too_large", f"at most {request_rules.MAX_GRAMMAR_BYTES} bytes"),
    ({}, {"json_schema": {"type": "object"}}, "grammar_invalid", "sampling_params.json_schema must be a string"),
    ({}, {"sampling_seed": -1}, "sampling_seed_out_of_range", "sampling_seed must be in [0, 2**64 - 1]"),
    ({}, {"sampling_seed": 2**64}, "sampling_seed_out_of_range", "got 18446744073709551616"),
])
def test_each_rule_refuses_with_its_code(served, bag, fields, params, code, words):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(words)) as caught:
        generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, **params}, **fields)
    assert caught.value.code == code and str(caught.value).endswith(f"(error code: {code})")
    assert served.sent == []


def test_the_seed_rule_runs_with_the_table_before_sglangs_verify(served, bag, monkeypatch):
    """The table refuses a bad seed where every other rule runs, before ``SamplingParams`` exists."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    bag(ACTIVE)
    built, normalize = [], SamplingParams.normalize
    monkeypatch.setattr(SamplingParams, "normalize",  # SGLang's own, watched: it runs before verify
                        lambda self, *a, **k: (built.append(self), normalize(self, *a, **k))[1])
    with pytest.raises(ValueError, match="sampling_seed must be in") as caught:
        generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "sampling_seed": -5})
    assert caught.value.code == "sampling_seed_out_of_range" and built == []


def test_a_seed_above_2_63_shared_by_a_batch_reaches_every_request(served, bag):
    """SGLang gives every request of a batch the same parameter dict: the table only checks the seed, so
    each request's SamplingParams gets the int64 form once."""
    bag(ACTIVE)
    seed = 2**63 + 5
    outs = generate(served, input_ids=[[5, 6], [7, 8], [9, 10]], sampling_params={**SAMPLED, "sampling_seed": seed})
    assert [o["meta_info"]["sampling_seed"] for o in outs] == [seed] * 3
    assert [s.sampling_params.sampling_seed for s in served.sent] == [seed - 2**64] * 3


def test_values_at_the_bounds_pass(served, bag):
    bag(ACTIVE)
    outs = generate(served, input_ids=[5, 6], return_logprob=True, top_logprobs_num=1000, logprob_start_len=2,
                    token_ids_logprob=[0, 999],
                    sampling_params={**SAMPLED, "min_new_tokens": 2, "stop_token_ids": [0, 999],
                                     "logit_bias": {"999": -100.0}, "n": 2})
    assert len(outs) == 2 and all(t.top_logprobs_num == 1000 for t in served.sent)


def test_top_k_above_the_whole_vocabulary_is_clamped(served, bag):
    # SGLang packs top_k into an int32 tensor; anything >= 2**30 already means the whole vocabulary.
    bag(ACTIVE)
    generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "top_k": 2**40})
    assert served.sent[-1].sampling_params.top_k == request_rules.TOP_K_ALL
    generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "top_k": 7})
    assert served.sent[-1].sampling_params.top_k == 7


def test_a_batch_with_one_bad_request_is_refused_whole(served, bag):
    # One request without logprobs asks for a huge top_logprobs_num, the other asks for logprobs:
    # in one scheduler batch the first one's number would size the second one's topk.
    bag(ACTIVE)
    with pytest.raises(ValueError, match="top_logprobs_num") as caught:
        generate(served, input_ids=[[1, 2], [3, 4]], return_logprob=[False, True], top_logprobs_num=[10**6, 2],
                 sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    assert caught.value.code == "top_logprobs_num_out_of_range" and served.sent == []
    with pytest.raises(ValueError, match="stop_token_ids"):
        generate(served, input_ids=[[1, 2], [3, 4]],
                 sampling_params=[dict(SAMPLED), {**SAMPLED, "stop_token_ids": [5000], "min_new_tokens": 1}])
    assert served.sent == []


@pytest.mark.parametrize("fields, code, words", [
    # SGLang indexes a batch's lists per request: a short one raised IndexError (HTTP 500).
    ({"input_ids": [[1, 2], [3, 4]], "sampling_params": [dict(SAMPLED)]}, "batch_length_mismatch",
     "sampling_params must give one entry per request of the batch (2), got a list of 1"),
    ({"input_ids": [[1, 2], [3, 4]], "sampling_params": dict(SAMPLED), "top_logprobs_num": [1, 2, 3]},
     "batch_length_mismatch", "top_logprobs_num must give one entry per request of the batch (2)"),
    ({"input_ids": [1, 2], "sampling_params": []}, "batch_length_mismatch", "(1), got a list of 0"),
    ({"input_ids": [[1, 2]], "sampling_params": [5]}, "batch_length_mismatch", "sampling_params[0] must be an object"),
    # text sets the batch size beside input_ids, which __getitem__ then indexes per request (found by the
    # H200 fuzz of 2026-12-04: a flat input_ids beside 64 texts was an IndexError, HTTP 500).
    ({"text": ["a"] * 64, "input_ids": [1, 2, 3], "sampling_params": dict(SAMPLED)}, "batch_length_mismatch",
     "input_ids beside a batch of text must give one list of token ids per request of the batch (64), got a list "
     "of 3"),
    ({"text": ["a", "b"], "input_ids": [5, 6], "sampling_params": dict(SAMPLED)}, "batch_length_mismatch",
     "per request of the batch (2), got input_ids[0] = 5 (not a list)"),
    ({"text": ["a", "b"], "input_ids": [[5], [6], [7]], "sampling_params": dict(SAMPLED)}, "batch_length_mismatch",
     "(2), got a list of 3"),
    # The rid is a dict key in the tokenizer manager: a list raised TypeError (HTTP 500).
    ({"input_ids": [1, 2], "sampling_params": dict(SAMPLED), "rid": []}, "rid_not_a_string", "rid must be a string"),
    ({"input_ids": [[1, 2], [3]], "sampling_params": dict(SAMPLED), "rid": ["a", 5]}, "rid_not_a_string", "got 5"),
])
def test_request_shapes_sglang_indexes_are_refused(served, bag, fields, code, words):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(words)) as caught:
        generate(served, **fields)
    assert caught.value.code == code and served.sent == []


def _indexed_per_request() -> set[str]:
    """The fields SGLang's ``GenerateReqInput.__getitem__(i)`` indexes with ``i``, read from its source
    (and from the methods it calls with ``i``)."""
    import ast
    import inspect
    import textwrap

    from sglang.srt.managers.io_struct import GenerateReqInput

    def subscripts(method) -> tuple[set[str], set[str]]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        fields, helpers = set(), set()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"
                    and isinstance(node.slice, ast.Name)):
                fields.add(node.value.attr)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
                    and any(isinstance(a, ast.Name) and a.id == "i" for a in node.args)):
                helpers.add(node.func.attr)
        return fields, helpers

    fields, helpers = subscripts(GenerateReqInput.__getitem__)
    for name in helpers:
        fields |= subscripts(getattr(GenerateReqInput, name))[0]
    return fields


# The prompt fields: SGLang counts the batch by them.
BATCH_SIZE_FIELDS = {"text", "input_ids", "input_embeds"}


def test_the_batch_rule_checks_every_list_sglang_indexes_per_request():
    """A field SGLang 0.5.23 starts to index per request, and the rule does not check, fails here."""
    indexed = _indexed_per_request()
    assert {"token_ids_logprob", "lora_path", "bootstrap_room", "positional_embed_overrides"} <= indexed  # the parse
    assert indexed - BATCH_SIZE_FIELDS == set(request_rules.PER_REQUEST_LISTS)


# One entry of each per-request list that SGLang's normalisation and __getitem__ take.
ENTRIES = {"sampling_params": {}, "rid": None, "image_data": None, "video_data": None, "audio_data": None,
           "mm_hashes": [], "mm_content_hashes": [], "modalities": None, "watermark": None, "return_logprob": False,
           "logprob_start_len": -1, "top_logprobs_num": 0, "token_ids_logprob": [5], "return_sampling_mask": False,
           "sampling_logprobs_mode": None, "return_hidden_states": False, "lora_path": None, "lora_id": None,
           "custom_logit_processor": None, "positional_embed_overrides": None, "bootstrap_host": None,
           "bootstrap_port": None, "bootstrap_room": None, "bootstrap_pair_key": None, "decode_tp_size": None,
           "extra_key": "k", "cache_salt": "k", "kv_hints": None, "multi_item_delimiter_indices": None,
           "token_indices_to_pool": None}


def batch_with(name: str, length: int, size: int = 3):
    """SGLang's real GenerateReqInput: a batch of ``size`` prompts whose ``name`` list has ``length`` entries."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    entries = [f"r{k}" if name == "rid" else ENTRIES[name] for k in range(length)]
    fields = {"input_ids": [[5, 6]] * size, "sampling_params": [{} for _ in range(size)], name: entries}
    return GenerateReqInput(**fields)


def sglang_reads(obj) -> None:
    """What SGLang does with a request before tokenizing it: normalise, then take each request of a batch."""
    obj.normalize_batch_and_arguments()
    for i in range(0 if obj.is_single else obj.batch_size):
        obj[i]


def test_every_per_request_list_of_the_right_length_passes_sglang_and_the_rule(hooked, bag):
    assert set(ENTRIES) == set(request_rules.PER_REQUEST_LISTS)
    for active in (DetSpecConfig(source="server_args"), ACTIVE):
        bag(active)
        for name in ENTRIES:
            sglang_reads(batch_with(name, 3))


@pytest.mark.parametrize("name", request_rules.PER_REQUEST_LISTS)
@pytest.mark.parametrize("length", [1, 2, 4])
def test_a_batch_list_of_another_length_is_refused_naming_field_size_and_length(hooked, bag, name, length):
    bag(ACTIVE)
    with pytest.raises(ValueError) as caught:
        sglang_reads(batch_with(name, length))
    assert caught.value.code == "batch_length_mismatch" and caught.value.field == name
    assert str(caught.value).startswith(
        f"{name} must give one entry per request of the batch (3), got a list of {length}")


def test_without_the_rule_sglang_fails_short_lists_with_an_index_error(hooked, bag):
    """Why the rule exists: SGLang's own reading of a short list (HTTP 500 on /generate) for the fields
    its normalisation does not count; it checks the others itself (a ValueError: HTTP 400)."""
    bag(DetSpecConfig(source="server_args"))
    index_errors, value_errors, silent = set(), set(), set()
    for name in request_rules.PER_REQUEST_LISTS:
        try:
            sglang_reads(batch_with(name, 2))
            silent.add(name)
        except IndexError:
            index_errors.add(name)
        except ValueError:
            value_errors.add(name)
    assert {"token_ids_logprob", "return_sampling_mask", "sampling_logprobs_mode", "lora_path", "lora_id",
            "custom_logit_processor", "bootstrap_host", "bootstrap_port", "bootstrap_room",
            "bootstrap_pair_key", "decode_tp_size", "sampling_params", "return_logprob"} <= index_errors
    assert {"rid", "watermark", "extra_key", "cache_salt", "return_hidden_states"} <= value_errors
    assert not silent, silent
    longer = batch_with("token_ids_logprob", 4)
    sglang_reads(longer)  # a longer list SGLang takes silently: the fourth entry is dropped
    assert len(longer.token_ids_logprob) == 4 and longer.batch_size == 3


def test_lists_sglang_reads_as_one_for_all_or_unset_pass(hooked, bag):
    from sglang.srt.managers.io_struct import GenerateReqInput

    bag(ACTIVE)
    for extra in ({"token_ids_logprob": [5, 6]},  # flat: every request's
                  {"token_ids_logprob": []}, {"image_data": []}, {"modalities": []},  # empty: not given
                  {"lora_path": None, "return_logprob": True}):  # scalars: every request's
        sglang_reads(GenerateReqInput(input_ids=[[5, 6]] * 3, sampling_params={}, **extra))
    # A single request's lists are SGLang's (only its parameter sets are indexed).
    sglang_reads(GenerateReqInput(input_ids=[5, 6], sampling_params={}, video_data=[None, None]))


def test_engine_generate_raises_in_the_callers_process(served, bag):
    """``sglang.Engine.generate`` (SGLang's own method, on an Engine whose tokenizer manager is ``served``'s)
    raises the rule's ValueError where it is called, before anything is sent."""
    import asyncio

    from sglang.srt.entrypoints.engine import Engine

    bag(ACTIVE)
    engine = object.__new__(Engine)  # SGLang's constructor would launch a scheduler; generate needs these two
    engine.tokenizer_manager, engine.loop = served.manager, asyncio.new_event_loop()
    served.sent.clear()
    try:
        for kwargs, code in (({"return_logprob": True, "top_logprobs_num": 10**6}, "top_logprobs_num_out_of_range"),
                             ({"sampling_params": {**SAMPLED, "top_k": 3.5}}, "top_k_not_integer"),
                             ({"sampling_params": {**SAMPLED, "logit_bias": {"3": "up"}}}, "logit_bias_invalid")):
            with pytest.raises(ValueError) as caught:
                engine.generate(input_ids=[5, 6], **{"sampling_params": dict(SAMPLED), **kwargs})
            assert caught.value.code == code
    finally:
        engine.loop.close()
    assert served.sent == []


def test_rules_leave_sglang_alone_when_inactive(served, bag):
    bag(DetSpecConfig(source="server_args"))  # no --enable-deterministic-inference: SGLang's own path
    generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "top_k": 2**40, "stop_token_ids": [5000]})
    assert served.sent[-1].sampling_params.top_k == 2**40


def openai_error(served, serving_cls, request):
    """SGLang's own OpenAI handler for ``request``: ``(HTTP status, error message)`` of its answer."""
    adapted, processed = serving_cls._convert_to_internal_request(request)
    served.sent.clear()
    response = served.run(serving_cls._handle_non_streaming_request(adapted, processed, None))
    body = json.loads(response.body)
    return response.status_code, body.get("message") or str(body)


def test_openai_logprobs_fields_are_refused_with_400(served, bag, model_with_tokenizer):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager

    bag(ACTIVE)
    completions = OpenAIServingCompletion(served.manager, TemplateManager())
    status, message = openai_error(served, completions, CompletionRequest(
        model="m", prompt=[1, 2, 3], max_tokens=4, logprobs=10**6))
    assert status == 400 and "logprobs" in message and "got 1000000" in message
    assert "top_logprobs_num_out_of_range" in message and served.sent == []
    status, message = openai_error(served, completions, CompletionRequest(
        model="m", prompt=[1, 2, 3], max_tokens=4, stop_token_ids=[4000], min_tokens=2))
    assert status == 400 and "stop_token_ids" in message and served.sent == []

    templates = TemplateManager()
    templates.load_chat_template(served.manager, "chatml", model_with_tokenizer)
    chat = OpenAIServingChat(served.manager, templates)
    status, message = openai_error(served, chat, ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "t5 t6"}], max_tokens=4, logprobs=True,
        top_logprobs=10**6))
    assert status == 400 and "top_logprobs" in message and "got 1000000" in message and served.sent == []


def test_docs_list_every_rule():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "request_fields.md").read_text()
    for rule in request_rules.RULES:
        assert f"`{rule.field}`" in doc and all(f"`{code}`" in doc for code in rule.codes), rule.field


# -- the hook table ---------------------------------------------------------------


def test_every_required_target_resolves_and_is_wrapped(hooked):
    rows = sglang_plugin.hook_table()
    required = [r for r in rows if not r.absent_ok and r.kind in sglang_plugin.REGISTRY_KINDS]
    assert required and all(sglang_plugin._resolve(r.target) is not None for r in required)
    assert sglang_plugin.hook_problems() == []


def fake_table(monkeypatch, *extra):
    rows = sglang_plugin.hook_table()
    monkeypatch.setattr(sglang_plugin, "hook_table", lambda: [*rows, *extra])


def test_a_missing_or_unpatched_target_is_named_with_the_sglang_version(hooked, monkeypatch, bag):
    missing = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.fast_sample_renamed", print, "AROUND")
    unpatched = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.select_top_k_tokens", print, "AROUND")
    optional = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.gone", print, "AROUND", "optional")
    fake_table(monkeypatch, missing, unpatched, optional)
    problems = sglang_plugin.hook_problems()
    assert problems == [
        "sglang.srt.speculative.spec_utils.fast_sample_renamed is not found in SGLang 0.5.23",
        "sglang.srt.speculative.spec_utils.select_top_k_tokens (SGLang 0.5.23) was not patched by SGLang's "
        "hook registry",
    ]
    bag(DetSpecConfig(deterministic=True, source="server_args"))
    with pytest.raises(RuntimeError, match="fast_sample_renamed is not found in SGLang 0.5.23"):
        sglang_plugin.check_hooks_in_place(None, None)
    bag(DetSpecConfig(source="server_args"))  # not ours: SGLang's own code runs anyway
    assert sglang_plugin.check_hooks_in_place(None, None) is None


def test_serve_dry_run_reports_a_missing_target(hooked, monkeypatch, model_dir):
    from sglang_detspec.cli import serve

    fake_table(monkeypatch, sglang_plugin.Hook("sglang.srt.layers.sampler.no_such_sampler", print, "AROUND"))
    _, problems = serve.startup_check(["--model-path", model_dir, "--enable-deterministic-inference"], {})
    assert "sglang.srt.layers.sampler.no_such_sampler is not found in SGLang 0.5.23" in problems


def test_docs_list_every_hooked_symbol():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "plugin.md").read_text()
    for row in sglang_plugin.hook_table():
        owner_and_name = ".".join(row.target.rsplit(".", 2)[-2:])  # e.g. TokenizerManager._validate_one_request
        assert owner_and_name in doc, row.target


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_seed_refusals_carry_stable_codes():
    """Every sampling_seed refusal names the field and ends with a stable code the audit client matches."""
    from sglang_detspec.sglang_plugin.request_rules import SEED_RANGE_CODE, SEED_TYPE_CODE, check_sampling_seed
    from sglang_detspec.sglang_plugin.request_rules import RequestRuleError

    for bad, code in ((-1, SEED_RANGE_CODE), (2**64, SEED_RANGE_CODE), (2.0**64, SEED_RANGE_CODE),
                      ("7", SEED_TYPE_CODE), (True, SEED_TYPE_CODE), (1.5, SEED_TYPE_CODE)):
        with pytest.raises(RequestRuleError) as info:
            check_sampling_seed(bad)
        assert info.value.code == code and info.value.field == "sampling_seed"
        assert str(info.value).startswith("sampling_seed must be") and str(info.value).endswith(f"(error code: {code})")
