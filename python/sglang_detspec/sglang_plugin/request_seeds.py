"""Request seeds in SGLang's tokenizer manager: assign at admission, derive per sample, report.

docs/design.md §6. SGLang 0.5.23 under ``--enable-deterministic-inference``
gives every request without ``sampling_seed`` the seed 42
(``sampling_batch_info.py``), so unseeded requests of one prompt coincide,
and the ``n`` parallel samples of a request share one ``SamplingParams``
object (``_handle_batch_request`` copies the tokenized request shallowly),
so they all draw with one seed. While the config bag is active:

- ``TokenizerManager._create_tokenized_object`` (AROUND): a sampled request
  (``top_k != 1`` after SGLang's ``normalize``; temperature 0 becomes
  ``top_k = 1`` there) that came without a seed gets :func:`fresh_seed`. It
  runs once per prompt for every entry point the tokenizer manager serves
  (native ``/generate`` single, batched and ``n > 1``, the OpenAI
  endpoints, the offline ``Engine``), after SGLang's ``verify``.
- ``TokenizerManager._handle_batch_request`` (AROUND): around the ``n > 1``
  path, opens a per-request sample counter (a context variable, so
  concurrent requests never share it) for the sends SGLang makes before its
  first output.
- ``TokenizerManager._send_one_request`` and ``_send_batch_request``
  (AROUND): inside that scope the k-th send of one shared ``SamplingParams``
  object is sample k (SGLang sends the samples of a prompt in order); sample
  ``j >= 1`` gets its own copy with :func:`derive_sample_seed` ``(seed, j)``,
  sample 0 keeps the seed. Every send records the seed used (uint64, None
  for greedy requests) on the request's ``ReqState``.
- ``TokenizerManager._wait_one_response`` (AROUND): every output of the
  request (streamed chunks too) carries ``meta_info["sampling_seed"]``.
- ``OpenAIServingCompletion._build_completion_response`` and
  ``OpenAIServingChat._build_chat_response`` (AROUND): each choice carries
  ``sampling_seed`` (the response models gain that field, once, the first
  time an active server builds a response).

``--tokenizer-worker-num > 1`` (tokenizer worker processes load no plugins,
so they would serve requests with none of the above) is refused at start-up
by the bag's own checks (``config.py``), not here.

With the bag inactive every hook hands over to SGLang untouched.
"""

from __future__ import annotations

import copy
import threading
from typing import Optional

from ..config import current_config
from ..ops.seed_encoding import from_int64, to_int64
from ..seeds import derive_sample_seed, fresh_seed
from .channels import REQUEST_SEED, SAMPLES

_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
CREATE_TARGET = f"{_TM}._create_tokenized_object"
BATCH_TARGET = f"{_TM}._handle_batch_request"
SEND_ONE_TARGET = f"{_TM}._send_one_request"
SEND_BATCH_TARGET = f"{_TM}._send_batch_request"
WAIT_TARGET = f"{_TM}._wait_one_response"
COMPLETION_TARGET = (
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._build_completion_response"
)
CHAT_TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response"

REQ_STATE_SEED = f"sglang.srt.managers.tokenizer_manager.ReqState.{REQUEST_SEED.attr}"  # kept by _seed_one
# Key in native meta_info and field of each OpenAI choice.
REPORT_KEY = "sampling_seed"
_PROTOCOL = "sglang.srt.entrypoints.openai.protocol"
COMPLETION_CHOICE_SEED = f"{_PROTOCOL}.CompletionResponseChoice.{REPORT_KEY}"
CHAT_CHOICE_SEED = f"{_PROTOCOL}.ChatCompletionResponseChoice.{REPORT_KEY}"


def _is_generate(obj) -> bool:
    # Embedding requests also pass through the tokenizer manager; they sample nothing.
    from sglang.srt.managers.io_struct import GenerateReqInput

    return isinstance(obj, GenerateReqInput)


def is_sampled(params) -> bool:
    """Whether a normalised SGLang ``SamplingParams`` draws at random (``top_k != 1``).

    SGLang's ``normalize`` turns temperature 0 into ``top_k = 1``, its greedy
    marker; greedy requests need no seed.
    """
    return params.top_k != 1


# -- admission ---------------------------------------------------------------


def assign_fresh_seed(original, self, obj, *args, **kwargs):
    """AROUND hook for ``TokenizerManager._create_tokenized_object``: same signature and return value.

    With the bag active, a generate request that is sampled and has no
    ``sampling_seed`` leaves with :func:`fresh_seed` (stored as SGLang
    carries seeds: the int64 with the same 64 bits). Seeded and greedy
    requests are unchanged.
    """
    tokenized = original(self, obj, *args, **kwargs)
    params = getattr(tokenized, "sampling_params", None)
    if (
        params is not None
        and current_config().active
        and _is_generate(obj)
        and params.sampling_seed is None
        and is_sampled(params)
    ):
        params.sampling_seed = to_int64(fresh_seed())
    return tokenized


# -- parallel samples --------------------------------------------------------


class SampleCounter:
    """Counts the sends of each shared ``SamplingParams`` object within one ``n > 1`` request.

    Holds the objects it counted, so no id is reused while it lives.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, int]] = {}

    def next_index(self, params) -> int:
        """How many times ``params`` was counted before (the sample index of this send)."""
        _, count = self._seen.get(id(params), (params, 0))
        self._seen[id(params)] = (params, count + 1)
        return count


async def scope_parallel_samples(original, self, obj, *args, **kwargs):
    """AROUND hook for ``TokenizerManager._handle_batch_request`` (an async generator): same outputs.

    For a request with ``parallel_sample_num > 1`` while the bag is active,
    a :class:`SampleCounter` is current until SGLang's first output: SGLang
    sends every sample before it yields anything.
    """
    scoped = getattr(obj, "parallel_sample_num", 1) > 1 and current_config().active
    token = SAMPLES.open(SampleCounter()) if scoped else None
    gen = original(self, obj, *args, **kwargs)
    try:
        try:
            first = await gen.__anext__()
        except StopAsyncIteration:
            return
        finally:
            if token is not None:
                SAMPLES.close(token)
                token = None
        yield first
        async for out in gen:
            yield out
    finally:
        await gen.aclose()


def _seed_one(manager, tokenized) -> None:
    """Give a tokenized request its sample seed (inside an ``n > 1`` scope) and record the seed used."""
    params = getattr(tokenized, "sampling_params", None)
    if params is None or not hasattr(params, "sampling_seed") or not hasattr(params, "top_k"):
        return
    sampled = is_sampled(params) and params.sampling_seed is not None
    counter = SAMPLES.read()
    if sampled and counter is not None:
        index = counter.next_index(params)
        if index:
            # The samples share one SamplingParams object: each sample past the
            # first gets its own copy.
            params = copy.copy(params)
            params.sampling_seed = to_int64(derive_sample_seed(from_int64(params.sampling_seed), index))
            tokenized.sampling_params = params
    state = manager.rid_to_state.get(getattr(tokenized, "rid", None))
    if state is not None:
        REQUEST_SEED.write(state, from_int64(params.sampling_seed) if sampled else None)


async def seed_one_send(original, self, tokenized_obj, *args, **kwargs):
    """AROUND hook for ``TokenizerManager._send_one_request``: same signature and return value."""
    if current_config().active:
        _seed_one(self, tokenized_obj)
    return await original(self, tokenized_obj, *args, **kwargs)


async def seed_batch_send(original, self, tokenized_objs, *args, **kwargs):
    """AROUND hook for ``TokenizerManager._send_batch_request``: same signature and return value."""
    if current_config().active:
        for tokenized in tokenized_objs:
            _seed_one(self, tokenized)
    return await original(self, tokenized_objs, *args, **kwargs)


# -- reports -----------------------------------------------------------------


def put_report(out, seed: Optional[int]) -> None:
    """Write ``seed`` into ``out["meta_info"]["sampling_seed"]`` when ``out`` has a meta_info dict."""
    meta = out.get("meta_info") if isinstance(out, dict) else None
    if isinstance(meta, dict):
        meta[REPORT_KEY] = seed


async def _reporting(gen, state):
    try:
        async for out in gen:
            put_report(out, REQUEST_SEED.read(state))
            yield out
    finally:
        await gen.aclose()


def report_seed(original, self, obj, *args, **kwargs):
    """AROUND hook for ``TokenizerManager._wait_one_response``: the same async generator of outputs.

    With the bag active each output's ``meta_info`` gains ``sampling_seed``:
    the uint64 seed the request was sent with, None for greedy requests.
    """
    gen = original(self, obj, *args, **kwargs)
    if not current_config().active or not _is_generate(obj):
        return gen
    return _reporting(gen, self.rid_to_state.get(obj.rid))


_models_lock = threading.Lock()
_models_done = False


def add_choice_fields() -> None:
    """Give SGLang's OpenAI choice models an optional ``sampling_seed`` field (idempotent).

    The response models embed the choice schema, so they are rebuilt too.
    """
    global _models_done
    if _models_done:
        return
    from pydantic.fields import FieldInfo
    from sglang.srt.entrypoints.openai import protocol

    with _models_lock:
        if _models_done:
            return
        for choice, response in (
            (protocol.CompletionResponseChoice, protocol.CompletionResponse),
            (protocol.ChatCompletionResponseChoice, protocol.ChatCompletionResponse),
        ):
            if REPORT_KEY not in choice.model_fields:
                choice.__pydantic_fields__[REPORT_KEY] = FieldInfo(
                    annotation=Optional[int], default=None,
                    description="sglang-detspec: the uint64 seed this choice was sampled with; null if greedy",
                )
                choice.model_rebuild(force=True)
                response.model_rebuild(force=True)
        _models_done = True


def _report_choices(response, ret) -> None:
    add_choice_fields()
    for choice in getattr(response, "choices", None) or []:
        meta = ret[choice.index].get("meta_info") or {}
        setattr(choice, REPORT_KEY, meta.get(REPORT_KEY))


def report_completion_choices(original, self, request, ret, *args, **kwargs):
    """AROUND hook for ``OpenAIServingCompletion._build_completion_response``: same return value.

    With the bag active each choice's ``sampling_seed`` is the one its
    output reported (choice ``index`` i is output ``ret[i]``).
    """
    response = original(self, request, ret, *args, **kwargs)
    if current_config().active:
        _report_choices(response, ret)
    return response


def report_chat_choices(original, self, request, ret, *args, **kwargs):
    """AROUND hook for ``OpenAIServingChat._build_chat_response``: as :func:`report_completion_choices`."""
    response = original(self, request, ret, *args, **kwargs)
    if current_config().active:
        _report_choices(response, ret)
    return response

