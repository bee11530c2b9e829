"""What ``test_forward_modes.py`` measures: its rows, the servers they need, the backends it runs on.

Plain data and small functions, no server and no GPU: the CPU unit tests
(``test/registered/unit/test_forward_modes_plan.py``) read the same table the
GPU suite runs.

A row compares one speculative server with the server without speculative
decoding on the same model, backend and extra flags (its reference). Servers
are keyed by (family, extra environment, extra flags), so rows that need the
same server share it, and each backend starts each key once.
"""

from __future__ import annotations

import dataclasses
import os

import _e2e
from sglang_detspec.config import DEFAULT_DECODE_ATTENTION, FA3_SPLIT_BACKENDS, ONE_PASS_DECODE_BACKENDS

BACKENDS_ENV = "DETSPEC_E2E_BACKENDS"
# The deterministic attention backends this suite measures (SGLang 0.5.23 also allows fa4,
# ascend and intel_xpu: not on an H200).
KNOWN_BACKENDS = ("triton", "fa3", "flashinfer")
# The backend whose tree verify has the plugin's node path (sglang_plugin/tree_attention_hook.py).
NODE_PATH_BACKEND = "fa3"

FORCE_RETRACT = (("SGLANG_TEST_RETRACT", "1"),)
TREE_NODES = (("SGLANG_DETSPEC_TREE_ATTENTION", "nodes"),)
CHUNK_TOKENS = 256
CHUNKED_PREFILL = ("--chunked-prefill-size", str(CHUNK_TOKENS))
# Server-name tags of the extra environment and flags (names must stay distinct per backend).
TAGS = {FORCE_RETRACT: "_retract", TREE_NODES: "_nodes", CHUNKED_PREFILL: "_chunked"}

# Prompt lengths in tokens: short prompts fit one chunk of CHUNK_TOKENS, and with NEW_TOKENS every
# sequence passes FA3's first 128-key block (at head sizes up to 64 FA3 splits a one-row decode's
# keys apart from a prefill's past it: docs/forward_modes.md); long ones span 3 to 6 chunks. The tiny
# models' context is 4096 positions (scripts/make_tiny_models.py), which the longest prompt plus
# NEW_TOKENS stays within.
TINY_CONTEXT = 4096
FA3_FIRST_BLOCK_KEYS = 128
SHORT_PROMPTS = (100, 190)
LONG_PROMPTS = (600, 1500)
NEW_TOKENS = 64


def tree_attention(env: tuple) -> str:
    """The tree verify attention a server's extra environment selects: ``nodes`` or SGLang's ``cascade``."""
    return "nodes" if env == TREE_NODES else "cascade"


def server_env(env: tuple) -> tuple:
    """A server's extra environment with its tree attention and both draft-shape bounds named.

    A row measures the tree verify its name says (:func:`tree_attention`) at a
    fixed draft shape; left unset, an FA3 tree at a target head size of
    65-128 would take ``config.FA3_TREE_DEFAULTS`` (the node path and both
    bounds). The decode attention is named as the suite's (:func:`decode_attention`), which the
    rows' expected claims read.
    """
    named = {"SGLANG_DETSPEC_TREE_ATTENTION": tree_attention(env), "SGLANG_DETSPEC_DECODE_ATTENTION": decode_attention(),
             "SGLANG_DETSPEC_TREE_CHAIN_BATCH": "0", "SGLANG_DETSPEC_TREE_CHAIN_TOKENS": "0"}
    return tuple({**named, **dict(env)}.items())


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of ``forward_modes_<backend>.json``: a speculative server against its reference.

    Attributes:
        drafting: the row's ``drafting`` field (what kind of speculative decoding).
        family: the speculative server's family in ``_e2e.FAMILIES``.
        reference: the family of the server without speculative decoding on the same model.
        env: extra environment of the speculative server only.
        args: extra flags of both servers (the reference runs with them too).
        prompts: :data:`SHORT_PROMPTS` or :data:`LONG_PROMPTS`.
    """

    drafting: str
    family: str
    reference: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    prompts: tuple[int, int] = SHORT_PROMPTS

    @property
    def tree_attention(self) -> str:
        return tree_attention(self.env)

    @property
    def server(self) -> tuple:
        """The key of the speculative server."""
        return (self.family, self.env, self.args)

    @property
    def reference_server(self) -> tuple:
        """The key of the reference server."""
        return (self.reference, (), self.args)


ROWS = {
    "chain": Row("chain", "coupled_chain", "no_spec"),
    "tree": Row("tree", "coupled_tree", "no_spec"),
    "multi_layer": Row("multi_layer", "mtp_coupled", "mtp_no_spec"),
    "retraction": Row("retraction", "coupled_chain", "no_spec", env=FORCE_RETRACT),
    # The EAGLE3 drafts are drafts of target/, so the target's no_spec server is the reference.
    "eagle3_tree": Row("eagle3_tree", "eagle3_tree", "no_spec"),
    "nextn_tree": Row("nextn_tree", "nextn_tree", "mimo_no_spec"),
    "chunked": Row("chunked", "coupled_tree", "no_spec", args=CHUNKED_PREFILL, prompts=LONG_PROMPTS),
    # A chain's verify against no speculative decoding's decode past 128 keys: at the tiny models' head
    # size (64) FA3 runs a one-row decode call on another kernel than a verify; without the split: tokens.
    "chunked_chain": Row("chunked_chain", "coupled_chain", "no_spec", args=CHUNKED_PREFILL, prompts=LONG_PROMPTS),
}
# Extra rows per backend: on the node-path backend, each tree row again with the node path.
NODE_SUFFIX = "_nodes"
CACHE_HIT = "cache_hit"
# The cache-hit row runs on this server: the short-prompt reference of the target model.
CACHE_HIT_SERVER = ("no_spec", (), ())


def spec_flag(family_name: str, flag: str) -> str | None:
    """The value of speculative-decoding flag ``flag`` in a family's arguments, or None where it has none.

    Raises:
        ValueError: unknown family (``_e2e.family``).
    """
    args = _e2e.family(family_name).spec_args
    return args[args.index(flag) + 1] if flag in args else None


def eagle_topk(family_name: str) -> int:
    """``--speculative-eagle-topk`` of a family (1 where it has none: a chain, or no speculative decoding).

    Raises:
        ValueError: unknown family (``_e2e.family``).
    """
    return int(spec_flag(family_name, "--speculative-eagle-topk") or 1)


def verifies_trees(family_name: str) -> bool:
    """Whether a family's server verifies draft trees, by the plugin's own rule (``DetSpecConfig.verifies_trees``).

    Raises:
        ValueError: unknown family (``_e2e.family``).
    """
    from sglang_detspec.config import DetSpecConfig

    algorithm = spec_flag(family_name, "--speculative-algorithm")
    return DetSpecConfig(algorithm=algorithm, eagle_topk=eagle_topk(family_name)).verifies_trees


def is_tree(row: Row) -> bool:
    return eagle_topk(row.family) > 1


def rows_for(backend: str, decode: str | None = None) -> dict[str, Row]:
    """The rows measured on ``backend`` (the cache-hit row apart), by name.

    On :data:`NODE_PATH_BACKEND` without the prefix / tail split (``decode``,
    the run's :func:`decode_attention` when None, not ``split``), every tree
    row served with SGLang's cascade also runs with
    ``SGLANG_DETSPEC_TREE_ATTENTION=nodes`` as ``<name>_nodes``: under the
    split the node path stands down, and the split rows are the trees' rows.

    Raises:
        ValueError: ``backend`` not in :data:`KNOWN_BACKENDS`.
    """
    if backend not in KNOWN_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(KNOWN_BACKENDS)}, got {backend!r}")
    rows = dict(ROWS)
    if backend == NODE_PATH_BACKEND and (decode_attention() if decode is None else decode) != "split":
        rows.update({name + NODE_SUFFIX: dataclasses.replace(row, env=TREE_NODES)
                     for name, row in ROWS.items() if is_tree(row) and not row.env})
    return rows


def skipped_rows(backend: str) -> dict[str, str]:
    """Rows of :func:`rows_for` that SGLang refuses to serve on ``backend``, with the reason.

    Deterministic flashinfer aligns prefill chunks to its prefill split tile
    (``SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE``, 4096 tokens by default) and
    refuses at start-up a ``--chunked-prefill-size`` below it; a chunk that
    large holds every prompt the tiny models' 4096-token context allows, so
    nothing would be chunked.
    """
    if backend != "flashinfer":
        return {}
    from sglang.srt.environ import envs

    tile = envs.SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE.get()
    if CHUNK_TOKENS >= tile:
        return {}
    reason = (f"SGLang aligns prefill chunks to flashinfer's {tile}-token prefill split tile in deterministic mode "
              f"and refuses --chunked-prefill-size {CHUNK_TOKENS} at start-up")
    if tile >= TINY_CONTEXT:  # SGLang's default; a smaller tile (set in the environment) would chunk some prompts
        reason += f"; chunks of {tile} tokens would leave every prompt the tiny models' {TINY_CONTEXT}-token " \
                  "context holds unchunked"
    return {name: reason for name, row in rows_for(backend).items() if row.args == CHUNKED_PREFILL}


def server_keys(backend: str) -> list[tuple]:
    """The distinct servers ``backend`` starts: (family, env, args) keys, in row order, each once.

    Rows of :func:`skipped_rows` start no server.
    """
    keys = [CACHE_HIT_SERVER]
    skipped = skipped_rows(backend)
    for name, row in rows_for(backend).items():
        if name not in skipped:
            keys += [row.server, row.reference_server]
    return list(dict.fromkeys(keys))


def server_tag(backend: str, env: tuple, args: tuple) -> str:
    """The server name's tag for a key on ``backend``: the backend, then the flags' and environment's tags."""
    return backend + TAGS.get(args, "") + TAGS.get(env, "")


def selected_backends(environ=None, fa3_installed=None, known: tuple[str, ...] = KNOWN_BACKENDS) -> tuple[str, ...]:
    """The backends to measure: ``DETSPEC_E2E_BACKENDS`` (comma-separated), else all that can run here.

    Unset or empty: the ``known`` backends (default ``triton``, ``fa3`` and
    ``flashinfer``, which ships with SGLang), fa3 only where sgl-kernel's FA3
    library loads (``_e2e.fa3_installed``).
    Given: the backends named, in that order (fa3 is then kept even where it
    is not installed: the test fails saying so instead of passing without it).

    Args:
        environ: the environment to read (default ``os.environ``).
        fa3_installed: a no-argument callable (default ``_e2e.fa3_installed``).
        known: the backends a suite measures (a subset of :data:`KNOWN_BACKENDS`).

    Raises:
        ValueError: a name outside ``known``, a name given twice,
            or no name at all (e.g. ``","``); the message names the variable
            and the allowed values.
    """
    environ = os.environ if environ is None else environ
    fa3_installed = _e2e.fa3_installed if fa3_installed is None else fa3_installed
    raw = environ.get(BACKENDS_ENV)
    if raw is None or raw.strip() == "":
        return tuple(b for b in known if b != "fa3" or fa3_installed())
    return _e2e.backend_list(BACKENDS_ENV, raw, known)


def radix_cache_backends() -> tuple[str, ...]:
    """The attention backends on which SGLang keeps the radix cache in deterministic mode.

    SGLang's own list (``sglang.srt.arg_groups.choices``, read by
    ``handle_deterministic_inference``, which turns the radix cache off
    elsewhere); imported here so the plan follows the SGLang installed.
    """
    from sglang.srt.arg_groups.choices import RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND

    return tuple(RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND)


def cache_hit_skip_reason(backend: str) -> str | None:
    """Why the cache-hit row does not apply on ``backend`` (None: it applies)."""
    if backend in radix_cache_backends():
        return None
    return (f"SGLang turns the radix cache off in deterministic mode on {backend} (it keeps it only on "
            f"{', '.join(radix_cache_backends())}): no request can be served from the cache")


# Decode against prefill: each server's own generated sequences, the logprobs its decode (or
# verify) returned against those of one prefill of prompt + output. At temperature 1 without
# truncation: SGLang returns decode logprobs as log_softmax(logits / T) and prefill (input)
# logprobs as log_softmax(logits), the same function only at T = 1.
PREFILL_ROW_PREFIX = "prefill_"
DECODE_VS_PREFILL = "decode_vs_prefill"


def prefill_rows(backend: str) -> dict[str, tuple]:
    """The decode-against-prefill rows on ``backend``: row name -> server key, one per server it starts.

    Named ``prefill_<family><flag tag><environment tag>`` (e.g.
    ``prefill_no_spec``, ``prefill_coupled_tree_chunked_nodes``).

    Raises:
        ValueError: ``backend`` not in :data:`KNOWN_BACKENDS`.
    """
    return {PREFILL_ROW_PREFIX + key[0] + TAGS.get(key[2], "") + TAGS.get(key[1], ""): key
            for key in server_keys(backend)}


def prompt_lengths(key: tuple) -> tuple[int, int]:
    """The prompt lengths a server's traffic uses: :data:`LONG_PROMPTS` with chunked prefill, else short."""
    return LONG_PROMPTS if key[2] == CHUNKED_PREFILL else SHORT_PROMPTS


def compare_with_prefill(decoded: list, prefilled: list, prompt_lens: list[int]) -> dict:
    """Decode (or verify) logprobs against one prefill of the same sequences, request by request.

    Args:
        decoded: per request a ``_requests.Generated`` with ``logprobs`` (as
            ``repr`` strings), or an error string.
        prefilled: per request the ``meta_info["input_token_logprobs"]`` of
            a ``/generate`` of prompt + output with ``logprob_start_len`` 0
            (``[logprob, token_id, text]`` per input position, the first
            ``[None, ...]``), or an error string.
        prompt_lens: per request the prompt's length in tokens: output token
            ``j`` is input position ``prompt_len + j`` of the prefill.

    Returns:
        the layout of the forward-mode rows: ``positions`` (output tokens
        compared), ``differing_positions`` (logprobs not bitwise equal),
        ``max_abs``, ``token_sequences_differing`` (sequences whose prefill
        entries name other token ids than the output: 0 unless the answer is
        out of line), ``errors`` and per-request ``requests``.

    Raises:
        ValueError: the three lists differ in length.
    """
    if not len(decoded) == len(prefilled) == len(prompt_lens):
        raise ValueError(f"decoded, prefilled and prompt_lens must have one entry per request, got "
                         f"{len(decoded)}, {len(prefilled)}, {len(prompt_lens)}")
    positions = differing = sequences = 0
    max_abs, errors, rows = 0.0, [], []
    for i, (d, entries, start) in enumerate(zip(decoded, prefilled, prompt_lens)):
        if isinstance(d, str) or isinstance(entries, str):
            errors.append(f"request {i}: {d if isinstance(d, str) else entries}")
            continue
        n = len(d.output_ids)
        if d.logprobs is None:
            errors.append(f"request {i}: the decode returned no logprobs")
            continue
        if len(entries) != start + n:
            errors.append(f"request {i}: {len(entries)} prefill logprob entries for {start} prompt and {n} output tokens")
            continue
        tail = entries[start:]
        ids_apart = [e[1] for e in tail] != list(d.output_ids)
        pre = [repr(None if e[0] is None else float(e[0])) for e in tail]
        apart = [j for j, (x, y) in enumerate(zip(d.logprobs, pre)) if x != y]
        diffs = [abs(float(d.logprobs[j]) - float(pre[j])) for j in apart if "None" not in (d.logprobs[j], pre[j])]
        positions += n
        differing += len(apart)
        sequences += ids_apart
        max_abs = max([max_abs, *diffs])
        rows.append({"request": i, "prompt_tokens": start, "differing_logprobs": len(apart),
                     "first_differing_logprob": apart[0] if apart else None, "token_ids_apart": ids_apart})
    return {"positions": positions, "differing_positions": differing, "max_abs": max_abs,
            "token_sequences_differing": sequences, "errors": errors, "requests": rows}


def decode_attention(environ=None) -> str:
    """The decode path every server of the run takes: ``SGLANG_DETSPEC_DECODE_ATTENTION`` as the plugin reads it.

    The servers inherit the suite's environment, so a run with
    ``SGLANG_DETSPEC_DECODE_ATTENTION=split`` measures the positional-split
    kernels on Triton and the prefix / tail split on FA3 (the reference
    servers too: both sides of each row).

    Raises:
        ValueError: a value the plugin refuses (its message names the variable).
    """
    from sglang_detspec.config import env_settings

    return env_settings(os.environ if environ is None else environ)["decode_attention"]


def result_name(backend: str, decode: str) -> str:
    """The result file's name: ``forward_modes_<backend>`` under the default decode setting (the split), with a
    suffix naming the path that ran otherwise.

    Triton's decode takes every setting (``_one_pass``, ``_sglang``); FA3 runs SGLang's calls under both
    others (``_sglang``); other backends take none.
    """
    if decode == DEFAULT_DECODE_ATTENTION or backend not in ONE_PASS_DECODE_BACKENDS + FA3_SPLIT_BACKENDS:
        return f"forward_modes_{backend}"
    return f"forward_modes_{backend}_" + (decode if backend in ONE_PASS_DECODE_BACKENDS else "sglang")
