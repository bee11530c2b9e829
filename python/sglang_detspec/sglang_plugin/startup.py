"""Start-up validation: refuse combinations the plugin cannot make deterministic.

Hooked around SGLang's ``handle_speculative_decoding`` resolution step, which
runs in the launcher before any scheduler process starts, so a bad
combination stops the server with a message that says what to change.
"""

from __future__ import annotations

from ..config import EAGLE_FAMILY, DetSpecConfig, install_config
from .resolve import announce, config_from_server_args

TARGET = "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"


def startup_problems(
    *, deterministic: bool, rejection_sampling: bool, algorithm, eagle_topk, block_verification: bool,
    disabled: bool = False,
) -> list[str]:
    """What keeps a deterministic rejection-sampling run from being made deterministic.

    Only a run with deterministic inference and rejection sampling both on is
    ours; everything else is SGLang's business and gives no problem here.
    Returns one message per problem, each naming the flag to change.
    """
    if disabled or not (deterministic and rejection_sampling):
        return []
    problems = []
    algo = None if algorithm is None else str(algorithm).upper()
    if algo is not None and algo not in EAGLE_FAMILY:
        problems.append(
            f"--speculative-algorithm {algorithm} is not supported; use EAGLE, EAGLE3 or NEXTN "
            "(or set SGLANG_DETSPEC_DISABLE=1 to keep SGLang's own sampling)"
        )
    if eagle_topk is not None and int(eagle_topk) > 1:
        problems.append(
            f"--speculative-eagle-topk {eagle_topk} drafts a tree; sglang-detspec verifies chains only: "
            "set --speculative-eagle-topk 1"
        )
    if block_verification:
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
    from ..config import env_settings

    _raise(startup_problems(
        deterministic=getattr(server_args, "enable_deterministic_inference", False),
        rejection_sampling=getattr(server_args, "speculative_use_rejection_sampling", False),
        algorithm=getattr(server_args, "speculative_algorithm", None),
        eagle_topk=getattr(server_args, "speculative_eagle_topk", None),
        block_verification=getattr(server_args, "speculative_use_block_verification", False),
        disabled=env_settings()["disabled"],
    ))


def resolve_and_announce(result, server_args) -> None:
    """AFTER hook for ``handle_speculative_decoding``: resolve, re-check, install, log.

    SGLang may change speculative flags during resolution (NEXTN becomes
    EAGLE, block verification can turn rejection sampling on), so the
    resolved values are checked again before the bag is installed.

    Raises:
        ValueError: see :func:`startup_problems`.
    """
    bag = config_from_server_args(server_args)
    _raise(problems_of(bag))
    install_config(bag)
    announce(bag)
    return None


def problems_of(bag: DetSpecConfig) -> list[str]:
    """:func:`startup_problems` for a resolved bag."""
    return startup_problems(
        deterministic=bag.deterministic,
        rejection_sampling=bag.rejection_sampling,
        algorithm=bag.algorithm,
        eagle_topk=bag.eagle_topk,
        block_verification=bag.block_verification,
        disabled=bag.disabled,
    )
