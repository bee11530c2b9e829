"""Resolve the config bag from SGLang's resolved server arguments, once per process.

The launcher resolves it from the ``ServerArgs`` record during SGLang's own
argument resolution; scheduler processes (where the speculative worker runs)
receive an already-resolved record and resolve the bag from SGLang's runtime
context (``get_exec()`` / ``get_spec()``) the first time a hook reads the
bag (:func:`late_bag`, registered with the config getter by ``register()``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from ..config import DetSpecConfig, env_settings, resolve_verify

logger = logging.getLogger("sglang_detspec")


# Bag field -> SGLang's server-argument name (the same on the raw ServerArgs
# record, its resolved view and the published "spec" namespace).
SPEC_FIELDS = {
    "algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "eagle_topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
    "rejection_sampling": "speculative_use_rejection_sampling",
    "multi_layer_eagle": "enable_multi_layer_eagle",
    "block_verification": "speculative_use_block_verification",
    "rl_on_policy": "rl_on_policy_target",  # in the "exec.deterministic" namespace once published
}
_FLAGS = ("rejection_sampling", "multi_layer_eagle", "block_verification", "rl_on_policy")
# The source name of the plugin's own declaration on SGLang's resolution stash (startup.py):
# it turned the rejection-sampling flag on for a coupled chain's sampled drafts.
SAMPLED_DRAFTS_SOURCE = "sglang_detspec.coupled_drafts"


def declared_sampled_drafts(server_args) -> bool:
    """Whether the plugin's start-up turned SGLang's sampled-draft path on for this server.

    Read from SGLang's resolution stash on the ``ServerArgs`` record, which
    SGLang pickles to the scheduler processes with the record (its own
    declared resolutions travel the same way).
    """
    stash = getattr(server_args, "_resolved_overrides", None) or ()
    return any(source == SAMPLED_DRAFTS_SOURCE for source, _ in stash)


def bag_from(spec, deterministic, source: str, environ: Mapping[str, str] | None = None, *,
             sampled_drafts: bool = False) -> DetSpecConfig:
    """A bag from any object carrying SGLang's speculative argument names.

    Args:
        spec: the ``ServerArgs`` record (raw values), its resolved view, or
            ``get_spec()``; attributes named as in :data:`SPEC_FIELDS`.
        deterministic: ``enable_deterministic_inference``.
        source: where the values came from (``server_args``, ``runtime_context``, ``raw_args``).
        sampled_drafts: the plugin turned the rejection-sampling flag on for
            coupled drafts (:func:`declared_sampled_drafts`): the verify stays coupled.

    Raises:
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting.
    """
    values = {field: getattr(spec, name, None) for field, name in SPEC_FIELDS.items()}
    for flag in _FLAGS:
        values[flag] = bool(values[flag])
    # Launcher-side only (the scheduler's runtime context has no such field; its launcher refused it).
    values["tokenizer_workers"] = int(getattr(spec, "tokenizer_worker_num", 1) or 1)
    # Read from the draft's config.json; only a known reduced vocabulary counts (for the refusal).
    values["reduced_draft_vocab"] = reduced_draft_vocab(spec) is True
    algo = values["algorithm"]
    values["algorithm"] = None if algo is None or str(algo).upper() == "NONE" else str(algo).upper()
    settings = env_settings(environ)
    settings["verify"] = "coupled" if sampled_drafts else resolve_verify(settings["verify"], values["rejection_sampling"])
    return DetSpecConfig(**settings, deterministic=bool(deterministic), source=source, **values)


def config_from_server_args(server_args, environ: Mapping[str, str] | None = None) -> DetSpecConfig:
    """The bag from a ``ServerArgs`` record, read through SGLang's resolved view.

    SGLang keeps raw CLI values on the record (``nextn`` stays ``nextn``) and
    the resolved ones (``EAGLE``) beside it, so this reads ``resolved_view``.

    Raises:
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting.
    """
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(server_args)
    return bag_from(view, view.enable_deterministic_inference, "server_args", environ,
                    sampled_drafts=declared_sampled_drafts(server_args))


def config_from_runtime_context(environ: Mapping[str, str] | None = None) -> DetSpecConfig:
    """The bag from SGLang's published runtime context.

    Raises:
        LookupError: the context is not published in this process yet.
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting.
    """
    from sglang.srt.runtime_context import get_context, get_exec, get_spec

    try:
        exec_bag, spec, record = get_exec(), get_spec(), get_context().server_args
    except ValueError as err:  # SGLang raises ValueError("... not published")
        raise LookupError(str(err)) from err
    det = exec_bag.deterministic
    bag = bag_from(spec, det.enable_deterministic_inference, "runtime_context", environ,
                   sampled_drafts=declared_sampled_drafts(record))
    return dataclasses.replace(bag, rl_on_policy=bool(getattr(det, "rl_on_policy_target", None)))


def announce(config: DetSpecConfig) -> None:
    """The start-up log line: whether sglang-detspec is active, and the bag (verify mode included)."""
    state = "active" if config.active else "inactive (SGLang's own sampling runs)"
    logger.warning("sglang-detspec %s: %s", state, config.describe())


def late_bag() -> DetSpecConfig | None:
    """The bag of a scheduler process, from SGLang's runtime context; None until it is published."""
    try:
        return config_from_runtime_context()
    except LookupError:
        return None


def reduced_draft_vocab(spec) -> bool | None:
    """Whether the draft of ``spec`` (SGLang's argument names) proposes over a reduced vocabulary.

    True with ``--speculative-token-map`` (SGLang ignores the map for EAGLE3,
    whose checkpoint carries its own), or when the draft's ``config.json``
    (local, or in the Hugging Face cache for a repository id) has a
    ``draft_vocab_size`` other than its ``vocab_size`` (EAGLE3 checkpoints
    with a ``d2t`` map). None when an EAGLE3 draft's ``config.json`` cannot be
    read (most EAGLE3 checkpoints are reduced); False otherwise (EAGLE drafts
    share the target's head).
    """
    algorithm = str(getattr(spec, "speculative_algorithm", None) or "").upper()
    if not algorithm or algorithm == "NONE":
        return False
    if getattr(spec, "speculative_token_map", None) and algorithm != "EAGLE3":
        return True
    path = getattr(spec, "speculative_draft_model_path", None)
    try:
        config = json.loads(Path(_config_file(path)).read_text()) if path else None
    except (OSError, ValueError, TypeError):
        config = None
    if config is None:
        return None if algorithm == "EAGLE3" else False
    draft_vocab = config.get("draft_vocab_size")
    return draft_vocab is not None and draft_vocab != config.get("vocab_size")


def _config_file(path: str):
    """The draft's ``config.json``: in a local folder, else in the Hugging Face cache (None if absent)."""
    local = Path(path) / "config.json"
    if local.is_file():
        return local
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
    except Exception:  # not a repository id, or no hub client
        return None
    return cached if isinstance(cached, str) else None
