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
    install_config(bag)
    announce(bag)
    return None
