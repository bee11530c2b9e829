"""The resolved runtime config bag: resolve once, read everywhere.

Every wired site reads :func:`current_config`; none reads SGLang's server
arguments or the environment on its own. Until the plugin resolves the bag
from SGLang's server arguments, the bag holds the ``SGLANG_DETSPEC_*``
environment settings and says deterministic speculative decoding is off.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping

KERNEL_ENV = "SGLANG_DETSPEC_KERNEL"
DISABLE_ENV = "SGLANG_DETSPEC_DISABLE"
KERNELS = ("auto", "torch", "triton")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class DetSpecConfig:
    """Frozen settings every wired site reads.

    Attributes:
        kernel: ``auto`` (Triton on CUDA, torch elsewhere), ``torch`` or ``triton``.
        disabled: ``SGLANG_DETSPEC_DISABLE``: keep SGLang's own code even when
            deterministic inference and rejection sampling are on.
        deterministic: SGLang's ``enable_deterministic_inference``.
        algorithm: speculative algorithm name (``EAGLE``, ``EAGLE3``, ``NEXTN``,
            ...) or None when speculative decoding is off.
        num_steps: ``speculative_num_steps`` (draft steps / MTP layers).
        eagle_topk: ``speculative_eagle_topk``.
        num_draft_tokens: ``speculative_num_draft_tokens``.
        rejection_sampling: SGLang's rejection-sampling verify flag.
        multi_layer_eagle: SGLang's multi-layer EAGLE (MTP) flag.
        block_verification: SGLang's block-verification flag (not supported:
            the plugin implements the classic chain verify).
        rl_on_policy: SGLang's ``rl_on_policy_target`` is set (not supported: its
            bf16 log-softmax sampling path bypasses the target-sampler hook).
        source: ``env`` before resolution; ``server_args`` or ``runtime_context``
            after the plugin resolved it from SGLang.
    """

    kernel: str = "auto"
    disabled: bool = False
    deterministic: bool = False
    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    rejection_sampling: bool = False
    multi_layer_eagle: bool = False
    block_verification: bool = False
    rl_on_policy: bool = False
    source: str = "env"

    @property
    def active(self) -> bool:
        """True when our seeded streams replace SGLang's sampling."""
        return (
            not self.disabled
            and self.deterministic
            and self.rejection_sampling
            and not self.block_verification
            and not self.rl_on_policy
            and self.eagle_topk in (None, 1)
            and self.algorithm in EAGLE_FAMILY
        )

    def describe(self) -> str:
        """One line with every field, for the start-up log."""
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"DetSpecConfig(active={self.active}, {fields})"


EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN")


def env_settings(environ: Mapping[str, str] | None = None) -> dict:
    """The plugin's own ``SGLANG_DETSPEC_*`` settings, checked.

    Raises:
        ValueError: ``SGLANG_DETSPEC_KERNEL`` not in auto|torch|triton, or
            ``SGLANG_DETSPEC_DISABLE`` not a boolean word.
    """
    env = os.environ if environ is None else environ
    kernel = env.get(KERNEL_ENV, "auto").strip().lower() or "auto"
    if kernel not in KERNELS:
        raise ValueError(f"{KERNEL_ENV} must be one of {KERNELS}, got {env.get(KERNEL_ENV)!r}")
    raw = env.get(DISABLE_ENV, "").strip().lower()
    if raw not in _TRUE + _FALSE:
        raise ValueError(f"{DISABLE_ENV} must be one of {_TRUE + _FALSE}, got {env.get(DISABLE_ENV)!r}")
    return {"kernel": kernel, "disabled": raw in _TRUE}


_lock = threading.Lock()
_current: DetSpecConfig | None = None


def current_config() -> DetSpecConfig:
    """The bag in force: the resolved one, else the environment settings alone."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = DetSpecConfig(**env_settings())
    return _current


def install_config(config: DetSpecConfig) -> DetSpecConfig:
    """Make ``config`` the bag in force (the plugin calls this once per process).

    Raises:
        ValueError: ``config`` is not a :class:`DetSpecConfig`.
    """
    global _current
    if not isinstance(config, DetSpecConfig):
        raise ValueError(f"config must be a DetSpecConfig, got {type(config).__name__}")
    with _lock:
        _current = config
    return config


def reset_config() -> None:
    """Forget the bag in force, so the next read resolves the environment again."""
    global _current
    with _lock:
        _current = None
