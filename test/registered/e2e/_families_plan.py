"""What ``test_model_families.py`` measures: the model families, their servers, the backends SGLang accepts.

Plain data and small functions, no GPU: the CPU unit tests
(``test/registered/unit/test_model_family_claims.py``) read the same table and
resolve the same flags through SGLang's real argument resolution.

Per family and attention backend four servers run side by side: the target
without speculative decoding (the reference), a chain, a tree and the chain
again under SGLang's retraction test switch, all with deterministic
inference and CUDA graphs on. ``auto`` is SGLang's own choice (no
``--attention-backend``: fa3 on Hopper under deterministic inference).
"""

from __future__ import annotations

import dataclasses
import os

import _e2e
from _forward_plan import FORCE_RETRACT

BACKENDS_ENV = "DETSPEC_E2E_FAMILY_BACKENDS"
FAMILIES_ENV = "DETSPEC_E2E_FAMILIES"
AUTO = "auto"
KNOWN_BACKENDS = (AUTO, "triton", "fa3", "flashinfer")
SHAPES = {"chain": _e2e.CHAIN_SHAPE, "tree": _e2e.TREE_SHAPE}
# The chain server whose scheduler retracts running requests (SGLANG_TEST_RETRACT: every few decode
# steps one request goes back to the queue and is prefilled again later).
RETRACTION = "chain_retract"
# Every server of one family and backend, as its row's ``speculative`` field names it.
SERVER_SHAPES = ("none", *SHAPES, RETRACTION)
# The radix-cache check: each request again, its prompt followed by this many of its first outputs.
CACHED_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One target family of the tiny models (``scripts/tiny_families.py``).

    Attributes:
        folder: the target's folder under the tiny models' folder.
        draft: the draft's folder (the target's own for NEXTN).
        algorithm: ``--speculative-algorithm``.
        quantization: the row's ``quantization`` field (``bf16`` or the checkpoint's method).
    """

    folder: str
    draft: str
    algorithm: str
    quantization: str


FAMILIES = {
    "deepseek_v3": ModelFamily("deepseek_v3", "deepseek_v3", "NEXTN", "bf16"),
    "deepseek_v3_fp8": ModelFamily("deepseek_v3_fp8", "deepseek_v3_fp8", "NEXTN", "fp8"),
    "qwen3_moe": ModelFamily("qwen3_moe", "qwen3_moe_eagle3", "EAGLE3", "bf16"),
}


def backend_args(backend: str) -> tuple[str, ...]:
    """The attention flag of ``backend`` (none for ``auto``).

    Raises:
        ValueError: ``backend`` not in :data:`KNOWN_BACKENDS`.
    """
    if backend not in KNOWN_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(KNOWN_BACKENDS)}, got {backend!r}")
    return () if backend == AUTO else ("--attention-backend", backend)


def spec_args(family: ModelFamily, shape: str, models_dir: str) -> tuple[str, ...]:
    """The speculative flags of ``family`` drafting ``shape`` (one of :data:`SERVER_SHAPES`); empty for ``none``.

    :data:`RETRACTION` drafts the chain (its retraction comes from :func:`server_env`).

    Raises:
        ValueError: ``shape`` not one of :data:`SERVER_SHAPES`.
    """
    if shape not in SERVER_SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SERVER_SHAPES)}, got {shape!r}")
    if shape == "none":
        return ()
    drafted = "chain" if shape == RETRACTION else shape
    return ("--speculative-algorithm", family.algorithm, *SHAPES[drafted],
            "--speculative-draft-model-path", os.path.join(models_dir, family.draft))


def server_env(shape: str) -> tuple[tuple[str, str], ...]:
    """The extra environment of the ``shape`` server: SGLang's retraction test switch for :data:`RETRACTION`."""
    return FORCE_RETRACT if shape == RETRACTION else ()


# SGLang compiles DeepGEMM's FP8 GEMMs for every row count up to twice the chunked-prefill size at start-up
# (its "JIT Pre-Compile session"): 3.3 minutes for the tiny FP8 target's six weight shapes on an H100, with four
# servers sharing the compile cache's locks, so none started within 300 s (docs/e2e/2026-12-07-h100-model-families).
# Off, the same kernels compile at their first use instead.
FP8_ENV = (("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "0"),)


def family_env(family: ModelFamily) -> tuple[tuple[str, str], ...]:
    """The extra environment of every server of ``family``: :data:`FP8_ENV` for an FP8 checkpoint."""
    return FP8_ENV if family.quantization == "fp8" else ()


def server_flags(family: ModelFamily, shape: str, backend: str, models_dir: str) -> tuple[str, ...]:
    """Every flag of one server but the model path, as ``_e2e.server_config`` lays them out (deterministic, CUDA graphs)."""
    common = _e2e.common_args()
    # The default flags name the triton backend; each row sets its own (or none: SGLang's choice).
    common = [a for i, a in enumerate(common)
              if a != "--attention-backend" and (i == 0 or common[i - 1] != "--attention-backend")]
    return (*spec_args(family, shape, models_dir), "--device", "cuda", *common, *backend_args(backend),
            "--enable-deterministic-inference")


def sglang_refusal(model_path: str, flags: tuple[str, ...]) -> str | None:
    """SGLang's own refusal of a server, from its real argument resolution (no GPU needed); None when it accepts.

    ``resolve.sglang_resolution``: e.g. deterministic inference on a
    DeepSeek-family (absorbed-MLA) model accepts only the radix-cache
    backends. Only SGLang's ``ValueError`` counts as a refusal.
    """
    from sglang_detspec.cli.serve import read_launch_args
    from sglang_detspec.sglang_plugin.resolve import sglang_resolution

    return sglang_resolution(read_launch_args(["--model-path", model_path, *flags]))[0]


def selected_backends(environ=None) -> tuple[str, ...]:
    """The backends to run: ``DETSPEC_E2E_FAMILY_BACKENDS`` (comma-separated), else all of :data:`KNOWN_BACKENDS`.

    Raises:
        ValueError: an unknown name, a name given twice, or no name; the
            message names the variable and the allowed values.
    """
    return _selected(environ, BACKENDS_ENV, KNOWN_BACKENDS, "backend", "backends")


def selected_families(environ=None) -> dict[str, ModelFamily]:
    """The families to run: ``DETSPEC_E2E_FAMILIES`` (comma-separated names of :data:`FAMILIES`), else all.

    Fewer families start fewer servers at once (four each), so a short command
    can run one family and the next command another.

    Raises:
        ValueError: as :func:`selected_backends`.
    """
    return {name: FAMILIES[name] for name in _selected(environ, FAMILIES_ENV, tuple(FAMILIES), "family", "families")}


def _selected(environ, variable: str, known: tuple[str, ...], noun: str, plural: str) -> tuple[str, ...]:
    """The names ``variable`` lists in ``environ`` (``os.environ`` if None), or all of ``known`` where it is unset."""
    environ = os.environ if environ is None else environ
    raw = environ.get(variable)
    if raw is None or raw.strip() == "":
        return known
    return _e2e.backend_list(variable, raw, known, noun, plural)
