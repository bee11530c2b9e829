"""Resolve the config bag from SGLang's resolved server arguments, once per process.

The launcher resolves it from the ``ServerArgs`` record during SGLang's own
argument resolution; scheduler processes (where the speculative worker runs)
receive an already-resolved record and resolve the bag from SGLang's runtime
context (``get_exec()`` / ``get_spec()``) the first time a hook needs it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from ..config import DetSpecConfig, current_config, env_settings, install_config

logger = logging.getLogger("sglang_detspec")

_lock = threading.Lock()


def _normalise_algorithm(name) -> str | None:
    if name is None:
        return None
    upper = str(name).upper()
    return None if upper == "NONE" else upper


def _bag(*, deterministic, algorithm, num_steps, eagle_topk, num_draft_tokens, rejection_sampling,
         multi_layer_eagle, block_verification, source, environ) -> DetSpecConfig:
    return DetSpecConfig(
        **env_settings(environ),
        deterministic=bool(deterministic),
        algorithm=_normalise_algorithm(algorithm),
        num_steps=num_steps,
        eagle_topk=eagle_topk,
        num_draft_tokens=num_draft_tokens,
        rejection_sampling=bool(rejection_sampling),
        multi_layer_eagle=bool(multi_layer_eagle),
        block_verification=bool(block_verification),
        source=source,
    )


def config_from_server_args(server_args, environ: Mapping[str, str] | None = None) -> DetSpecConfig:
    """The bag from a ``ServerArgs`` record, read through SGLang's resolved view.

    SGLang keeps raw CLI values on the record (``nextn`` stays ``nextn``) and
    the resolved ones (``EAGLE``) beside it, so this reads ``resolved_view``.

    Raises:
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting.
    """
    from sglang.srt.arg_groups.overrides import resolved_view

    v = resolved_view(server_args)
    return _bag(
        deterministic=v.enable_deterministic_inference,
        algorithm=v.speculative_algorithm,
        num_steps=v.speculative_num_steps,
        eagle_topk=v.speculative_eagle_topk,
        num_draft_tokens=v.speculative_num_draft_tokens,
        rejection_sampling=v.speculative_use_rejection_sampling,
        multi_layer_eagle=v.enable_multi_layer_eagle,
        block_verification=v.speculative_use_block_verification,
        source="server_args",
        environ=environ,
    )


def config_from_runtime_context(environ: Mapping[str, str] | None = None) -> DetSpecConfig:
    """The bag from SGLang's published runtime context.

    Raises:
        LookupError: the context is not published in this process yet.
    """
    from sglang.srt.runtime_context import get_exec, get_spec

    try:
        exec_bag, spec = get_exec(), get_spec()
    except ValueError as err:  # SGLang raises ValueError("... not published")
        raise LookupError(str(err)) from err
    return _bag(
        deterministic=exec_bag.deterministic.enable_deterministic_inference,
        algorithm=spec.speculative_algorithm,
        num_steps=spec.speculative_num_steps,
        eagle_topk=spec.speculative_eagle_topk,
        num_draft_tokens=spec.speculative_num_draft_tokens,
        rejection_sampling=spec.speculative_use_rejection_sampling,
        multi_layer_eagle=spec.enable_multi_layer_eagle,
        block_verification=spec.speculative_use_block_verification,
        source="runtime_context",
        environ=environ,
    )


def announce(config: DetSpecConfig) -> None:
    """The start-up log line: whether sglang-detspec is active, and the bag."""
    state = "active" if config.active else "inactive (SGLang's own sampling runs)"
    logger.warning("sglang-detspec %s: %s", state, config.describe())


def active_config() -> DetSpecConfig:
    """The bag every hook reads.

    Resolved from SGLang once per process: a bag installed from server
    arguments or the runtime context is returned as is; otherwise the runtime
    context is read (and the bag installed and announced) if it is published,
    else the environment-only bag (inactive) is returned.
    """
    bag = current_config()
    if bag.source != "env":
        return bag
    with _lock:
        bag = current_config()
        if bag.source != "env":
            return bag
        try:
            bag = install_config(config_from_runtime_context())
        except LookupError:
            return bag
    announce(bag)
    return bag
