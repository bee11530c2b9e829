"""Start-up validation: refuse combinations the plugin cannot make deterministic.

Hooked around SGLang's ``handle_speculative_decoding`` resolution step, which
runs in the launcher before any scheduler process starts, so a bad
combination stops the server with a message that says what to change. The
rules themselves live in the config bag (:meth:`DetSpecConfig.refusals`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..config import VERIFY_ENV, DetSpecConfig, install_config
from .resolve import announce, bag_from, config_from_server_args

TARGET = "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"


def _raise(bag: DetSpecConfig) -> None:
    problems = bag.refusals()
    if problems:
        raise ValueError(
            f"sglang-detspec cannot make this run deterministic with --enable-deterministic-inference "
            f"({bag.verify} verify):\n  - " + "\n  - ".join(problems)
        )


def check_raw_flags(server_args) -> None:
    """BEFORE hook for ``handle_speculative_decoding``: check the flags as typed.

    Runs before SGLang's own speculative checks, so our message (which says
    what to change) comes first.

    Raises:
        ValueError: the bag's :meth:`~DetSpecConfig.refusals`, one line each.
    """
    raw = bag_from(server_args, getattr(server_args, "enable_deterministic_inference", False), "raw_args")
    _raise(raw)


def resolve_and_announce(result, server_args) -> None:
    """AFTER hook for ``handle_speculative_decoding``: resolve, re-check, install, log.

    SGLang may change speculative flags during resolution (NEXTN becomes
    EAGLE, NGRAM gets its tree shape, block verification can turn rejection
    sampling on), so the resolved values are checked again before the bag is
    installed.

    Raises:
        ValueError: the bag's :meth:`~DetSpecConfig.refusals`, one line each.
    """
    bag = config_from_server_args(server_args)
    _raise(bag)
    if bag.wants_sampled_drafts(reduced_draft_vocab(server_args)):
        bag = turn_on_sampled_drafts(server_args)
    install_config(bag)
    announce(bag)
    return None


def reduced_draft_vocab(server_args) -> bool:
    """Whether the draft proposes over a reduced (hot-token) vocabulary.

    A ``--speculative-token-map``, or a local draft ``config.json`` whose
    ``draft_vocab_size`` differs from its ``vocab_size`` (EAGLE3 checkpoints
    with a ``d2t`` map). A draft path that cannot be read counts as full.
    """
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(server_args)
    if getattr(view, "speculative_token_map", None):
        return True
    path = getattr(view, "speculative_draft_model_path", None)
    try:
        config = json.loads((Path(path) / "config.json").read_text()) if path else {}
    except (OSError, ValueError):
        return False
    draft_vocab = config.get("draft_vocab_size")
    return draft_vocab is not None and draft_vocab != config.get("vocab_size")


def turn_on_sampled_drafts(server_args) -> DetSpecConfig:
    """Resolve SGLang's rejection-sampling flag on for a coupled chain, keep coupled verify; the new bag.

    The flag routes SGLang's chain drafts through its seeded sampled-draft
    path (``draft_hook`` races them on the TARGET stream) and its verify
    through the chain sampler (``verify_hook`` runs coupled verify there).
    ``SGLANG_DETSPEC_VERIFY=coupled`` is exported so the scheduler processes,
    which see the flag on, resolve coupled rather than ``auto``'s rejection.
    """
    from sglang.srt.arg_groups.overrides import declare_resolution

    declare_resolution(server_args, "sglang_detspec.coupled_drafts", speculative_use_rejection_sampling=True)
    os.environ[VERIFY_ENV] = "coupled"
    return config_from_server_args(server_args)
