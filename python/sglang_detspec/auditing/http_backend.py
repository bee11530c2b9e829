"""Audit a running SGLang server: a :class:`~sglang_detspec.auditing.batch.Backend` over its native ``/generate``.

:class:`HttpBackend` sends each sub-batch of an audit trial to SGLang 0.5.23's
``POST /generate`` as one batch request, token ids in and token ids out, so it
works with servers launched with ``--skip-tokenizer-init`` and without:

* request (one JSON object for the whole sub-batch)::

      {"input_ids": [[int, ...], ...],            # one prompt per request
       "sampling_params": [{...}, ...],           # one dict per request
       "rid": [str, ...],                         # ours, to check the order
       "return_logprob": true}

  SGLang's tokenizer manager (``TokenizerManager._handle_batch_request``)
  sends a batch whose items all carry ``input_ids`` to the scheduler in one
  message, so the requests of one POST reach the scheduler together.
* response: a JSON list, one object per request in request order (the
  ``asyncio.gather`` of ``TokenizerManager._collect_batch_responses``), each
  ``{"output_ids": [int, ...], "meta_info": {...}}`` (plus ``"text"`` when
  the server has a tokenizer; ``TokenizerManager._handle_batch_output``).
  ``meta_info`` holds ``id`` (the rid), ``finish_reason``,
  ``completion_tokens``, ``output_token_logprobs`` as
  ``[[logprob, token_id, null], ...]``
  (``TokenizerManager.detokenize_logprob_tokens``), when the server runs
  speculative decoding ``spec_verify_ct`` (verify rounds) and
  ``spec_accept_length = completion_tokens / spec_verify_ct``
  (``TokenizerManager._calculate_spec_decoding_metrics``), and, on a server
  with sglang-detspec active, ``sampling_seed`` (the seed the request used).
* errors: HTTP 400 with ``{"error": "..."}`` (the schema gate
  ``api_contract.generate_contract_error``), ``{"error": {"message": "..."}}``
  (``http_server._create_error_response``) or ``{"message": "...", ...}``
  (request validation).

``GET /server_info`` (``http_server.server_info``) carries the resolved
server arguments at the top level and, per data-parallel rank under
``internal_states``, ``avg_spec_accept_length`` when the server decodes
speculatively. Neither it nor ``/model_info`` reports the vocabulary size.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import re
import threading
import uuid
from collections.abc import Sequence

import requests

from ..request import Request, RequestResult
from ..ops.seed_encoding import HTTP_SEED_RANGE, SEED_ENCODINGS, check_seed, sglang_seed
from . import DEFAULT_TIMEOUT_S
from ..ops.choices import one_of
# How much of a non-JSON error body to quote.
_MAX_ERROR_BODY = 500
# The error code an sglang-detspec server gives a sampling_seed outside [0, 2**64).
SEED_RANGE_CODE = "sampling_seed_out_of_range"  # sglang_plugin/request_rules.py
_CODE_SUFFIX = re.compile(r"\(error code: ([a-z0-9_]+)\)")


class HttpBackendError(RuntimeError):
    """The server could not be asked, refused, or answered something unusable."""


class ServerUnreachableError(HttpBackendError):
    """No connection to the server, or no answer within the timeout."""


class NotSGLangError(HttpBackendError):
    """Something answers at the URL, but not as an SGLang server does."""


class ServerHttpError(HttpBackendError):
    """The server answered with an HTTP error status.

    Attributes:
        status: the HTTP status code.
        server_message: SGLang's own error message, taken from the body.
        code: the body's machine-readable error ``code`` (:func:`error_code`), or None.
    """

    def __init__(self, message: str, status: int, server_message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message
        self.code = code


class ServerResponseError(HttpBackendError):
    """A 200 response that is not what SGLang's ``/generate`` returns for the request sent."""


@dataclasses.dataclass(frozen=True)
class ServerResult(RequestResult):
    """What one request produced on a server.

    SGLang reports per-request totals, not per-round accept lengths, so
    ``accept_lengths`` is empty and the round count sits in ``verify_rounds``.

    Attributes:
        output_ids: the generated token ids (SGLang's ``output_ids``).
        accept_lengths: always ``()``.
        verify_rounds: SGLang's ``meta_info["spec_verify_ct"]``, >= 1; None
            when the server reported none (it does not decode speculatively).
        output_logprobs: one float per output token, the first element of
            each ``meta_info["output_token_logprobs"]`` entry exactly as parsed
            from the JSON (None where the server sent ``null``); None when the
            server returned no logprobs.
        sampling_seed: the seed the server reports it used
            (``meta_info["sampling_seed"]``, in [0, 2**64)); None when it
            reported none (greedy requests, or a server without the plugin).
    """

    verify_rounds: int | None = None
    output_logprobs: tuple[float | None, ...] | None = None
    sampling_seed: int | None = None

    @property
    def mean_accept_length(self) -> float | None:
        """Committed tokens per verify round (SGLang's ``spec_accept_length``); None without rounds."""
        if self.verify_rounds is None:
            return None
        return len(self.output_ids) / self.verify_rounds


def sampling_params(request: Request, seed_encoding: str = "uint64") -> dict:
    """SGLang ``sampling_params`` for one request: exactly ``max_new_tokens`` tokens, seeded.

    ``ignore_eos`` keeps end-of-sequence tokens from ending a request early,
    so every output has ``max_new_tokens`` tokens. ``top_p``, ``top_k`` and
    ``min_p`` are sent at their no-op values so a server's preferred sampling
    parameters (merged under the request's in
    ``TokenizerManager._create_tokenized_object``) cannot narrow the
    distribution. Temperature 0 is SGLang's greedy (``SamplingParams``
    turns it into top-k 1), as it is the reference engine's.
    ``seed_encoding`` is as for :func:`sglang_seed`.

    Raises:
        ValueError: the request's seed outside [0, 2**64), or an unknown
            ``seed_encoding``.
    """
    return {
        "max_new_tokens": request.max_new_tokens,
        "temperature": request.temperature,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "ignore_eos": True,
        "sampling_seed": sglang_seed(request.sampling_seed, seed_encoding),
    }


def build_payload(requests_: Sequence[Request], rids: Sequence[str], seed_encoding: str = "uint64") -> dict:
    """The ``/generate`` body that decodes ``requests_`` as one batch.

    Args:
        requests_: at least one request, in row order.
        rids: one distinct request id per request; SGLang echoes it as
            ``meta_info["id"]``.
        seed_encoding: how seeds >= 2**63 are sent (:func:`sglang_seed`).

    Returns:
        A JSON-ready dict (see the module docstring for its shape).

    Raises:
        ValueError: no requests, ``rids`` of another length, a seed outside
            [0, 2**64) or an unknown ``seed_encoding``.
    """
    if not requests_:
        raise ValueError("a /generate batch needs at least one request")
    if len(rids) != len(requests_):
        raise ValueError(f"got {len(rids)} rids for {len(requests_)} requests")
    return {
        "input_ids": [list(r.prompt_ids) for r in requests_],
        "sampling_params": [sampling_params(r, seed_encoding) for r in requests_],
        "rid": list(rids),
        "return_logprob": True,
    }


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_result(item, request: Request | int, rid: str | None) -> ServerResult:
    """One element of a ``/generate`` response as a :class:`ServerResult`.

    Args:
        item: the parsed JSON object SGLang returned for one request.
        request: what was asked, or just its ``max_new_tokens``.
        rid: the request id sent with it; None skips the id check (SGLang
            gives the samples of an ``n > 1`` request ids of its own).

    Raises:
        ServerResponseError: ``item`` is not shaped like SGLang's output, its
            ``meta_info["id"]`` is not ``rid``, the request was aborted, it
            has other than ``max_new_tokens`` output tokens, its counters or
            logprobs disagree with its ``output_ids``, or its reported
            ``sampling_seed`` is not an int in [0, 2**64).
    """
    max_new_tokens = request if isinstance(request, int) else request.max_new_tokens
    if not isinstance(item, dict) or not isinstance(item.get("meta_info"), dict):
        raise ServerResponseError(f"request {rid}: expected an object with 'output_ids' and 'meta_info'")
    meta = item["meta_info"]
    if rid is not None and meta.get("id") != rid:
        raise ServerResponseError(f"expected the result of request {rid}, got meta_info.id {meta.get('id')!r}")
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise ServerResponseError(f"request {rid} was aborted by the server: {finish.get('message')}")
    ids = item.get("output_ids")
    if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
        raise ServerResponseError(f"request {rid}: 'output_ids' must be a list of token ids")
    if len(ids) != max_new_tokens:
        raise ServerResponseError(
            f"request {rid}: {len(ids)} output tokens for max_new_tokens={max_new_tokens} "
            f"(finish_reason {finish!r})"
        )
    completion = meta.get("completion_tokens")
    if completion is not None and completion != len(ids):
        raise ServerResponseError(f"request {rid}: completion_tokens {completion!r} but {len(ids)} output_ids")

    rounds = meta.get("spec_verify_ct")
    if rounds is not None and (not _is_int(rounds) or rounds < 1):
        raise ServerResponseError(f"request {rid}: spec_verify_ct must be an int >= 1, got {rounds!r}")

    entries = meta.get("output_token_logprobs")
    logprobs = None
    if entries is not None:
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise ServerResponseError(
                f"request {rid}: expected {len(ids)} output_token_logprobs entries, got {entries!r:.200}"
            )
        values = []
        for j, entry in enumerate(entries):
            if not isinstance(entry, list) or len(entry) < 2 or entry[1] != ids[j]:
                raise ServerResponseError(
                    f"request {rid}: output_token_logprobs[{j}] = {entry!r} does not match output token {ids[j]}"
                )
            value = entry[0]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ServerResponseError(f"request {rid}: output_token_logprobs[{j}] has logprob {value!r}")
            # JSON has no int/float distinction; 0 and 0.0 are the same logprob.
            values.append(None if value is None else float(value))
        logprobs = tuple(values)
    seed = meta.get("sampling_seed")
    if seed is not None:
        try:
            check_seed(seed, "meta_info.sampling_seed")
        except ValueError as exc:
            raise ServerResponseError(f"request {rid}: {exc}") from None
    return ServerResult(
        output_ids=tuple(ids), accept_lengths=(), verify_rounds=rounds, output_logprobs=logprobs,
        sampling_seed=seed,
    )


def parse_response(body, requests_: Sequence[Request], rids: Sequence[str]) -> list[ServerResult]:
    """A parsed ``/generate`` batch response as one :class:`ServerResult` per request, in order.

    Raises:
        ServerResponseError: ``body`` is not a list with one element per
            request, or an element fails :func:`parse_result`.
    """
    if not isinstance(body, list) or len(body) != len(requests_):
        got = f"a list of {len(body)}" if isinstance(body, list) else type(body).__name__
        raise ServerResponseError(f"expected a list of {len(requests_)} results from /generate, got {got}")
    return [parse_result(item, req, rid) for item, req, rid in zip(body, requests_, rids)]


def error_message(response: requests.Response) -> str:
    """SGLang's error message from an error response, or the start of its body."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message") is not None:
            return str(error["message"])
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if body.get(key) is not None:
                return str(body[key])
    text = response.text.strip()
    return text[:_MAX_ERROR_BODY] or response.reason or "(empty body)"


def error_code(response: requests.Response) -> str | None:
    """The machine-readable ``code`` of an error body (``{"code": ...}`` or ``{"error": {"code": ...}}``), or None.

    sglang-detspec's request errors end their message with ``(error code: CODE)``
    (SGLang passes the message through and sets ``code`` to the HTTP status);
    a string ``code`` field wins, then that suffix; stock SGLang's errors have
    neither, so they give None.
    """
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    code = error.get("code") if isinstance(error, dict) else body.get("code")
    if isinstance(code, str) and code:
        return code
    found = _CODE_SUFFIX.search(error_message(response))
    return found.group(1) if found else None


def avg_spec_accept_length(server_info: dict) -> float | None:
    """The server's average accept length from a ``/server_info`` body, or None.

    SGLang computes it per data-parallel rank as accepted tokens / verify
    rounds over the server's lifetime (since start or the last cache flush),
    folding in new rounds every ``decode_log_interval`` decode steps
    (SGLang's metrics reporter), so it lags and covers all the
    server's traffic, not just one audit. Ranks that report it are averaged
    unweighted; None when none does (no speculative decoding, or no rounds
    folded in yet).
    """
    states = server_info.get("internal_states")
    if not isinstance(states, list):
        return None
    values = [
        float(s["avg_spec_accept_length"])
        for s in states
        if isinstance(s, dict)
        and isinstance(s.get("avg_spec_accept_length"), (int, float))
        and not isinstance(s.get("avg_spec_accept_length"), bool)
        and math.isfinite(s["avg_spec_accept_length"])
    ]
    return sum(values) / len(values) if values else None


def _seed_encoding_hint(encoding: str, exc: "ServerHttpError") -> str | None:
    """What to change when a server refused a seed because of how it was encoded, or None."""
    if exc.status != 400:
        return None
    if exc.code is not None:  # a server that names its errors: match the name, never the wording
        if encoding == "int64" and exc.code == SEED_RANGE_CODE:
            return "this server runs sglang-detspec, which takes seeds as unsigned integers: drop --seed-encoding int64"
        return None
    # Stock SGLang (and servers before error codes): its wording is all there is.
    if encoding == "uint64" and "sampling_seed must be in [-2**63" in exc.server_message:
        return ("this server checks seeds as stock SGLang does, so sglang-detspec is not active there: "
                "send seeds as int64 bits with --seed-encoding int64")
    if encoding == "int64" and f"sampling_seed must be in {HTTP_SEED_RANGE}" in exc.server_message:
        return ("this server runs sglang-detspec, which takes seeds as unsigned integers: "
                "drop --seed-encoding int64")
    return None


def _chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) ranges cutting n rows into min(parts, n) contiguous runs of near-equal size."""
    parts = min(parts, n)
    base, extra = divmod(n, parts)
    out, start = [], 0
    for p in range(parts):
        stop = start + base + (p < extra)
        out.append((start, stop))
        start = stop
    return out


class HttpBackend:
    """An SGLang server's ``/generate`` endpoint as an audit backend.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:30000``.
        timeout: seconds to wait for each HTTP exchange (connect and read),
            > 0. A ``/generate`` call answers only when its whole batch is done.
        concurrency: >= 1. 1 sends each sub-batch as one POST, so SGLang
            receives its requests together. N > 1 cuts the sub-batch into
            min(N, rows) contiguous runs and sends them as that many POSTs at
            once (concurrent senders), so the server batches them as they
            arrive.
        seed_encoding: ``"uint64"`` (default; a server with sglang-detspec
            active) or ``"int64"`` (stock SGLang); see :func:`sglang_seed`.

    Raises:
        ValueError: a bad ``url``, ``timeout``, ``concurrency`` or ``seed_encoding``.

    Use as a context manager, or call :meth:`close`, to release the sender
    threads and connections.
    """

    name = "server"

    def __init__(
        self, url: str, timeout: float = DEFAULT_TIMEOUT_S, concurrency: int = 1, seed_encoding: str = "uint64"
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if seed_encoding not in SEED_ENCODINGS:
            raise ValueError(f"seed_encoding must be one of {one_of(SEED_ENCODINGS)}, got {seed_encoding!r}")
        self.seed_encoding = seed_encoding
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.concurrency = concurrency
        # requests.Session is not documented as thread-safe, so each sender
        # thread keeps its own (and with it, its own kept-alive connection).
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="detspec-http")
            if concurrency > 1 else None
        )

    def __enter__(self) -> "HttpBackend":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # On an error or Ctrl-C, do not wait for POSTs still in flight.
        self.close(wait=exc_type is None)

    def close(self, wait: bool = True) -> None:
        """Stop the sender threads and close the connections.

        Args:
            wait: wait for POSTs in flight; False drops queued ones and returns at once.
        """
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=not wait)
        with self._lock:
            for session in self._sessions:
                session.close()
            self._sessions.clear()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            with self._lock:
                self._sessions.append(session)
        return session

    def call(self, method: str, path: str, body: dict | None = None):
        """One HTTP exchange; returns the parsed JSON body of a 2xx answer.

        Raises:
            ServerUnreachableError: connection failed or timed out.
            ServerHttpError: an HTTP error status (message from the body).
            ServerResponseError: a 2xx answer that is not JSON.
        """
        where = f"{self.url}{path}"
        try:
            response = self._session().request(method, where, json=body, timeout=self.timeout)
        except requests.Timeout:
            raise ServerUnreachableError(f"no answer from {where} within {self.timeout:g} s") from None
        except requests.ConnectionError:
            raise ServerUnreachableError(
                f"no SGLang server answers at {self.url} (start one with `detspec serve ...`)"
            ) from None
        except requests.RequestException as exc:
            raise ServerUnreachableError(f"request to {where} failed: {exc}") from None
        if not response.ok:
            message = error_message(response)
            raise ServerHttpError(
                f"{method} {path} returned HTTP {response.status_code}: {message}", response.status_code, message,
                error_code(response),
            )
        try:
            return response.json()
        except ValueError:
            text = response.text[:_MAX_ERROR_BODY]
            raise ServerResponseError(f"{method} {path} answered with non-JSON: {text!r}") from None

    def server_info(self) -> dict:
        """``GET /server_info`` (``/get_server_info`` on servers without it).

        Raises:
            NotSGLangError: both paths answer HTTP 404, or the answer is not
                a JSON object: whatever listens there is not an SGLang server.
            HttpBackendError: as for :meth:`generate`.
        """
        try:
            info = self.call("GET", "/server_info")
        except ServerHttpError as exc:
            if exc.status != 404:
                raise
            try:
                info = self.call("GET", "/get_server_info")
            except ServerHttpError as again:
                if again.status != 404:
                    raise
                raise NotSGLangError(
                    f"{self.url} is not an SGLang server: it answers HTTP 404 to /server_info and "
                    "/get_server_info (give the base URL of a server started with `detspec serve ...`)"
                ) from None
        except ServerResponseError:
            raise NotSGLangError(f"{self.url} is not an SGLang server: /server_info answered with non-JSON") from None
        if not isinstance(info, dict):
            raise NotSGLangError(
                f"{self.url} is not an SGLang server: /server_info answered with a JSON "
                f"{type(info).__name__}, not an object"
            )
        return info

    def post_generate(self, payload: dict):
        """``POST /generate`` with ``payload``; returns the parsed JSON answer.

        Raises:
            HttpBackendError: as :meth:`call`; a refusal of a seed that the
                other ``seed_encoding`` would have carried says so.
        """
        try:
            return self.call("POST", "/generate", payload)
        except ServerHttpError as exc:
            hint = _seed_encoding_hint(self.seed_encoding, exc)
            if hint is None:
                raise
            raise ServerHttpError(f"{exc} ({hint})", exc.status, exc.server_message, exc.code) from None

    def _post_batch(self, batch: Sequence[Request]) -> list[ServerResult]:
        # Fresh random rids: unique across concurrent POSTs and audit runs,
        # and echoed back so a misordered answer is caught, not miscounted.
        rids = [uuid.uuid4().hex for _ in batch]
        body = self.post_generate(build_payload(batch, rids, self.seed_encoding))
        return parse_response(body, batch, rids)

    def generate(self, requests_: Sequence[Request]) -> list[ServerResult]:
        """Decode ``requests_`` on the server; one :class:`ServerResult` per request, in order.

        Args:
            requests_: the sub-batch, in row order; may be empty (no POST).

        Raises:
            ServerUnreachableError: no connection or no answer in time.
            ServerHttpError: the server refused a POST (SGLang's message included).
            ServerResponseError: an answer that does not fit the requests.
        """
        batch = list(requests_)
        if not batch:
            return []
        if self._pool is None:
            return self._post_batch(batch)
        futures = [self._pool.submit(self._post_batch, batch[a:b]) for a, b in _chunks(len(batch), self.concurrency)]
        results: list[ServerResult] = []
        for future in futures:
            results.extend(future.result())
        return results
