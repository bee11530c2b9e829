"""Request fuzz cases for a running SGLang server: valid requests, mutated, on three endpoints.

:func:`fuzz_cases` builds a seeded, bounded list of :class:`Case` s: a valid
request of ``/generate``, ``/v1/completions`` or ``/v1/chat/completions``
with one thing changed: one field's value (wrong types, ranges, sizes,
nesting, huge values, empty lists), an unknown field, a missing field, a
malformed or oddly shaped body, or (``/generate``) a batch mixing one bad
request with good ones. The inputs that killed servers before the plugin's
request rules (:data:`KNOWN_CRASHES`) lead every list, each with the HTTP
status it must get now. The end-to-end suite ``test_request_fuzz.py`` sends
them; docs/request_fields.md is the inventory of the fields.

Pure Python (no torch, no SGLang): the same seed gives the same cases.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from typing import NamedTuple

ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
GOOD_NEW_TOKENS = 4


@dataclasses.dataclass(frozen=True)
class Case:
    """One fuzz request.

    Attributes:
        index: position in the list.
        endpoint: the path it is sent to (one of :data:`ENDPOINTS`).
        field: the field changed (dotted path in the body, e.g.
            ``sampling_params.top_k``; ``body`` for the whole body).
        mutation: what was done to it (e.g. ``value:2**40``, ``unknown_field``).
        body: the JSON body (any JSON value), or the raw text sent when ``raw``.
        raw: ``body`` is sent as it is (text that need not be JSON).
        known: the name of a :data:`KNOWN_CRASHES` input, else None.
        expect: the HTTP status the case must get (None: any answer below 500).
        limit: the documented limit (a key of :data:`LIMITS`) whose 5xx the
            case may get instead of its answer, else None.
    """

    index: int
    endpoint: str
    field: str
    mutation: str
    body: object
    raw: bool = False
    known: str | None = None
    expect: int | None = None
    limit: str | None = None

    def payload(self) -> str:
        """The request body as sent."""
        return self.body if self.raw else json.dumps(self.body)

    def summary(self) -> dict:
        """The case without its body (bodies can be megabytes), for result files."""
        return {"index": self.index, "endpoint": self.endpoint, "field": self.field, "mutation": self.mutation,
                "known": self.known, "expect": self.expect, "limit": self.limit, "body_bytes": len(self.payload())}


@dataclasses.dataclass(frozen=True)
class Model:
    """What the cases are sized against: the served model's vocabulary and context, its served name."""

    vocab: int
    context_len: int
    name: str = "default"


# -- valid requests -------------------------------------------------------------------

# The test models' tokenizer (scripts/make_tiny_models.py): token i >= 3 is the word "t<i>", ids 0-2
# are <unk>, <s>, </s> (the end of sequence).
WORD = "t{}"


def good_body(endpoint: str, model: Model, rng: random.Random) -> dict:
    """A valid seeded sampled request of ``endpoint`` with a short random prompt (4 new tokens)."""
    ids = [rng.randrange(3, model.vocab) for _ in range(rng.randint(2, 12))]
    seed = rng.randrange(2**63)
    if endpoint == "/generate":
        return {"input_ids": ids, "sampling_params": {"max_new_tokens": GOOD_NEW_TOKENS, "temperature": 1.0,
                                                      "sampling_seed": seed}}
    common = {"model": model.name, "max_tokens": GOOD_NEW_TOKENS, "temperature": 1.0, "seed": seed}
    if endpoint == "/v1/completions":
        return {"prompt": ids, **common}
    words = " ".join(WORD.format(i) for i in ids)
    return {"messages": [{"role": "user", "content": words}], **common}


# -- values by kind ---------------------------------------------------------------------


def _ints(m: Model) -> list:
    return [-1, 0, 1, -2**31, 2**31, 2**40, 2**63 - 1, 2**64, -10**30, 10**6, m.vocab - 1, m.vocab, m.vocab + 1,
            m.context_len, m.context_len + 1, 1.5, "7", True, None, [], {}, [1, 2]]


def _reals(m: Model) -> list:
    return [-1.0, 0.0, 1e-45, 0.5, 1.0, 2.5, 100.0, 1e308, -1e308, 10**30, "x", "0.5", True, None, [], {}, [0.5]]


def _ids(m: Model) -> list:
    return [[], [m.vocab], [m.vocab - 1, 0], [-1], [1.5], ["t5"], [[1, 2]], [None], [True], [2**63], [2**64],
            [5] * (m.context_len + 1), {"a": 1}, 5, "t5 t6", None]


def _bools(m: Model) -> list:
    return [0, 1, 2, "true", None, [], {}, [True], 1.5]


def _strings(m: Model) -> list:
    return ["", "x", "x" * 100_000, "\u0000", "\ud7ff", "[" * 1000, 5, None, [], ["a", "b"], {"a": 1}, ["a"] * 64]


class Grammars(NamedTuple):
    """A grammar field's values: ``good`` the vocabulary can satisfy (HTTP 200), ``unsatisfiable``
    valid but startable by no token (:data:`GRAMMAR_LIMIT`), ``bad`` malformed (an answer below 500)."""

    good: tuple
    unsatisfiable: tuple
    bad: tuple


_NOT_A_GRAMMAR = ("x" * (2 * 1024 * 1024), 5, {"type": "object"}, [], None)
GRAMMARS = {
    "regex": Grammars(("t[0-9]+", "(t[1-9][0-9]*)+", "t5|t6", "t[1-9][0-9]{0,2}", ""),
                      ("[a-z]+", "a{1,3}", 'root ::= "a"'), ("{", "(((", *_NOT_A_GRAMMAR)),
    "ebnf": Grammars(('root ::= "t5"', 'root ::= ("t5" | "t6")+', 'root ::= "t" [1-9] [0-9]*', 'root ::= ""'),
                     ('root ::= "a"', "root ::= [a-z]+"), ("{", "", "(((", *_NOT_A_GRAMMAR)),
    # Every JSON text starts with one of {["-0-9tfn and no token of the vocabulary does ("t" is not a token).
    "json_schema": Grammars((), ('{"type": "object"}', '{"type": "string"}', '{"type": "integer"}',
                                 '{"type": "array"}'), ('{"type": "nope"}', "{", "", *_NOT_A_GRAMMAR)),
    "structural_tag": Grammars((), (), ("{", "", '{"type": "nope"}', 'root ::= "a"', *_NOT_A_GRAMMAR)),
}


def grammar_value(field: str, rng: random.Random) -> tuple[object, int | None, str | None]:
    """``(value, expect, limit)`` of a random value for grammar ``field`` (a key of :data:`GRAMMARS`)."""
    table = GRAMMARS[field]
    kind = rng.choice([k for k in ("good", "unsatisfiable", "bad") if getattr(table, k)])
    value = rng.choice(getattr(table, kind))
    return value, {"good": 200}.get(kind), GRAMMAR_LIMIT if kind == "unsatisfiable" else None


def _biases(m: Model) -> list:
    return [{}, {"5": 1.0}, {str(m.vocab): 1.0}, {"-1": 1.0}, {"abc": 1.0}, {"5": "x"}, {"5": None}, {"5": 1e308},
            {"5": [1]}, {str(2**70): 1.0}, {"1.5": 1.0}, {"5": -100.0, "6": 100.0}, [], "x", 5]


def _stops(m: Model) -> list:
    return ["", "t5", ["t5", "t6"], ["t5"] * 64, "x" * 10_000, 5, [5], None, [None], {"a": 1}]


def _messages(m: Model) -> list:
    return [[], [{"role": "user"}], [{"role": "nope", "content": "t5"}], [{"role": "user", "content": 5}],
            [{"role": "user", "content": None}], [{"role": "user", "content": [{"type": "text", "text": "t5"}]}],
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            [{"role": "user", "content": " ".join(["t5"] * (m.context_len + 1))}], "t5", 5, None, [[]],
            [{"role": "assistant", "content": "t5"}], [{"role": "user", "content": "t5"}] * 200]


# JSON output formats: no token of the test vocabulary starts a JSON text (:data:`GRAMMARS`).
JSON_FORMATS = ({"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})


def _formats(m: Model) -> list:
    return [*JSON_FORMATS, {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}, {"type": "nope"},
            "json", 5, None, []]


# Value lists by kind; "grammar" fields draw from GRAMMARS instead (:func:`value_for`).
KINDS: dict[str, Callable[[Model], list]] = {
    "int": _ints, "real": _reals, "ids": _ids, "bool": _bools, "str": _strings,
    "bias": _biases, "stop": _stops, "messages": _messages, "format": _formats,
}

SAMPLING = {
    "max_new_tokens": "int", "min_new_tokens": "int", "temperature": "real", "top_p": "real", "top_k": "int",
    "min_p": "real", "frequency_penalty": "real", "presence_penalty": "real", "repetition_penalty": "real",
    "n": "int", "stop": "stop", "stop_token_ids": "ids", "stop_regex": "stop", "logit_bias": "bias",
    "json_schema": "grammar", "regex": "grammar", "ebnf": "grammar", "structural_tag": "grammar",
    "sampling_seed": "int", "ignore_eos": "bool",
    "skip_special_tokens": "bool", "stream_interval": "int", "no_stop_trim": "bool",
}
GENERATE = {
    "input_ids": "ids", "text": "str", "return_logprob": "bool", "top_logprobs_num": "int",
    "token_ids_logprob": "ids", "logprob_start_len": "int", "return_text_in_logprobs": "bool", "rid": "str",
    "stream": "bool", **{f"sampling_params.{k}": v for k, v in SAMPLING.items()},
}
OPENAI = {
    "model": "str", "max_tokens": "int", "temperature": "real", "top_p": "real", "top_k": "int", "min_p": "real",
    "n": "int", "seed": "int", "stop": "stop", "stop_token_ids": "ids", "logit_bias": "bias",
    "frequency_penalty": "real", "presence_penalty": "real", "repetition_penalty": "real", "regex": "grammar",
    "ebnf": "grammar", "json_schema": "grammar", "ignore_eos": "bool", "min_tokens": "int", "stream": "bool",
}
FIELDS = {
    "/generate": GENERATE,
    "/v1/completions": {**OPENAI, "prompt": "ids", "logprobs": "int", "echo": "bool"},
    "/v1/chat/completions": {**OPENAI, "messages": "messages", "logprobs": "bool", "top_logprobs": "int",
                             "max_completion_tokens": "int", "response_format": "format"},
}


# -- inputs that killed servers ----------------------------------------------------------


def _known(m: Model) -> list[tuple[str, str, str, dict, int]]:
    """``(name, endpoint, field, body, status it must get)`` of every input known to have killed a server."""
    sp = {"max_new_tokens": GOOD_NEW_TOKENS, "temperature": 1.0}
    chat = [{"role": "user", "content": "t5 t6"}]
    return [
        # The report: logprobs.topk(10**6) in get_top_logprobs_raw, scheduler dead.
        ("top_logprobs_num_1e6", "/generate", "top_logprobs_num",
         {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": 1000000, "sampling_params": sp}, 400),
        ("top_logprobs_num_above_vocab", "/generate", "top_logprobs_num",
         {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": m.vocab + 1, "sampling_params": sp}, 400),
        ("top_logprobs_num_negative", "/generate", "top_logprobs_num",
         {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": -5, "sampling_params": sp}, 400),
        ("top_logprobs_num_1e6_beside_a_logprob_request", "/generate", "top_logprobs_num",
         {"input_ids": [[5, 6], [7, 8]], "return_logprob": [False, True], "top_logprobs_num": [1000000, 2],
          "sampling_params": [sp, sp]}, 400),
        ("completions_logprobs_1e6", "/v1/completions", "logprobs",
         {"model": m.name, "prompt": [5, 6], "max_tokens": GOOD_NEW_TOKENS, "logprobs": 1000000}, 400),
        ("chat_top_logprobs_1e6", "/v1/chat/completions", "top_logprobs",
         {"model": m.name, "messages": chat, "max_tokens": GOOD_NEW_TOKENS, "logprobs": True,
          "top_logprobs": 1000000}, 400),
        ("token_ids_logprob_out_of_vocab", "/generate", "token_ids_logprob",
         {"input_ids": [5, 6], "return_logprob": True, "token_ids_logprob": [m.vocab + 7], "sampling_params": sp}, 400),
        ("logprob_start_len_negative", "/generate", "logprob_start_len",
         {"input_ids": [5, 6], "return_logprob": True, "logprob_start_len": -5, "sampling_params": sp}, 400),
        ("logprob_start_len_past_prompt", "/generate", "logprob_start_len",
         {"input_ids": [5, 6], "return_logprob": True, "logprob_start_len": 50, "sampling_params": sp}, 400),
        # int32 top_ks tensor in SamplingBatchInfo: clamped to the whole vocabulary, answered.
        ("top_k_2_40", "/generate", "sampling_params.top_k",
         {"input_ids": [5, 6], "sampling_params": {**sp, "top_k": 2**40}}, 200),
        ("completions_top_k_2_40", "/v1/completions", "top_k",
         {"model": m.name, "prompt": [5, 6], "max_tokens": GOOD_NEW_TOKENS, "top_k": 2**40}, 200),
        # int32 min_new_tokens tensor of the min-new-tokens penalizer.
        ("min_new_tokens_2_40", "/generate", "sampling_params.min_new_tokens",
         {"input_ids": [5, 6], "sampling_params": {**sp, "max_new_tokens": None, "min_new_tokens": 2**40}}, 400),
        # scatter_add_ of the stop ids into a [bs, V + 1] row of the min-new-tokens penalizer.
        ("stop_token_ids_out_of_vocab", "/generate", "sampling_params.stop_token_ids",
         {"input_ids": [5, 6], "sampling_params": {**sp, "stop_token_ids": [m.vocab + 5], "min_new_tokens": 2}}, 400),
        ("stop_token_ids_negative", "/generate", "sampling_params.stop_token_ids",
         {"input_ids": [5, 6], "sampling_params": {**sp, "stop_token_ids": [-1], "min_new_tokens": 2}}, 400),
        ("completions_stop_token_ids_out_of_vocab", "/v1/completions", "stop_token_ids",
         {"model": m.name, "prompt": [5, 6], "max_tokens": GOOD_NEW_TOKENS, "stop_token_ids": [m.vocab + 5],
          "min_tokens": 2}, 400),
        # The embedding lookup's device-side assert (the first issue of this kind).
        ("input_ids_at_vocab", "/generate", "input_ids", {"input_ids": [m.vocab, 7], "sampling_params": sp}, 400),
        ("input_ids_negative", "/generate", "input_ids", {"input_ids": [-1, 7], "sampling_params": sp}, 400),
        # An empty prompt in a batch: the last-position gather's device-side assert (a tree server, H200).
        ("input_ids_empty_in_batch", "/generate", "input_ids",
         {"input_ids": [[], [5, 6]], "sampling_params": [sp, sp]}, 400),
        ("completions_prompt_out_of_vocab", "/v1/completions", "prompt",
         {"model": m.name, "prompt": [m.vocab + 3, 7], "max_tokens": GOOD_NEW_TOKENS}, 400),
    ]


KNOWN_CRASHES = tuple(name for name, *_ in _known(Model(4096, 4096)))


# -- mutations ---------------------------------------------------------------------------


def _set(body: dict, path: str, value) -> dict:
    """A copy of ``body`` with the dotted ``path`` set to ``value`` (missing parents created)."""
    out = json.loads(json.dumps(body))
    node = out
    *parents, leaf = path.split(".")
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[leaf] = value
    return out


def _delete(body: dict, path: str) -> dict:
    out = json.loads(json.dumps(body))
    node = out
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.get(key, {})
    if isinstance(node, dict):
        node.pop(leaf, None)
    return out


def _label(value) -> str:
    text = json.dumps(value)
    for power in (31, 40, 63, 64, 70):
        text = text.replace(str(2**power), f"2**{power}")
    return text if len(text) <= 40 else f"{text[:24]}...({len(text)} chars)"


def value_for(field: str, kind: str, model: Model, rng: random.Random) -> tuple[object, int | None, str | None]:
    """``(value, expect, limit)``: a random value of ``kind`` for ``field``, the status it must get
    (200 for a grammar the vocabulary satisfies, else None) and the limit it may hit."""
    if kind == "grammar":
        return grammar_value(field.rsplit(".", 1)[-1], rng)
    value = rng.choice(KINDS[kind](model))
    return value, None, GRAMMAR_LIMIT if kind == "format" and value in JSON_FORMATS else None


def _field_case(rng, endpoint, model, fields) -> dict:
    field = rng.choice(sorted(fields))
    value, expect, limit = value_for(field, fields[field], model, rng)
    body = _set(good_body(endpoint, model, rng), field, value)
    return {"field": field, "mutation": f"value:{_label(value)}", "body": body, "expect": expect, "limit": limit}


def _structure_case(rng, endpoint, model, fields) -> dict:
    field, mutation, body = _structure(rng, endpoint, model, fields)
    return {"field": field, "mutation": mutation, "body": body}


def _structure(rng, endpoint, model, fields) -> tuple[str, str, object]:
    body = good_body(endpoint, model, rng)
    field = rng.choice(sorted(fields))
    kind = rng.choice(("unknown_field", "unknown_sampling_field", "nested", "deep_nesting", "missing", "null"))
    if kind == "unknown_field":
        return "body", kind, {**body, f"detspec_fuzz_{rng.randrange(1000)}": rng.choice(_ints(model))}
    if kind == "unknown_sampling_field" and endpoint == "/generate":
        return "sampling_params", kind, _set(body, "sampling_params.detspec_fuzz", 1)
    if kind == "nested":
        current = body
        for key in field.split("."):
            current = current.get(key) if isinstance(current, dict) else None
        return field, kind, _set(body, field, rng.choice(([[current]], {"value": current}, [current, current])))
    if kind == "deep_nesting":
        return field, kind, _set(body, field, json.loads("[" * 200 + "]" * 200))
    if kind == "missing":
        return field, kind, _delete(body, field)
    return field, kind, _set(body, field, None)


def _body_case(rng, endpoint, model, fields) -> dict:
    good = json.dumps(good_body(endpoint, model, rng))
    kind, body = rng.choice((
        ("malformed_json", good[: len(good) // 2]), ("empty", ""), ("json_list", json.dumps([json.loads(good)])),
        ("json_number", "5"), ("json_string", '"x"'), ("json_null", "null"), ("empty_object", "{}"),
        ("lone_surrogate", good.replace("{", "{\"\\udc80\": 1,", 1)), ("trailing_garbage", good + "}}"),
        ("deep_array", "[" * 5000 + "]" * 5000),
    ))
    return {"field": "body", "mutation": kind, "body": body, "raw": True}


def _batch_case(rng, endpoint, model, fields) -> dict:
    """``/generate``: a batch of 2-5 good requests of which one has one bad field."""
    size = rng.randint(2, 5)
    bad = rng.randrange(size)
    goods = [good_body("/generate", model, rng) for _ in range(size)]
    field = rng.choice(("input_ids", "sampling_params", "top_logprobs_num", "return_logprob", "token_ids_logprob",
                        "logprob_start_len"))
    body = {"input_ids": [g["input_ids"] for g in goods], "sampling_params": [g["sampling_params"] for g in goods]}
    limit = None
    if field == "input_ids":
        body["input_ids"][bad] = rng.choice([[model.vocab], [-1], [], [1.5], [2**63]])
    elif field == "sampling_params":
        key = rng.choice(sorted(SAMPLING))
        value, _, limit = value_for(key, SAMPLING[key], model, rng)
        body["sampling_params"][bad] = {**body["sampling_params"][bad], key: value}
        field = f"sampling_params.{key}"
    else:
        body["return_logprob"] = [True] * size
        values = [0] * size if field != "logprob_start_len" else [-1] * size
        if field == "token_ids_logprob":
            values = [[5] for _ in range(size)]
        values[bad] = rng.choice(_ints(model) if field != "token_ids_logprob" else _ids(model))
        body[field] = values
        if field == "return_logprob":
            body["top_logprobs_num"] = [0] * size
            body["top_logprobs_num"][bad] = rng.choice((10**6, model.vocab + 1, 5))
            body["return_logprob"][bad] = False
            field = "top_logprobs_num"
    return {"field": f"batch:{field}", "mutation": f"one_bad_of_{size}", "body": body, "limit": limit}


# One entry of each per-request list SGLang indexes in a /generate batch
# (sglang_plugin/request_rules.PER_REQUEST_LISTS; a unit test keeps the two equal): a value its
# schema gate admits, so that a list of the wrong length is refused for its length.
BATCH_LISTS: dict[str, object] = {
    "sampling_params": {"max_new_tokens": GOOD_NEW_TOKENS}, "rid": "rid", "image_data": None, "video_data": None,
    "audio_data": None, "mm_hashes": [], "mm_content_hashes": [], "modalities": "image", "watermark": None,
    "return_logprob": False, "logprob_start_len": -1, "top_logprobs_num": 0, "token_ids_logprob": [5],
    "return_sampling_mask": False, "sampling_logprobs_mode": None, "return_hidden_states": False,
    "lora_path": None, "lora_id": None, "custom_logit_processor": None, "positional_embed_overrides": None,
    "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None, "bootstrap_pair_key": None,
    "decode_tp_size": None, "extra_key": "k", "cache_salt": "k", "kv_hints": None,
    "multi_item_delimiter_indices": [], "token_indices_to_pool": [],
}


def _length_cases(rng, model) -> list[tuple[str, str, dict]]:
    """``(field, mutation, body)``: each of :data:`BATCH_LISTS` one entry short and one entry long in a batch."""
    out = []
    for name, entry in BATCH_LISTS.items():
        for change in (-1, 1):
            size = rng.randint(2, 5)  # never an empty list: SGLang reads some empty lists as "not given"
            goods = [good_body("/generate", model, rng) for _ in range(size)]
            body = {"input_ids": [g["input_ids"] for g in goods],
                    "sampling_params": [g["sampling_params"] for g in goods]}
            entries = [f"fuzz-{rng.getrandbits(64):016x}" if name == "rid" else entry for _ in range(size + change)]
            body[name] = entries
            out.append((f"batch:{name}", f"{'shorter' if change < 0 else 'longer'}:{size + change}_for_{size}", body))
    return out


def fuzz_cases(seed: int, count: int, model: Model) -> list[Case]:
    """``count`` cases: :data:`KNOWN_CRASHES` first, then the batch-length cases, then cases drawn from ``seed``.

    The batch-length cases (each of :data:`BATCH_LISTS` one entry short and
    one long, HTTP 400) come as far as ``count`` allows. In the drawn cases
    endpoints take turns; each is a field mutation (70 %), a structure
    mutation (unknown / missing / null / nested field, 12 %), a malformed
    body (8 %), or on ``/generate`` a mixed batch (10 %; elsewhere a field
    mutation).

    Args:
        seed: the draw's seed (``random.Random``): equal seeds, equal cases.
        count: the number of cases, at least ``len(KNOWN_CRASHES)``.
        model: the served model's vocabulary, context length and name.

    Raises:
        ValueError: ``count`` below the number of known crash inputs.
    """
    known = _known(model)
    if count < len(known):
        raise ValueError(f"count must be at least {len(known)} (the known crash inputs), got {count}")
    cases = [Case(i, endpoint, field, f"known:{name}", body, known=name, expect=status)
             for i, (name, endpoint, field, body, status) in enumerate(known)]
    rng = random.Random(seed)
    for field, mutation, body in _length_cases(rng, model)[:count - len(cases)]:
        cases.append(Case(len(cases), "/generate", field, mutation, body, expect=400))
    while len(cases) < count:
        endpoint = ENDPOINTS[len(cases) % len(ENDPOINTS)]
        fields = FIELDS[endpoint]
        draw = rng.random()
        if draw < 0.10 and endpoint == "/generate":
            made = _batch_case(rng, endpoint, model, fields)
        elif draw < 0.22:
            made = _structure_case(rng, endpoint, model, fields)
        elif draw < 0.30:
            made = _body_case(rng, endpoint, model, fields)
        else:
            made = _field_case(rng, endpoint, model, fields)
        cases.append(Case(len(cases), endpoint, **made))
    return cases


# The documented limits (docs/request_fields.md, "Known limits"): 5xx answers the plugin cannot
# prevent, each SGLang's own, the server staying up.
# The chat request model's "before" validator reads the body and its response_format with .get(),
# and pydantic passes the AttributeError through (not a validation error), before any hookable code.
CHAT_BODY_LIMIT = "chat_body_not_an_object"
# A grammar no token of the vocabulary can start: the mask leaves no token, the draw returns one
# the grammar refuses, and SGLang's grammar backend aborts the request. Telling this apart at the
# edge means compiling the grammar against the vocabulary, which SGLang does in the scheduler.
GRAMMAR_LIMIT = "grammar_unsatisfiable"
LIMITS = {
    CHAT_BODY_LIMIT: "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest.set_json_schema",
    GRAMMAR_LIMIT: "sglang.srt.constrained (grammar backend: \"Grammar accept_token failed\", request aborted)",
}
# The words of SGLang's abort of a request whose grammar refuses the drawn token.
GRAMMAR_ABORT_TEXT = "Grammar accept_token failed"


def known_limit(case: Case) -> str | None:
    """The documented limit (a key of :data:`LIMITS`) whose 5xx ``case`` may get, or None."""
    if case.limit is not None:
        return case.limit
    if case.endpoint != "/v1/chat/completions":
        return None
    try:
        body = json.loads(case.payload())
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python's parser goes
        return None
    if not isinstance(body, dict):
        return CHAT_BODY_LIMIT
    fmt = body.get("response_format")
    return CHAT_BODY_LIMIT if fmt and not isinstance(fmt, dict) else None


def limit_answer(case: Case, status: int | None, text: str) -> str | None:
    """The limit (a key of :data:`LIMITS`) that explains answer ``status`` / ``text`` to ``case``, or None.

    A 5xx is a limit's only on a case :func:`known_limit` names, and for
    :data:`GRAMMAR_LIMIT` only with SGLang's grammar-abort words in the answer.
    """
    limit = known_limit(case)
    if status is None or status < 500 or limit is None:
        return None
    if limit == GRAMMAR_LIMIT and GRAMMAR_ABORT_TEXT not in text:
        return None
    return limit


def failed(case: Case, status: int | None, text: str) -> bool:
    """Whether the answer fails ``case``: none, a 5xx no documented limit explains, or another status
    than the case must get (a limit's 5xx stands in for it)."""
    if limit_answer(case, status, text) is not None:
        return False
    return status is None or status >= 500 or (case.expect is not None and status != case.expect)


def coverage(cases: list[Case]) -> dict:
    """``{"endpoints": [...], "fields": [...]}``: what ``cases`` touch (fields of mutated values, sorted)."""
    return {"endpoints": sorted({c.endpoint for c in cases}),
            "fields": sorted({c.field for c in cases if c.field != "body" and not c.field.startswith("batch:")}
                             | {c.field[len("batch:"):] for c in cases if c.field.startswith("batch:")})}
