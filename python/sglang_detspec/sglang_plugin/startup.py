"""Start-up validation: refuse combinations the plugin cannot make deterministic.

Hooked around SGLang's ``handle_speculative_decoding`` resolution step, which
runs in the launcher before any scheduler process starts, so a bad
combination stops the server with a message that says what to change. The
rules themselves live in the config bag (:meth:`DetSpecConfig.refusals`).
``resolve.sglang_refusals`` states, for ``detspec serve``'s up-front check,
what SGLang's own deterministic-inference resolution refuses among the flags.
"""

from __future__ import annotations

import logging

from ..config import DetSpecConfig, install_config
from .startup_notes import announce, mla_chain_note, sampled_drafts_unavailable_note
from .resolve import SAMPLED_DRAFTS_SOURCE, bag_from, config_from_server_args, sampled_draft_blockers

TARGET = "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"
# The source of the declaration that serves an MLA target's tree as its chain (DetSpecConfig.mla_tree_as_chain).
MLA_CHAIN_SOURCE = "sglang_detspec.mla_tree_as_chain"


class RefusedError(ValueError):
    """Start-up refused the run: one line per refusal, each ending with its stable code; :attr:`codes` lists them."""

    def __init__(self, bag: DetSpecConfig, refusals: list) -> None:
        self.codes = [r.code for r in refusals]
        super().__init__(
            f"sglang-detspec cannot make this run deterministic with --enable-deterministic-inference "
            f"({bag.verify} verify):\n  - " + "\n  - ".join(f"{r} [refusal: {r.code}]" for r in refusals)
        )

    def __reduce__(self):
        # Crossing a process boundary: a plain ValueError with the same message (the codes are in it).
        return ValueError, (str(self),)


def _raise(bag: DetSpecConfig) -> None:
    problems = bag.refusals()
    if problems:
        raise RefusedError(bag, problems)


def check_raw_flags(server_args) -> None:
    """BEFORE hook for ``handle_speculative_decoding``: check the flags as typed.

    Runs before SGLang's own speculative checks, so our message (which says
    what to change) comes first, and an MLA target's tree is declared the
    chain of its depth here (:func:`declare_mla_chain`), so SGLang's
    speculative resolution (adaptive steps, draft-token budgets) sees the
    chain the server will run.

    Raises:
        RefusedError: (a ValueError) the bag's :meth:`~DetSpecConfig.refusals`, one line each with its code.
    """
    raw = bag_from(server_args, getattr(server_args, "enable_deterministic_inference", False), "raw_args")
    _raise(raw)
    if raw.mla_tree_as_chain:
        declare_mla_chain(server_args, raw)


def resolve_and_announce(result, server_args) -> None:
    """AFTER hook for ``handle_speculative_decoding``: resolve, re-check, install, log.

    SGLang may change speculative flags during resolution (NEXTN becomes
    EAGLE, NGRAM gets its tree shape, block verification can turn rejection
    sampling on), so the resolved values are checked again before the bag is
    installed. Where the BEFORE hook declared an MLA target's tree the chain
    of its depth, the line saying so is logged here, once SGLang's
    resolution has accepted the chain.

    Raises:
        RefusedError: (a ValueError) the bag's :meth:`~DetSpecConfig.refusals`, one line each with its code.
    """
    bag = config_from_server_args(server_args)
    _raise(bag)
    raw = bag_from(server_args, getattr(server_args, "enable_deterministic_inference", False), "raw_args")
    if raw.mla_tree_as_chain:
        logging.getLogger("sglang_detspec").info("sglang-detspec: %s", mla_chain_note(raw))
    if bag.wants_sampled_drafts():
        blockers = sampled_draft_blockers(server_args)
        if blockers:
            logging.getLogger("sglang_detspec").info("sglang-detspec: %s", sampled_drafts_unavailable_note(blockers))
        else:
            bag = turn_on_sampled_drafts(server_args)
    install_config(bag)
    announce(bag)
    return None


def declare_mla_chain(server_args, bag: DetSpecConfig) -> None:
    """Declare an MLA target's tree (``bag.mla_tree_as_chain``) the chain of its depth on ``server_args``.

    Declares ``speculative_eagle_topk=1`` and ``speculative_num_draft_tokens
    = num_steps + 1`` (SGLang's own declaration mechanism, as its
    resolution does for algorithms that serve chains only), so SGLang then
    builds the chain server: no tree KV reserve, no tree CUDA graphs, the
    chain verify that was measured with the decode's bits. Coupled verify
    keeps the tokens those of the tree (:attr:`DetSpecConfig.mla_tree_as_chain`).
    Checks SGLang ran before its speculative resolution saw the flags as
    typed (SGLang's own rules for trees there apply).

    Raises:
        ValueError: ``bag`` has no ``num_steps`` (:meth:`DetSpecConfig.as_chain`), or SGLang's
            ``declare_resolution`` refuses the record (already published).
    """
    from sglang.srt.arg_groups.overrides import declare_resolution

    chain = bag.as_chain()
    declare_resolution(server_args, MLA_CHAIN_SOURCE, speculative_eagle_topk=chain.eagle_topk,
                       speculative_num_draft_tokens=chain.num_draft_tokens)


def turn_on_sampled_drafts(server_args) -> DetSpecConfig:
    """Resolve SGLang's rejection-sampling flag on for a coupled chain, keep coupled verify; the new bag.

    The flag routes SGLang's chain drafts through its seeded sampled-draft
    path (``draft_hook`` races them on the TARGET stream) and its verify
    through the chain sampler (``verify_hook`` runs coupled verify there).
    The declaration carries the plugin's source name, so every process that
    resolves the bag from this record (the schedulers get it pickled) keeps
    the verify coupled where ``auto`` would pick rejection for the flag.
    """
    from sglang.srt.arg_groups.overrides import declare_resolution

    declare_resolution(server_args, SAMPLED_DRAFTS_SOURCE, speculative_use_rejection_sampling=True)
    return config_from_server_args(server_args)
