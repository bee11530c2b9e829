"""Start-up validation: refuse combinations the plugin cannot make deterministic.

Hooked around SGLang's ``handle_speculative_decoding`` resolution step, which
runs in the launcher before any scheduler process starts, so a bad
combination stops the server with a message that says what to change.
"""

from __future__ import annotations

from ..config import EAGLE_FAMILY, DetSpecConfig, install_config
from .resolve import announce, bag_from, config_from_server_args

TARGET = "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"


def startup_problems(bag: DetSpecConfig) -> list[str]:
    """What keeps a deterministic rejection-sampling run from being made deterministic.

    Only a run with deterministic inference and rejection sampling both on
    (and the plugin not disabled) is ours; anything else gives no problem
    here. Returns one message per problem, each naming the flag to change.
    """
    if bag.disabled or not (bag.deterministic and bag.rejection_sampling):
        return []
    problems = []
    if bag.algorithm is not None and bag.algorithm not in EAGLE_FAMILY:
        problems.append(
            f"--speculative-algorithm {bag.algorithm} is not supported; use EAGLE, EAGLE3 or NEXTN "
            "(or set SGLANG_DETSPEC_DISABLE=1 to keep SGLang's own sampling)"
        )
    chain = {"--speculative-num-steps": bag.num_steps, "--speculative-eagle-topk": bag.eagle_topk,
             "--speculative-num-draft-tokens": bag.num_draft_tokens}
    unset = [flag for flag, value in chain.items() if value is None]
    if bag.algorithm in EAGLE_FAMILY and unset:
        # Left unset, SGLang picks the three per model, a tree (topk > 1) for some (Llama: steps
        # 5, topk 4, 8 draft tokens), and then refuses rejection sampling in its own words.
        problems.append(
            f"{', '.join(unset)} not set: give all three for a chain draft, e.g. --speculative-num-steps 3 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4 (draft tokens = steps + 1)"
        )
    if bag.eagle_topk is not None and int(bag.eagle_topk) > 1:
        problems.append(
            f"--speculative-eagle-topk {bag.eagle_topk} drafts a tree; sglang-detspec verifies chains only: "
            "set --speculative-eagle-topk 1"
        )
    if bag.rl_on_policy:
        problems.append(
            "--rl-on-policy-target is not supported (its bf16 log-softmax sampling path makes a seeded "
            "request's first token depend on its batch): drop the flag"
        )
    if bag.block_verification:
        problems.append(
            "--speculative-use-block-verification is not supported (sglang-detspec implements the classic "
            "chain verify): drop the flag"
        )
    return problems


def _raise(problems: list[str]) -> None:
    if problems:
        raise ValueError(
            "sglang-detspec cannot make this run deterministic with "
            "--enable-deterministic-inference and --speculative-use-rejection-sampling:\n  - "
            + "\n  - ".join(problems)
        )


def check_raw_flags(server_args) -> None:
    """BEFORE hook for ``handle_speculative_decoding``: check the flags as typed.

    Runs before SGLang's own speculative checks, so our message (which says
    what to change) comes first.

    Raises:
        ValueError: see :func:`startup_problems`.
    """
    raw = bag_from(server_args, getattr(server_args, "enable_deterministic_inference", False), "raw_args")
    _raise(startup_problems(raw))


def resolve_and_announce(result, server_args) -> None:
    """AFTER hook for ``handle_speculative_decoding``: resolve, re-check, install, log.

    SGLang may change speculative flags during resolution (NEXTN becomes
    EAGLE, block verification can turn rejection sampling on), so the
    resolved values are checked again before the bag is installed.

    Raises:
        ValueError: see :func:`startup_problems`.
    """
    bag = config_from_server_args(server_args)
    _raise(startup_problems(bag))
    install_config(bag)
    announce(bag)
    return None
