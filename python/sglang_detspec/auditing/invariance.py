"""Drafter invariance: one seeded request, many drafters, how many outputs?

Coupled verification (docs/design.md, "Coupled verification"; Daliri, Musco and Suresh 2024,
"Coupling without Communication and Drafter-Invariant Speculative Decoding")
promises that a seeded request's tokens are plain autoregressive sampling on
the TARGET stream, whatever the drafter. :func:`run_invariance` decodes the
probe requests of the batch audit on the in-process reference engine with
speculative decoding off, chains of K = 1..5 draft tokens, a top-k tree, and
two draft models (the default close one and an unrelated random one), and
counts each probe's distinct outputs over all of them: 1 in coupled mode. In
rejection mode (speculative sampling, docs/design.md §4) the emitted tokens
depend on the draft, so the count is expected above 1; trees are not
verified there.

For every configuration it also reports the mean accept length (committed
tokens per verify round) and the measured per-token acceptance rate next to
two figures computed from the exact target and draft distributions at the
tested draft positions: the mean of 1 - TV(p, q), the acceptance rate of
rejection sampling, and of (1 - TV) / (1 + TV), the coupled race's lower
bound.
"""

from __future__ import annotations

import dataclasses
import time

from .batch import PROBE_PROMPT_LEN, build_plan
from ..config import KERNELS, VERIFY_MODES
from ..ops.streams import U64
from ..reference.engine import DraftShape, ReferenceEngine
from ..reference.stats import DraftStats
from ..reference.models import ModelPair, ProbsMemo, build_model_pair, with_random_draft
from ..request import Request
from ..reference.samplers import KeyedSampler, RoundSampler
from ..ops.seed_encoding import check_seed
from ..ops.choices import one_of

CHAIN_LENGTHS = (1, 2, 3, 4, 5)
TREE = DraftShape.tree(3, 2)
RANDOM_DRAFT_SHAPE = DraftShape.chain(3)
DEFAULT_NUM_PROBES = 2
DEFAULT_MAX_NEW_TOKENS = 16
MAX_NUM_PROBES = 64


@dataclasses.dataclass(frozen=True)
class InvarianceRow:
    """One configuration's result over all probes.

    Attributes:
        name: e.g. ``off``, ``chain K=3``, ``tree 3x2``, ``chain K=3, random draft``.
        draft: the draft shape's kind: ``none``, ``chain`` or ``tree``.
        depth: K for a chain, the tree's depth, 0 for none.
        branching: children per tree node, 1 otherwise.
        draft_model: ``close`` or ``random``; None without a draft.
        available: False when the mode cannot run the configuration (trees in
            rejection mode); every figure below is then None.
        note: why it is unavailable, else empty.
        unique_outputs: distinct outputs among {the spec-off output, this
            configuration's output}, the most over the probes: 1 when every
            probe matched speculative decoding off.
        matching_probes: probes whose output equals the spec-off output.
        mean_accept_length: committed tokens per verify round over all
            probes (SGLang's ``spec_accept_length``; 1.0 with no draft).
        acceptance_rate: accepted / tested draft positions (see
            :class:`~sglang_detspec.reference.stats.DraftStats`); None
            without a draft.
        expected_rate: the acceptance rate the verifier should give at the
            tested positions, from the exact p and q there: the mean of
            1 - TV for rejection chains, of
            :func:`~sglang_detspec.reference.stats.coupled_match_probability`
            for coupled chains; None for trees (more children accept more
            than the first child's race alone) and without a draft.
        coupled_bound: mean of (1 - TV) / (1 + TV) over the tested positions.
        one_minus_tv: mean of 1 - TV over them (rejection sampling's rate).
        tested_positions: how many positions those means run over.
    """

    name: str
    draft: str
    depth: int
    branching: int
    draft_model: str | None
    available: bool
    note: str = ""
    unique_outputs: int | None = None
    matching_probes: int | None = None
    mean_accept_length: float | None = None
    acceptance_rate: float | None = None
    expected_rate: float | None = None
    coupled_bound: float | None = None
    one_minus_tv: float | None = None
    tested_positions: int = 0

    def to_json(self) -> dict:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class InvarianceReport:
    """What :func:`run_invariance` found.

    Attributes:
        mode: ``coupled`` or ``rejection``.
        probes: the probe requests, in order.
        reference_outputs: each probe's output with speculative decoding off.
        rows: one per configuration, speculative decoding off first.
        unique_outputs_per_probe: each probe's distinct outputs over all
            available configurations.
        unique_outputs: the most of those (1: every probe gave one output).
        passed: ``unique_outputs == 1``: the outputs did not depend on the
            drafter. Expected True in coupled mode and False in rejection mode.
        wall_time_s: seconds the whole run took.
    """

    mode: str
    probes: tuple[Request, ...]
    reference_outputs: tuple[tuple[int, ...], ...]
    rows: tuple[InvarianceRow, ...]
    unique_outputs_per_probe: tuple[int, ...]
    unique_outputs: int
    passed: bool
    wall_time_s: float

    def to_json(self) -> dict:
        """A JSON-ready dict: the summary, the probes, their spec-off outputs and every row."""
        return {
            "mode": self.mode,
            "passed": self.passed,
            "unique_outputs": self.unique_outputs,
            "unique_outputs_per_probe": list(self.unique_outputs_per_probe),
            "wall_time_s": self.wall_time_s,
            "probes": [
                {
                    "prompt_ids": list(p.prompt_ids),
                    "max_new_tokens": p.max_new_tokens,
                    "temperature": p.temperature,
                    "sampling_seed": p.sampling_seed,
                }
                for p in self.probes
            ],
            "reference_outputs": [list(o) for o in self.reference_outputs],
            "rows": [row.to_json() for row in self.rows],
        }


def _configurations() -> list[tuple[str, DraftShape]]:
    """(draft model, shape) pairs in report order; speculative decoding off comes first."""
    configs = [("close", DraftShape.none())]
    configs += [("close", DraftShape.chain(k)) for k in CHAIN_LENGTHS]
    configs.append(("close", TREE))
    configs.append(("random", RANDOM_DRAFT_SHAPE))
    return configs


def _mean(total: float, count: int) -> float | None:
    return total / count if count else None


def run_invariance(
    models: ModelPair | None = None,
    *,
    mode: str,
    seed: int = 0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    num_probes: int = DEFAULT_NUM_PROBES,
    kernel: str = "auto",
    sampler: RoundSampler | None = None,
    memo: ProbsMemo | None = None,
) -> InvarianceReport:
    """Decode the probes with every drafter and count their distinct outputs.

    Probe i is the batch audit's probe for seed ``(seed + i) mod 2**64``
    (:func:`~sglang_detspec.auditing.batch.build_plan`: an 8-token prompt,
    temperature 1, ``sampling_seed`` that seed), so probe 0 is the audit's
    own. Configurations, each one ``generate`` call over all probes, on
    :class:`~sglang_detspec.reference.engine.ReferenceEngine` with
    ``verify=mode``: speculative decoding off; chains of K = 1..5 with the
    default (close) draft; a tree of depth 3 and branching 2 (coupled mode
    only: the rejection row says it is not available); a chain of K = 3 with
    the random draft of
    :func:`~sglang_detspec.reference.models.with_random_draft`. Engines share
    one :class:`~sglang_detspec.reference.models.ProbsMemo`. Deterministic in
    its arguments; at the defaults about 460 distinct forwards of the tiny
    models per mode (the memo serves the rest).

    Args:
        models: the target and close draft; None builds the default pair.
        mode: ``"coupled"`` or ``"rejection"``.
        seed: in [0, 2**64), the first probe's seed.
        max_new_tokens: >= 1, tokens per probe.
        num_probes: in [1, 64].
        kernel: the ops' kernel choice (``"auto"``, ``"torch"``,
            ``"triton"``) for the default sampler.
        sampler: the engines' sampler; None means ``KeyedSampler(kernel)``.
            Tests pass altered samplers to show that a broken verifier is caught.
        memo: the engines' distributions cache; None gives the run its own.
            Runs over the same models may share one (the coupled and the
            rejection run share the spec-off forwards, for one).

    Returns:
        An :class:`InvarianceReport`.

    Raises:
        ValueError: an unknown ``mode`` or ``kernel``; ``seed``,
            ``max_new_tokens`` or ``num_probes`` outside its range; ``models``
            not a ModelPair; ``memo`` not a ProbsMemo; probes that do not fit the models' positions
            (8 + ``max_new_tokens`` + 5).
    """
    start = time.perf_counter()
    if mode not in VERIFY_MODES:
        raise ValueError(f"mode must be one of {one_of(VERIFY_MODES)}, got {mode!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {one_of(KERNELS)}, got {kernel!r}")
    check_seed(seed, "seed")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(num_probes, bool) or not isinstance(num_probes, int) or not 1 <= num_probes <= MAX_NUM_PROBES:
        raise ValueError(f"num_probes must be an int in [1, {MAX_NUM_PROBES}], got {num_probes!r}")
    if models is not None and not isinstance(models, ModelPair):
        raise ValueError(f"models must be a ModelPair or None, got {type(models).__name__}")
    if memo is not None and not isinstance(memo, ProbsMemo):
        raise ValueError(f"memo must be a ProbsMemo or None, got {type(memo).__name__}")
    models = build_model_pair() if models is None else models
    need = PROBE_PROMPT_LEN + max_new_tokens + max(CHAIN_LENGTHS)
    if need > models.max_positions:
        raise ValueError(
            f"max_new_tokens must be at most {models.max_positions - PROBE_PROMPT_LEN - max(CHAIN_LENGTHS)}: "
            f"prompt ({PROBE_PROMPT_LEN}) + max_new_tokens ({max_new_tokens}) + the longest chain "
            f"({max(CHAIN_LENGTHS)}) = {need} exceeds the models' {models.max_positions} positions"
        )
    vocab = models.vocab_size
    probes = tuple(
        build_plan(1, seed=(seed + i) % U64, max_new_tokens=max_new_tokens, vocab_size=vocab, max_batch=2).probe
        for i in range(num_probes)
    )
    sampler = KeyedSampler(kernel) if sampler is None else sampler
    memo = ProbsMemo() if memo is None else memo
    pairs = {"close": models, "random": with_random_draft(models)}

    outputs: list[tuple[tuple[int, ...], ...]] = []  # per available configuration, per probe
    rows = []
    reference = None
    for draft_model, shape in _configurations():
        base = dict(
            draft=shape.kind,
            depth=shape.depth,
            branching=shape.branching,
            draft_model=None if shape.kind == "none" else draft_model,
        )
        name = shape.label if draft_model == "close" else f"{shape.label}, {draft_model} draft"
        if shape.kind == "tree" and mode != "coupled":
            note = "not available: rejection verification covers chains only"
            rows.append(InvarianceRow(name=name, available=False, note=note, **base))
            continue
        engine = ReferenceEngine(pairs[draft_model], shape, sampler, verify=mode, memo=memo)
        stats: list[DraftStats] = []
        results = engine.generate(probes, stats=stats)
        outs = tuple(r.output_ids for r in results)
        if reference is None:
            reference = outs  # the first configuration is speculative decoding off
        outputs.append(outs)
        tested = sum(s.tested for s in stats)
        rounds = sum(len(r.accept_lengths) for r in results)
        expected = None
        if shape.kind == "chain":
            field = "coupled_match_sum" if mode == "coupled" else "overlap_sum"
            expected = _mean(sum(getattr(s, field) for s in stats), tested)
        rows.append(
            InvarianceRow(
                name=name,
                available=True,
                unique_outputs=max(len({ref, out}) for ref, out in zip(reference, outs)),
                matching_probes=sum(ref == out for ref, out in zip(reference, outs)),
                mean_accept_length=sum(len(o) for o in outs) / rounds,
                acceptance_rate=_mean(sum(s.accepted for s in stats), tested),
                expected_rate=expected,
                coupled_bound=_mean(sum(s.coupled_bound_sum for s in stats), tested),
                one_minus_tv=_mean(sum(s.overlap_sum for s in stats), tested),
                tested_positions=tested,
                **base,
            )
        )
    per_probe = tuple(len({config[i] for config in outputs}) for i in range(num_probes))
    unique = max(per_probe)
    return InvarianceReport(
        mode=mode,
        probes=probes,
        reference_outputs=reference,
        rows=tuple(rows),
        unique_outputs_per_probe=per_probe,
        unique_outputs=unique,
        passed=unique == 1,
        wall_time_s=time.perf_counter() - start,
    )
