"""The request-field rules: one table, applied in one place, before a request reaches the scheduler.

Each :class:`Rule` names a request field that SGLang 0.5.23 turns into a
tensor index, a tensor size, a loop bound or a compiled grammar, the bound
that keeps the scheduler alive, and whether a value outside it is refused
(``ValueError``: HTTP 400 on every endpoint, raised in the caller's process
by ``Engine.generate``) or clamped to a value of the same meaning.
docs/request_fields.md is the inventory behind the table: every such field,
who checks it, and what a bad value does.

Applied by :func:`check_request` (per request, after tokenization, with the
prompt's ids at hand) and :func:`check_whole` (the request as sent, before
SGLang expands it into its requests and samples: ``n``, the lengths of a
batch's per-request lists, ``rid``); the hooks that call them are in
``request_validation``. Rules apply only while the config bag is active
(:attr:`~sglang_detspec.config.DetSpecConfig.active`), like every other hook.

Every refusal is a :class:`RequestRuleError`: a ``ValueError`` whose message
names the field, the value sent and the bound, and ends with the rule's
stable machine-readable ``code`` (also an attribute), e.g.
``"... got 1000000 (error code: top_logprobs_num_out_of_range)"``.

The ``sampling_seed`` rule (:func:`check_sampling_seed`) is a row like the
others; ``request_validation`` also applies it where SGLang reads the seed
itself (its ``/generate`` schema gate and ``SamplingParams.verify``, where a
seed >= 2**63 is stored as the int64 with the same bits).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import NamedTuple

from ..ops.seed_encoding import HTTP_SEED_RANGE, to_int64

# SGLang's "whole vocabulary" top_k (sampling_params.TOP_K_ALL); SGLang packs top_k into an int32
# tensor (SamplingBatchInfo.from_schedule_batch), so anything at or above it means the same.
TOP_K_ALL = 1 << 30
# Samples per prompt: SGLang expands a request into n objects in the tokenizer manager's event
# loop before anything is sent, so n of a million stalls every request in flight.
MAX_N = 1024
# Largest json_schema / regex / ebnf / structural_tag string, in UTF-8 bytes.
MAX_GRAMMAR_BYTES = 1 << 20
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")
# SGLang adds logit_bias to the logits through a float32 tensor: larger magnitudes become inf there.
FLOAT32_MAX = 3.4028234663852886e38
REAL_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")


class RequestRuleError(ValueError):
    """A request field outside its rule.

    Attributes:
        code: the stable machine-readable code (one of ``Rule.codes``).
        field: the field as the request names it (``"sampling_params.top_k"``).
    """

    def __init__(self, code: str, field: str, message: str) -> None:
        super().__init__(f"{message} (error code: {code})")
        self.code = code
        self.field = field


class Limits(NamedTuple):
    """What the rules are measured against, from the served model.

    Attributes:
        vocab_size: width of the logits (SGLang's ``model_config.vocab_size``):
            ids that index logits or logprobs lie in ``[0, vocab_size)``.
        embedding_rows: ids a text prompt may hold (:func:`embedding_rows`).
        context_len: the model's context length in tokens.
    """

    vocab_size: int
    embedding_rows: int
    context_len: int


class Request(NamedTuple):
    """One request as the rules see it: the tokenizer manager's object and the prompt's ids."""

    obj: object  # SGLang's GenerateReqInput (one request of a batch)
    input_ids: object  # list / tensor of ids, or None
    limits: Limits


class Rule(NamedTuple):
    """One row of the table.

    Attributes:
        field: the request field (``sampling_params.<name>`` for a sampling parameter).
        codes: the stable machine-readable error codes it raises (a clamp's code names the clamp).
        bound: the admitted values, in words (docs/request_fields.md shows it).
        action: ``"refuse"`` (``RequestRuleError``) or ``"clamp"`` (value rewritten).
        protects: the SGLang symbol a bad value breaks.
        check: ``"request"`` stage: ``check(value, request) -> value`` (the value to
            keep: itself, or its clamp), called only for values present and not None;
            ``"whole"`` stage: ``check(obj)`` on the request as sent. Raises
            :class:`RequestRuleError`.
        stage: ``"request"`` (:func:`check_request`) or ``"whole"`` (:func:`check_whole`).
    """

    field: str
    codes: tuple[str, ...]
    bound: str
    action: str
    protects: str
    check: Callable[..., object]
    stage: str = "request"


def is_int(value: object) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _int_in(field: str, code: str, value: object, lo: int, hi: int, why: str) -> int:
    if not is_int(value) or not lo <= value <= hi:
        raise RequestRuleError(code, field, f"{field} must be an integer in [{lo}, {hi}] ({why}), got {value!r}")
    return value


def _ids_list(value: object, field: str, code: str) -> list:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise RequestRuleError(code, field, f"{field} must be a list of integer token ids, got {value!r:.80}")
    return list(value)


# -- the checks ---------------------------------------------------------------------


def check_input_ids(input_ids, vocab_size: int) -> None:
    """Every id an integer in ``[0, vocab_size)``.

    Args:
        input_ids: the request's token ids (list, tuple or 1-D tensor / array).
        vocab_size: the ids the model embeds.

    Raises:
        RequestRuleError: naming ``input_ids``, the first offending index and value, and the bound.
    """
    input_ids = _ids_list(input_ids, "input_ids", "input_ids_not_integer")
    if not input_ids:
        return
    # The common case in C-level passes: plain ints, all in range. Otherwise find the first bad one.
    if all(type(t) is int for t in input_ids) and 0 <= min(input_ids) and max(input_ids) < vocab_size:
        return
    for index, token in enumerate(input_ids):
        if not is_int(token):
            raise RequestRuleError("input_ids_not_integer", "input_ids",
                                   f"input_ids[{index}] must be an integer token id in [0, {vocab_size}), got {token!r}")
        if not 0 <= token < vocab_size:
            raise RequestRuleError(
                "input_ids_out_of_vocabulary", "input_ids",
                f"input_ids[{index}] = {token} is outside the model's vocabulary: token ids must be in "
                f"[0, {vocab_size})")


_MULTIMODAL = ("image_data", "video_data", "audio_data", "input_embeds")


def check_not_empty(input_ids) -> None:
    """A prompt holds at least one token.

    An empty prompt (``"input_ids": []``, alone or as one element of a batch,
    or a text that tokenizes to nothing) has no last token to decode from:
    SGLang 0.5.23 schedules it, and the batch's gather of each request's last
    position indexes out of bounds, a device-side assert that ends the
    scheduler with every request in flight (seen on an H200 tree server).

    Raises:
        RequestRuleError: ``input_ids_empty``.
    """
    if len(input_ids) == 0:
        raise RequestRuleError("input_ids_empty", "input_ids",
                               "input_ids must hold at least one token (the prompt is empty), got []")


def _input_ids(value, req: Request):
    check_not_empty(value)
    # Processors of image, video or audio data put placeholder ids beyond the text vocabulary.
    if not any(getattr(req.obj, name, None) is not None for name in _MULTIMODAL):
        check_input_ids(value, req.limits.embedding_rows)
    return value


def check_n(n: object) -> int:
    """``n`` (samples per prompt) an integer in ``[1, MAX_N]``; ``null`` is refused too.

    Raises:
        RequestRuleError: naming ``n``, the value and the bound.
    """
    return _int_in("n", "n_out_of_range", n, 1, MAX_N, "samples per prompt")


def _param_sets(obj) -> list:
    params = getattr(obj, "sampling_params", None)
    return params if isinstance(params, list) else [params]


def _n_of_every_set(obj) -> None:
    for params in _param_sets(obj):
        if isinstance(params, dict) and "n" in params:
            check_n(params["n"])


# Every field io_struct.GenerateReqInput.__getitem__ (SGLang 0.5.23) indexes with the request's
# position in a batch, except the prompt fields that set the batch size (text, input_ids,
# input_embeds). SGLang's own normalisation checks the length of some (rid, image_data, mm_hashes,
# watermark, return_hidden_states, extra_key, cache_salt, kv_hints); for the others a short list is
# an IndexError (HTTP 500) and a long one is silently cut. test_request_validation.py reads
# __getitem__'s source and fails when SGLang indexes a field missing here.
PER_REQUEST_LISTS = (
    "sampling_params", "rid", "image_data", "video_data", "audio_data", "mm_hashes", "mm_content_hashes",
    "modalities", "watermark", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
    "return_sampling_mask", "sampling_logprobs_mode", "return_hidden_states", "lora_path", "lora_id",
    "custom_logit_processor", "positional_embed_overrides", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "extra_key", "cache_salt", "kv_hints",
    "multi_item_delimiter_indices", "token_indices_to_pool",
)
# Fields whose empty list SGLang reads as "not given" (``if not x`` / ``if x`` before indexing).
EMPTY_MEANS_UNSET = ("image_data", "modalities", "token_ids_logprob")


def is_per_request_list(name: str, value: object) -> bool:
    """Whether ``value`` of field ``name`` is a list SGLang indexes per request of a batch.

    A list is per request, except an empty one of :data:`EMPTY_MEANS_UNSET`
    and a flat ``token_ids_logprob`` (first element not a list), which SGLang
    gives every request of the batch (``_normalize_logprob_params``).
    """
    if not isinstance(value, list):
        return False
    if not value:
        return name not in EMPTY_MEANS_UNSET
    return name != "token_ids_logprob" or isinstance(value[0], list)


def _batch_lists(obj) -> None:
    single = getattr(obj, "is_single", True)
    size = 1 if single else getattr(obj, "batch_size", None)
    params = getattr(obj, "sampling_params", None)
    if isinstance(params, list):
        for index, one in enumerate(params):
            if not isinstance(one, dict):
                raise RequestRuleError("batch_length_mismatch", "sampling_params",
                                       f"sampling_params[{index}] must be an object, got {one!r:.80}")
    if size is None:
        return
    _ids_beside_text(obj, single, size)
    # A single request's lists are SGLang's to read (e.g. several images of one prompt); only its
    # parameter sets are indexed.
    for name in PER_REQUEST_LISTS if not single else ("sampling_params",):
        value = getattr(obj, name, None)
        if is_per_request_list(name, value) and len(value) != size:
            raise RequestRuleError(
                "batch_length_mismatch", name,
                f"{name} must give one entry per request of the batch ({size}), got a list of {len(value)}")


def _ids_beside_text(obj, single: bool, size: int) -> None:
    # ``text`` sets a batch's size when both prompt fields are given; __getitem__ then indexes
    # ``input_ids`` per request like any other list (a flat list there: IndexError, HTTP 500).
    ids = getattr(obj, "input_ids", None)
    if single or getattr(obj, "text", None) is None or ids is None:
        return
    if not isinstance(ids, list) or len(ids) != size:
        got = f"a list of {len(ids)}" if isinstance(ids, list) else type(ids).__name__
    else:
        bad = next((i for i, one in enumerate(ids) if not isinstance(one, list)), None)
        if bad is None:
            return
        got = f"input_ids[{bad}] = {ids[bad]!r:.40} (not a list)"
    raise RequestRuleError(
        "batch_length_mismatch", "input_ids",
        f"input_ids beside a batch of text must give one list of token ids per request of the batch "
        f"({size}), got {got}")


def _rid(obj) -> None:
    rid = getattr(obj, "rid", None)
    single = getattr(obj, "is_single", True)
    rids = [rid] if single or not isinstance(rid, list) else rid
    for one in rids:
        if one is not None and not isinstance(one, str):
            where = "rid" if single or not isinstance(rid, list) else "rid[...]"
            raise RequestRuleError("rid_not_a_string", "rid",
                                   f"{where} must be a string (one per request in a batch), got {one!r:.80}")


def _top_logprobs_num(value, req: Request):
    vocab = req.limits.vocab_size
    if not is_int(value) or not 0 <= value <= vocab:
        raise RequestRuleError(
            "top_logprobs_num_out_of_range", "top_logprobs_num",
            f"top_logprobs_num (/v1/completions: logprobs, /v1/chat/completions: top_logprobs) must be an "
            f"integer in [0, {vocab}] (the model's vocabulary size), got {value!r}")
    return value


def _token_ids_logprob(value, req: Request):
    vocab = req.limits.vocab_size
    for index, token in enumerate(_ids_list(value, "token_ids_logprob", "token_ids_logprob_out_of_vocabulary")):
        if not is_int(token) or not 0 <= token < vocab:
            raise RequestRuleError(
                "token_ids_logprob_out_of_vocabulary", "token_ids_logprob",
                f"token_ids_logprob[{index}] must be a token id in [0, {vocab}), got {token!r}")
    return value


def _logprob_start_len(value, req: Request):
    if not getattr(req.obj, "return_logprob", False):
        return value  # SGLang's scheduler sets it to -1 without return_logprob
    prompt = len(_ids_list(req.input_ids, "input_ids", "input_ids_not_integer")) if req.input_ids is not None else None
    if prompt is None:
        return value
    return _int_in("logprob_start_len", "logprob_start_len_out_of_range", value, -1, prompt,
                   "-1: output tokens only; else a position in the prompt")


def _top_k(value, req: Request):
    if not is_int(value):
        raise RequestRuleError("top_k_not_integer", "sampling_params.top_k",
                               f"sampling_params.top_k must be an integer (-1 or >= 1), got {value!r}")
    return TOP_K_ALL if value > TOP_K_ALL else value  # SGLang refuses 0 and values below -1 itself


def _min_new_tokens(value, req: Request):
    return _int_in("sampling_params.min_new_tokens", "min_new_tokens_out_of_range", value, 0,
                   req.limits.context_len, "the model's context length")


def _stop_token_ids(value, req: Request):
    vocab = req.limits.vocab_size
    if not isinstance(value, (list, tuple, set)):
        raise RequestRuleError("stop_token_ids_out_of_vocabulary", "sampling_params.stop_token_ids",
                               f"sampling_params.stop_token_ids must be a list of token ids, got {value!r:.80}")
    for token in value:
        if token is not None and (not is_int(token) or not 0 <= token < vocab):
            raise RequestRuleError(
                "stop_token_ids_out_of_vocabulary", "sampling_params.stop_token_ids",
                f"sampling_params.stop_token_ids must hold token ids in [0, {vocab}), got {token!r}")
    return value


def _logit_bias(value, req: Request):
    vocab = req.limits.vocab_size
    field, code = "sampling_params.logit_bias", "logit_bias_invalid"
    if not isinstance(value, dict):
        raise RequestRuleError(code, field, f"{field} must be an object of token id -> bias, got {value!r:.80}")
    for key, bias in value.items():
        try:
            token = int(key) if not isinstance(key, (bool, float)) else None
        except (TypeError, ValueError):
            token = None
        if token is None or not 0 <= token < vocab:
            raise RequestRuleError(code, field, f"{field} keys must be token ids in [0, {vocab}), got {key!r}")
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not abs(bias) <= FLOAT32_MAX:
            raise RequestRuleError(code, field, f"{field}[{key!r}] must be a finite number in float32's range "
                                                f"[-{FLOAT32_MAX:.7g}, {FLOAT32_MAX:.7g}], got {bias!r}")
    return value


def _real(name: str):
    field = f"sampling_params.{name}"

    def check(value, req: Request):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise RequestRuleError("sampling_param_not_a_number", field,
                                   f"{field} must be a number, got {value!r:.80}")
        return value

    return check


def _grammar(name: str):
    field = f"sampling_params.{name}"

    def check(value, req: Request):
        if not isinstance(value, str):
            raise RequestRuleError("grammar_invalid", field, f"{field} must be a string, got {type(value).__name__}")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_GRAMMAR_BYTES:
            raise RequestRuleError("grammar_too_large", field,
                                   f"{field} must be at most {MAX_GRAMMAR_BYTES} bytes, got {size}")
        return value

    return check


# Stable codes of the seed refusals.
SEED_RANGE_CODE = "sampling_seed_out_of_range"
SEED_TYPE_CODE = "sampling_seed_not_integer"


def check_sampling_seed(seed: object) -> int:
    """The int64 that carries request seed ``seed`` through SGLang.

    Every detspec stream is keyed by a seed in [0, 2**64) (docs/design.md
    §1); SGLang admits [-2**63, 2**63) and keeps the seed in an int64 tensor,
    whose bits the plugin's samplers read as unsigned.

    Args:
        seed: the request's ``sampling_seed`` as parsed from JSON.

    Returns:
        ``seed`` for seeds in [0, 2**63); ``seed - 2**64`` (same 64 bits,
        two's complement) for seeds in [2**63, 2**64).

    Raises:
        RequestRuleError: ``seed`` is a bool or not an int, or lies outside
            [0, 2**64 - 1]; the message names ``sampling_seed`` and the bound.
    """
    if isinstance(seed, float) and (seed >= 2.0**64 or seed <= -(2.0**63)):
        # SGLang parses request bodies with orjson, which turns JSON integers outside
        # [-2**63, 2**64) into floats: this was most likely an integer out of range.
        raise RequestRuleError(
            SEED_RANGE_CODE, "sampling_seed",
            f"sampling_seed must be in {HTTP_SEED_RANGE} (sglang-detspec keys its random streams by an "
            f"unsigned 64-bit seed), got {seed!r} (beyond 64-bit integers: SGLang's JSON parser reads "
            "such integers as floats)"
        )
    try:
        return to_int64(seed, "sampling_seed")  # the int64 with the same 64 bits
    except ValueError:
        # The rule is check_seed's; an HTTP client gets it worded for the request field.
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise RequestRuleError(
                SEED_TYPE_CODE, "sampling_seed",
                f"sampling_seed must be an integer in {HTTP_SEED_RANGE}, got {type(seed).__name__} {seed!r}"
            ) from None
        raise RequestRuleError(
            SEED_RANGE_CODE, "sampling_seed",
            f"sampling_seed must be in {HTTP_SEED_RANGE} (sglang-detspec keys its random streams by an "
            f"unsigned 64-bit seed), got {seed}"
        ) from None


def _sampling_seed(value, req: Request):
    # Checked only: the int64 form is stored where SGLang builds the request's own SamplingParams
    # (request_validation.verify_unsigned_seed). Rewriting it here would rewrite a parameter dict that
    # a batch shares between its requests, and the next request's check would refuse the int64.
    check_sampling_seed(value)
    return value


_LOGPROBS = "layers.logprob_processor.get_top_logprobs_raw (logprobs.topk(max(top_logprobs_nums)))"

RULES: tuple[Rule, ...] = (
    Rule("input_ids", ("input_ids_out_of_vocabulary", "input_ids_not_integer", "input_ids_empty"),
         "at least one id, integers in [0, V) (V: the embedding's rows)", "refuse",
         "the embedding lookup; for an empty prompt, the batch's last-position gather (device-side assert)",
         _input_ids),
    Rule("sampling_params.n", ("n_out_of_range",), f"integer in [1, {MAX_N}]", "refuse",
         "io_struct.GenerateReqInput._handle_parallel_sampling (n copies in the tokenizer manager)",
         _n_of_every_set, stage="whole"),
    Rule("batch", ("batch_length_mismatch",),
         "every per-request list `GenerateReqInput.__getitem__` indexes (" + ", ".join(PER_REQUEST_LISTS)
         + ") as long as the batch (an empty " + " / ".join(EMPTY_MEANS_UNSET) + " and a flat token_ids_logprob "
         "are SGLang's \"not given\" and \"every request\"); parameter sets objects; input_ids beside a "
         "batch of text (which sets the batch size) one list of ids per request",
         "refuse", "io_struct.GenerateReqInput.__getitem__ (IndexError: HTTP 500; a longer list silently cut)",
         _batch_lists, stage="whole"),
    Rule("rid", ("rid_not_a_string",), "a string (a list of strings in a batch)", "refuse",
         "tokenizer_manager.TokenizerManager._init_req_state (rid as a dict key: HTTP 500)", _rid, stage="whole"),
    Rule("sampling_params.sampling_seed", (SEED_RANGE_CODE, SEED_TYPE_CODE), f"an integer in {HTTP_SEED_RANGE}",
         "refuse", "SGLang admits [-2**63, 2**63) and reads a negative seed as the uint64 with the same bits "
         "(sampling.sampling_params.SamplingParams.verify)", _sampling_seed),
    Rule("top_logprobs_num", ("top_logprobs_num_out_of_range",), "integer in [0, V]", "refuse", _LOGPROBS,
         _top_logprobs_num),
    Rule("token_ids_logprob", ("token_ids_logprob_out_of_vocabulary",), "token ids in [0, V)", "refuse",
         "layers.logprob_processor.get_token_ids_logprobs_raw (logprobs[..., ids])", _token_ids_logprob),
    Rule("logprob_start_len", ("logprob_start_len_out_of_range",),
         "integer in [-1, prompt length] (with return_logprob)", "refuse",
         "managers.schedule_batch.compute_extend_logprob_start_len", _logprob_start_len),
    Rule("sampling_params.top_k", ("top_k_clamped", "top_k_not_integer"),
         "an integer; values above 2**30 clamped to 2**30 (whole vocabulary)", "clamp",
         "sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch (int32 top_ks)", _top_k),
    Rule("sampling_params.min_new_tokens", ("min_new_tokens_out_of_range",), "integer in [0, context length]",
         "refuse", "sampling.penaltylib.min_new_tokens (int32 min_new_tokens)", _min_new_tokens),
    Rule("sampling_params.stop_token_ids", ("stop_token_ids_out_of_vocabulary",), "token ids in [0, V)", "refuse",
         "sampling.penaltylib.min_new_tokens (scatter_add_ of stop ids into a [bs, V + 1] row)", _stop_token_ids),
    Rule("sampling_params.logit_bias", ("logit_bias_invalid",),
         "keys token ids in [0, V), values finite float32 numbers", "refuse",
         "sampling.sampling_batch_info.SamplingBatchInfo.from_schedule_batch (logit_bias tensor)",
         _logit_bias),
    *(Rule(f"sampling_params.{name}", ("sampling_param_not_a_number",), "a number (range: SGLang's verify)", "refuse",
           "sampling.sampling_params.SamplingParams.verify and the sampling tensors", _real(name))
      for name in REAL_FIELDS),
    *(Rule(f"sampling_params.{name}", ("grammar_too_large", "grammar_invalid"),
           f"a string of at most {MAX_GRAMMAR_BYTES} bytes", "refuse",
           "constrained grammar backend (compiled per request)", _grammar(name))
      for name in GRAMMAR_FIELDS),
)


# -- applying the table -----------------------------------------------------------------


def _lookup(obj, req_input_ids, field: str):
    """``(container, key, value)`` of ``field`` in one request; container None: nothing to write back."""
    if field == "input_ids":
        return None, None, req_input_ids
    if field.startswith("sampling_params."):
        params = getattr(obj, "sampling_params", None)
        key = field.split(".", 1)[1]
        return (params, key, params.get(key)) if isinstance(params, dict) else (None, None, None)
    return obj, field, getattr(obj, field, None)


def check_request(obj, input_ids, limits: Limits) -> None:
    """Apply every ``"request"`` rule to one request, in table order; clamps are written back.

    Args:
        obj: SGLang's ``GenerateReqInput`` for one request (a batch element,
            after SGLang's normalisation: scalar fields, one ``sampling_params`` dict).
        input_ids: the prompt's token ids (as tokenized, or as sent), or None.
        limits: the served model's :class:`Limits`.

    Raises:
        RequestRuleError: the first rule a field breaks.
    """
    req = Request(obj, input_ids, limits)
    for rule in RULES:
        if rule.stage != "request":
            continue
        container, key, value = _lookup(obj, input_ids, rule.field)
        if value is None:
            continue
        kept = rule.check(value, req)
        if kept is not value and container is not None:
            if isinstance(container, dict):
                container[key] = kept
            else:
                setattr(container, key, kept)


def check_whole(obj) -> None:
    """Apply the ``"whole"`` rules to a request as sent, before SGLang expands it (``n``, batch lists, ``rid``).

    Args:
        obj: SGLang's ``GenerateReqInput`` after ``_determine_batch_size``
            (``is_single`` and ``batch_size`` set), before ``n`` is read.

    Raises:
        RequestRuleError: the first rule the request breaks.
    """
    for rule in RULES:
        if rule.stage == "whole":
            rule.check(obj)


def embedding_rows(model_config) -> int:
    """The token ids a text prompt may hold: the larger of the model's and its text model's vocabulary.

    Some multimodal configurations report a vision vocabulary as
    ``vocab_size`` and embed text with the text model's larger one.
    """
    text = getattr(model_config, "hf_text_config", None)
    return max(int(model_config.vocab_size), int(getattr(text, "vocab_size", 0) or 0))


def limits_of(tokenizer_manager) -> Limits:
    """The :class:`Limits` of SGLang's ``TokenizerManager`` (its model config and context length)."""
    config = tokenizer_manager.model_config
    return Limits(int(config.vocab_size), embedding_rows(config), int(tokenizer_manager.context_len))
