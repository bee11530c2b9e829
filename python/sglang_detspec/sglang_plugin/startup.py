"""Start-up validation: refuse combinations the plugin cannot make deterministic.

Hooked around SGLang's ``handle_speculative_decoding`` resolution step, which
runs in the launcher before any scheduler process starts, so a bad
combination stops the server with a message that says what to change. The
rules themselves live in the config bag (:meth:`DetSpecConfig.refusals`).
"""

from __future__ import annotations

from ..config import DetSpecConfig, install_config
from .resolve import announce, bag_from, config_from_server_args

TARGET = "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding"


def startup_problems(bag: DetSpecConfig) -> list[str]:
    """What keeps this run from being made deterministic: one message per problem, naming the flag to change.

    Only runs with deterministic inference on (and the plugin not disabled)
    are ours; anything else gives no problem here.
    """
    return bag.refusals()


def _raise(problems: list[str], bag: DetSpecConfig) -> None:
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
        ValueError: see :func:`startup_problems`.
    """
    raw = bag_from(server_args, getattr(server_args, "enable_deterministic_inference", False), "raw_args")
    _raise(startup_problems(raw), raw)


def resolve_and_announce(result, server_args) -> None:
    """AFTER hook for ``handle_speculative_decoding``: resolve, re-check, install, log.

    SGLang may change speculative flags during resolution (NEXTN becomes
    EAGLE, NGRAM gets its tree shape, block verification can turn rejection
    sampling on), so the resolved values are checked again before the bag is
    installed.

    Raises:
        ValueError: see :func:`startup_problems`.
    """
    bag = config_from_server_args(server_args)
    _raise(startup_problems(bag), bag)
    install_config(bag)
    announce(bag)
    return None
