"""Plain HTTP traffic for the end-to-end suites: SGLang's native ``/generate`` and OpenAI ``/v1/completions``.

Nothing here raises on a bad answer: every call returns what came back (or
the error text) so a test can write its numbers before it asserts.

Shapes read (SGLang 0.5.23, ``managers/tokenizer_manager.py`` and
``entrypoints/openai/serving_completions.py``):

* ``/generate`` with ``input_ids`` returns one object per request (a list
  for a batch or for ``n > 1``, in request order, sample by sample):
  ``{"output_ids": [...], "meta_info": {...}}``. ``meta_info`` has ``id``,
  ``finish_reason``, ``completion_tokens``, ``num_retractions`` (times the
  scheduler retracted the request), ``spec_verify_ct`` on speculative
  servers, ``output_token_logprobs`` (``[[logprob, token_id, text], ...]``)
  with ``return_logprob``, and, with this plugin active, ``sampling_seed``
  (the uint64 seed the request used; null for greedy requests).
* ``/v1/completions`` returns ``{"choices": [{"index", "text", "token_ids"
  (with ``return_token_ids``), "finish_reason", "sampling_seed" (plugin)}]}``.
  It builds ``text`` with the tokenizer, so it needs a server started without
  ``--skip-tokenizer-init``.
"""

from __future__ import annotations

import dataclasses
import json

import requests

HTTP_TIMEOUT_S = 300.0


def post(url: str, path: str, body: dict, timeout: float = HTTP_TIMEOUT_S) -> dict:
    """POST ``body`` as JSON: ``{"status": int or None, "body": parsed JSON or None, "text": first 500 chars}``."""
    return _exchange("POST", url, path, body, timeout)


def get(url: str, path: str, timeout: float = HTTP_TIMEOUT_S) -> dict:
    """GET ``path`` (e.g. ``/server_info``): the same dict as :func:`post`."""
    return _exchange("GET", url, path, None, timeout)


def _exchange(method: str, url: str, path: str, body: dict | None, timeout: float) -> dict:
    try:
        response = requests.request(method, f"{url}{path}", json=body, timeout=timeout)
        status, text = response.status_code, response.text
    except requests.RequestException as exc:
        return {"status": None, "body": None, "text": f"{type(exc).__name__}: {exc}"[:500]}
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return {"status": status, "body": parsed, "text": text[:500]}


@dataclasses.dataclass(frozen=True)
class Generated:
    """One request's result from ``/generate``.

    ``logprobs`` holds ``repr`` of each output logprob (so equal means
    bitwise equal, -0.0 apart from 0.0); None when none were asked for.
    ``sampling_seed`` is ``meta_info["sampling_seed"]`` as sent (absent: None).
    """

    output_ids: tuple[int, ...]
    logprobs: tuple[str, ...] | None
    sampling_seed: object
    verify_ct: int | None
    completion_tokens: int | None
    retractions: int | None
    finish_reason: object
    cached_tokens: int | None = None  # meta_info["cached_tokens"]: prompt tokens served from the radix cache
    reports_seed: bool = False  # meta_info has the key "sampling_seed" (null for a greedy request)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["output_ids"] = list(self.output_ids)
        out["logprobs"] = None if self.logprobs is None else list(self.logprobs)
        # JSON readers that use doubles would round a 64-bit seed; the decimal string is exact.
        out["sampling_seed"] = None if self.sampling_seed is None else str(self.sampling_seed)
        return out


def parse_generated(item, want_tokens: int | None = None) -> Generated | str:
    """One ``/generate`` result object as :class:`Generated`, or what is wrong with it (str).

    ``want_tokens``: the ``max_new_tokens`` sent with ``ignore_eos`` (checked when given).
    """
    if not isinstance(item, dict) or not isinstance(item.get("meta_info"), dict):
        return f"not a /generate result object: {str(item)[:200]}"
    meta = item["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return f"aborted by the server: {finish.get('message')}"
    ids = item.get("output_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return f"output_ids is not a list of token ids: {str(ids)[:200]}"
    if want_tokens is not None and len(ids) != want_tokens:
        return f"{len(ids)} output tokens for max_new_tokens={want_tokens} (finish_reason {finish!r})"
    entries = meta.get("output_token_logprobs")
    logprobs = None
    if entries is not None:
        if not isinstance(entries, list) or len(entries) != len(ids):
            return f"{len(entries) if isinstance(entries, list) else entries!r} logprob entries for {len(ids)} tokens"
        logprobs = tuple(repr(None if e[0] is None else float(e[0])) for e in entries)
    return Generated(tuple(ids), logprobs, meta.get("sampling_seed"), meta.get("spec_verify_ct"),
                     meta.get("completion_tokens"), meta.get("num_retractions"), finish, meta.get("cached_tokens"),
                     "sampling_seed" in meta)


def generate(url: str, input_ids, sampling_params, *, return_logprob: bool = False,
             want_tokens: int | None = None, timeout: float = HTTP_TIMEOUT_S) -> list[Generated | str]:
    """One ``/generate`` POST; its results as a list (one entry for a single request with ``n`` 1).

    ``input_ids`` is one prompt (list of ids) or a batch (list of lists) and
    ``sampling_params`` a dict or one dict per prompt, as SGLang takes them.
    On an HTTP or transport error the list holds one error string.
    """
    body = {"input_ids": input_ids, "sampling_params": sampling_params}
    if return_logprob:
        body["return_logprob"] = True
    outcome = post(url, "/generate", body, timeout)
    if outcome["status"] != 200:
        return [f"HTTP {outcome['status']}: {outcome['text']}"]
    result = outcome["body"]
    items = result if isinstance(result, list) else [result]
    return [parse_generated(item, want_tokens) for item in items]


# SGLang flushes only an idle scheduler; with a timeout it waits for one instead of answering 400 at once.
FLUSH_TIMEOUT_S = 30


def resend_over_cache(server, send, prompts: list, params: list, first: list, cached: int,
                      new_tokens: int, page_size: int = 1) -> tuple[list, list[str]]:
    """Each request again over a radix-cache hit: the cache flushed, each prompt cached alone (one token
    generated), then each prompt followed by its first ``cached`` outputs of ``first``, ``new_tokens`` more.

    ``send(server, prompts, params, want_tokens)`` sends a request set and returns its results in order.
    Returns the second run's results (error strings where one failed) and the problems: a failed flush or
    warm-up, and requests SGLang did not serve from the cache (``meta_info["cached_tokens"]`` below the
    prompt length), in which case nothing was measured for them. With KV pages of ``page_size`` tokens
    SGLang caches and matches whole pages only, so a hit there is every whole page of the prompt
    (``cached_tokens`` at least the prompt length less one page).
    """
    problems = []
    flushed = post(server.url, f"/flush_cache?timeout={FLUSH_TIMEOUT_S}", {})
    if flushed["status"] != 200:
        problems.append(f"/flush_cache answered {flushed['status']}: {flushed['text']}")
    warm = send(server, prompts, [{**q, "max_new_tokens": 1} for q in params], 1)
    problems += [f"warm-up: {w}" for w in warm if isinstance(w, str)][:2]
    again = send(server, [p + list(r.output_ids[:cached]) for p, r in zip(prompts, first)],
                 [{**q, "max_new_tokens": new_tokens} for q in params], new_tokens)
    # SGLang matches at most all but the last input token, and at pages above one token whole pages only.
    short = max(1, page_size)
    misses = [i for i, (p, r) in enumerate(zip(prompts, again))
              if not isinstance(r, str) and (r.cached_tokens or 0) < len(p) - short]
    if misses:
        bound = "the prompt length" if short == 1 else f"the prompt's whole pages of {page_size} tokens"
        problems.append(f"requests {misses[:5]} were not served from the radix cache (meta_info cached_tokens "
                        f"below {bound}): no cache hit measured")
    return again, problems


def errors(results) -> list[str]:
    """The error strings among ``results`` (a list of :class:`Generated` or str)."""
    return [r for r in results if isinstance(r, str)]


def first_difference(a, b) -> int | None:
    """The first index where sequences ``a`` and ``b`` differ (the shorter length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def is_seed(value) -> bool:
    """A reported seed: a JSON integer in [0, 2**64)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
