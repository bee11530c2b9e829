"""SGLang plugin: wires the seeded streams into SGLang 0.5.23's sampling and speculative runtime.

Entry point ``detspec`` in SGLang's general plugin group ``sglang.srt.plugins``
(``register`` below). SGLang calls it in every process that loads plugins —
the launcher, each scheduler process (which hosts the TP and speculative
workers), the detokenizer — and then applies the registered hooks. Hooks are
registered unconditionally (server arguments are not resolved yet when
plugins load) and decide per call from the config bag: under deterministic
inference our streams run; otherwise SGLang's original code runs untouched.

Hooks (each module's docstring names the SGLang symbols it hooks and why;
docs/plugin.md lists them with SGLang's file and line):

- ``startup``: ``handle_speculative_decoding`` (BEFORE and AFTER): refuses
  what cannot be made deterministic, installs and logs the bag.
- ``target_sampler_hook``: the sampler's simple and top-k/top-p/min-p paths
  and the verify's renorm ops: every sampled token on the TARGET stream.
- ``verify_hook``: ``eagle_sample`` and its two samplers: coupled verify
  (chain and tree) or seeded rejection sampling (chain).
- ``draft_hook``: ``fast_sample`` and the multi-layer draft-extend sites:
  draft proposals on the DRAFT stream, or on the TARGET stream at the exact
  drafted position for coupled drafts.
- ``request_hook``: ``SamplingParams.verify`` and the ``/generate`` schema
  gate: ``sampling_seed`` must be an integer in [0, 2**64).
- ``seed_hook``: request seeds.
"""

from __future__ import annotations

import logging
import threading

from ..config import set_install_listener, set_late_resolver
from . import draft_hook, request_hook, resolve, seed_hook, startup, target_sampler_hook, verify_hook

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
        (draft_hook.ML_PREFILL, draft_hook.ml_prefill_positions, "AROUND"),
        (draft_hook.ML_DECODE, draft_hook.ml_decode_positions, "AROUND"),
        (draft_hook.ML_GRAPH_SAMPLE, draft_hook.ml_graph_sample_positions, "AROUND"),
        (verify_hook.EAGLE_SAMPLE, verify_hook.seeded_eagle_sample, "AROUND"),
        (verify_hook.CHAIN_SAMPLER, verify_hook.seeded_chain_sampling, "AROUND"),
        (verify_hook.TREE_SAMPLER, verify_hook.coupled_tree_sampling, "AROUND"),
        (target_sampler_hook.SIMPLE_SAMPLER, target_sampler_hook.seeded_sampling_from_probs, "AROUND"),
        (target_sampler_hook.SAMPLER, target_sampler_hook.seeded_top_k_top_p_sampling, "AROUND"),
        (target_sampler_hook.TOP_K_RENORM, target_sampler_hook.top_k_renorm_keep_neutral, "AROUND"),
        (target_sampler_hook.TOP_P_RENORM, target_sampler_hook.top_p_renorm_keep_neutral, "AROUND"),
        (request_hook.TARGET, request_hook.verify_unsigned_seed, "AROUND"),
        (request_hook.CONTRACT_TARGET, request_hook.name_bad_seed, "AROUND"),
        *seed_hook.HOOKS,
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
        # Scheduler processes get no bag from the launcher: the first hook that
        # reads one resolves it from SGLang's runtime context and logs it.
        set_late_resolver(resolve.late_bag)
        set_install_listener(resolve.announce)
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
