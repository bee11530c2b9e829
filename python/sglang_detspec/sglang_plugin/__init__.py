"""SGLang plugin: wires the seeded streams into SGLang 0.5.23's speculative runtime.

Entry point ``detspec`` in SGLang's general plugin group ``sglang.srt.plugins``
(``register`` below). SGLang calls it in every process that loads plugins —
the launcher, each scheduler process (which hosts the TP and speculative
workers), the detokenizer — and then applies the registered hooks. Hooks are
registered unconditionally (server arguments are not resolved yet when
plugins load) and decide per call from the config bag: with deterministic
inference and rejection sampling both on, our streams run; otherwise SGLang's
original code runs untouched.

Hooks (each module's docstring names the SGLang symbol it replaces and why):

- ``startup``: ``speculative_hook.handle_speculative_decoding`` (BEFORE and
  AFTER): refuses what cannot be made deterministic, installs and logs the bag.
- ``draft_hook``: ``spec_utils.fast_sample`` (AROUND): draft proposals, eager
  and inside the EAGLE draft and multi-layer draft-extend CUDA graphs.
- ``verify_hook``: ``eagle_utils.eagle_sample`` (AROUND) and
  ``verify_sampling.chain_speculative_sampling_triton`` (AROUND): the target
  verify with rejection sampling.
- ``target_sampler_hook``: ``sampler.top_k_top_p_min_p_sampling_from_probs_torch``
  and ``renorm.top_k_renorm_prob`` / ``top_p_renorm_prob`` (AROUND): a seeded
  row's target draw no longer depends on whether its batch holds greedy or
  top-k/top-p requests.
- ``request_hook``: ``SamplingParams.verify`` and the ``/generate`` schema
  gate ``api_contract.generate_contract_error`` (AROUND): ``sampling_seed``
  must be an integer in [0, 2**64), refusals name it; seeds >= 2**63 travel
  as their int64 bits.
"""

from __future__ import annotations

import logging
import threading

from . import draft_hook, request_hook, startup, target_sampler_hook, verify_hook

ENTRY_POINT_NAME = "detspec"
ENTRY_POINT_GROUP = "sglang.srt.plugins"

_registered = False
_lock = threading.Lock()


def hook_table():
    """``[(target, hook, HookType name)]``: every SGLang symbol the plugin touches."""
    return [
        (startup.TARGET, startup.check_raw_flags, "BEFORE"),
        (startup.TARGET, startup.resolve_and_announce, "AFTER"),
        (draft_hook.TARGET, draft_hook.seeded_fast_sample, "AROUND"),
        (verify_hook.EAGLE_SAMPLE, verify_hook.seeded_eagle_sample, "AROUND"),
        (verify_hook.CHAIN_SAMPLER, verify_hook.seeded_chain_sampling, "AROUND"),
        (target_sampler_hook.SAMPLER, target_sampler_hook.seeded_top_k_top_p_sampling, "AROUND"),
        (target_sampler_hook.TOP_K_RENORM, target_sampler_hook.top_k_renorm_keep_neutral, "AROUND"),
        (target_sampler_hook.TOP_P_RENORM, target_sampler_hook.top_p_renorm_keep_neutral, "AROUND"),
        (request_hook.TARGET, request_hook.verify_unsigned_seed, "AROUND"),
        (request_hook.CONTRACT_TARGET, request_hook.name_bad_seed, "AROUND"),
    ]


def register() -> None:
    """SGLang plugin entry point: register the hooks with SGLang's HookRegistry.

    Idempotent: a second call in the same process registers nothing more.
    SGLang applies the hooks itself after every plugin's entry point ran.
    """
    global _registered
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    with _lock:
        if _registered:
            return
        for target, hook, kind in hook_table():
            if callable(_resolve(target)):
                HookRegistry.register(target, hook, HookType[kind])
            else:
                logging.getLogger("sglang_detspec").info(
                    "sglang-detspec: %s is not available on this platform; not hooked", target
                )
        _registered = True


def _resolve(target: str):
    """The object a dotted target names, or None.

    Some SGLang names are None on platforms without the kernel (the renorm
    ops on a CPU-only build). Such a target must not be hooked: the registry
    rebinds every module attribute that *is* the original object, and for
    None that would be every unset attribute of every loaded module.
    """
    import pkgutil

    obj_path, attr = target.rsplit(".", 1)
    try:
        return getattr(pkgutil.resolve_name(obj_path), attr, None)
    except (ImportError, AttributeError, ValueError):
        return None
