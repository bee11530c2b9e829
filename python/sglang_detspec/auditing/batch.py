"""Changing-batch audit: run one probe request in many different batches.

The audit builds a schedule of trials in which the same probe request is
decoded alongside other requests in batches of changing size, order and
split, asks a backend to run each trial, and counts how many distinct outputs
the probe produced. A backend whose randomness is keyed by (seed, position)
gives exactly one; one that draws from a shared stateful RNG gives many.

Backends speak :class:`Backend`: ``generate(requests) -> results`` over
:class:`~sglang_detspec.request.Request` and
:class:`~sglang_detspec.request.RequestResult`. The in-process
:class:`~sglang_detspec.reference.ReferenceEngine` is one;
:class:`~sglang_detspec.auditing.http_backend.HttpBackend` (a running SGLang server) is
another. A result may carry two more attributes, which the summary reads when
present:

* ``verify_rounds`` (int >= 1, or None): the request's verify rounds, for a
  backend that reports a total instead of per-round ``accept_lengths``; None
  means it reported none, and the run's mean accept length is then unknown.
* ``output_logprobs`` (tuple of float or None per output token, or None): the
  probe's are compared bit for bit across trials.
"""

from __future__ import annotations

import dataclasses
import math
import random
import struct
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ..request import Request, RequestResult
from ..ops.seed_encoding import check_seed

PROBE_PROMPT_LEN = 8
FILLER_TEMPERATURES = (0.0, 0.7, 1.0, 1.3)
MAX_FILLER_PROMPT_LEN = 24
MAX_PROMPT_LEN = max(PROBE_PROMPT_LEN, MAX_FILLER_PROMPT_LEN)
DEFAULT_TRIALS = 25  # the solo trial plus 8 complete (batch, permuted, split) groups
DEFAULT_MAX_NEW_TOKENS = 16
DEFAULT_MAX_BATCH = 32
# One trial cannot show that an output does not depend on the batch.
MIN_TRIALS_TO_JUDGE = 2


class Backend(Protocol):
    """Something that decodes a batch of requests together."""

    @property
    def name(self) -> str:
        """Short label for reports."""
        ...

    def generate(self, requests: Sequence[Request]) -> list[RequestResult]:
        """Decode ``requests`` as one batch; one result per request, in order."""
        ...


@dataclasses.dataclass(frozen=True)
class Trial:
    """One trial: sub-batches run one after another, the probe in one of them.

    Attributes:
        index: position in the schedule.
        kind: ``solo`` (the probe alone), ``batch`` (probe plus fillers),
            ``permuted`` (the previous batch's requests in another order, probe
            at another row) or ``split`` (the previous batch's requests run as
            two sub-batches).
        batches: the sub-batches, each a tuple of requests in row order.
        probe_batch, probe_row: where the probe sits.
    """

    index: int
    kind: str
    batches: tuple[tuple[Request, ...], ...]
    probe_batch: int
    probe_row: int

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(len(b) for b in self.batches)

    @property
    def num_requests(self) -> int:
        return sum(self.batch_sizes)


@dataclasses.dataclass(frozen=True)
class AuditPlan:
    """The probe request and the trials it runs in."""

    probe: Request
    trials: tuple[Trial, ...]


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def group_sizes(num_groups: int, max_batch: int) -> list[int]:
    """Batch sizes of the ``batch``/``permuted``/``split`` groups: spread evenly over [2, max_batch]."""
    if num_groups == 1:
        return [max_batch]
    return [round(2 + g * (max_batch - 2) / (num_groups - 1)) for g in range(num_groups)]


def build_plan(
    num_trials: int = DEFAULT_TRIALS,
    *,
    seed: int = 0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    vocab_size: int,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> AuditPlan:
    """The trial schedule: deterministic in its arguments.

    Trial 0 runs the probe alone. The rest come in groups of three over one
    set of requests each: ``batch`` (probe at the first, last, middle or a
    random row), ``permuted`` (same requests shuffled so the probe moves) and
    ``split`` (same requests as two sub-batches cut at a random row). Group
    batch sizes spread evenly over [2, max_batch], so every run covers sizes
    1 and ``max_batch``. The probe's prompt has ``PROBE_PROMPT_LEN`` tokens.
    Fillers come from a pool of ``2 * max_batch`` requests with prompts of
    1..``MAX_FILLER_PROMPT_LEN`` tokens, temperatures 0 (greedy) to 1.3,
    random 64-bit seeds and ``max_new_tokens`` from a quarter to all of the
    probe's, so rows leave the batch at different rounds.

    Args:
        num_trials: >= 1.
        seed: in [0, 2**64): the probe's ``sampling_seed`` and the seed of the
            schedule's own ``random.Random``.
        max_new_tokens: >= 1, the probe's length.
        vocab_size: >= 1, prompt ids are drawn from [0, vocab_size).
        max_batch: >= 2, the largest batch.

    Returns:
        An :class:`AuditPlan`.

    Raises:
        ValueError: an argument outside the ranges above.
    """
    _positive_int("num_trials", num_trials)
    _positive_int("max_new_tokens", max_new_tokens)
    _positive_int("vocab_size", vocab_size)
    _positive_int("max_batch", max_batch, 2)
    check_seed(seed, "seed")
    rng = random.Random(seed)
    probe = Request(
        prompt_ids=tuple(rng.randrange(vocab_size) for _ in range(PROBE_PROMPT_LEN)),
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        sampling_seed=seed,
    )
    pool = [
        Request(
            prompt_ids=tuple(rng.randrange(vocab_size) for _ in range(rng.randint(1, MAX_FILLER_PROMPT_LEN))),
            max_new_tokens=rng.randint(max(1, max_new_tokens // 4), max_new_tokens),
            temperature=rng.choice(FILLER_TEMPERATURES),
            sampling_seed=rng.getrandbits(64),
        )
        for _ in range(2 * max_batch)
    ]
    trials = [Trial(0, "solo", ((probe,),), 0, 0)]
    sizes = group_sizes(math.ceil((num_trials - 1) / 3), max_batch) if num_trials > 1 else []
    for g, size in enumerate(sizes):
        members = rng.sample(pool, size - 1)
        row = (0, size - 1, size // 2, rng.randrange(size))[g % 4]
        members.insert(row, probe)
        group = [Trial(0, "batch", (tuple(members),), 0, row)]

        shuffled = list(members)
        rng.shuffle(shuffled)
        moved = shuffled.index(probe)
        if moved == row:
            other = (row + 1) % size
            shuffled[row], shuffled[other] = shuffled[other], shuffled[row]
            moved = other
        group.append(Trial(0, "permuted", (tuple(shuffled),), 0, moved))

        cut = rng.randint(1, size - 1)
        halves = (tuple(members[:cut]), tuple(members[cut:]))
        group.append(Trial(0, "split", halves, int(row >= cut), row if row < cut else row - cut))
        trials.extend(group)
    trials = [dataclasses.replace(t, index=i) for i, t in enumerate(trials[:num_trials])]
    return AuditPlan(probe=probe, trials=tuple(trials))


@dataclasses.dataclass(frozen=True)
class TrialOutcome:
    """The probe's result in one trial."""

    trial: Trial
    probe: RequestResult


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One backend's audit result.

    Attributes:
        backend: the backend's name.
        outcomes: one per trial, in schedule order.
        unique_probe_outputs: distinct probe outputs over the trials.
        mean_accept_length: committed tokens / verify rounds over every row
            of every trial (SGLang's ``spec_accept_length``, >= 1); None when
            some result reported no verify rounds (``verify_rounds`` None).
        num_requests: distinct requests that ran.
        varying_requests: distinct requests with more than one output.
        wall_time_s: seconds spent in the backend's ``generate``.
        probe_logprobs_identical: whether the probe's output logprobs were
            bitwise equal in every trial; None when the backend returned no
            logprobs for it in some trial.
        unique_probe_logprobs: distinct probe logprob sequences (bitwise);
            None when ``probe_logprobs_identical`` is None.
        server_avg_accept_length: the server's own average accept length
            (SGLang's ``/server_info`` ``avg_spec_accept_length``), set by the
            caller; None when there is none.
    """

    backend: str
    outcomes: tuple[TrialOutcome, ...]
    unique_probe_outputs: int
    mean_accept_length: float | None
    num_requests: int
    varying_requests: int
    wall_time_s: float
    probe_logprobs_identical: bool | None = None
    unique_probe_logprobs: int | None = None
    server_avg_accept_length: float | None = None

    def to_json(self) -> dict:
        """A JSON-ready dict with the summary and every trial's probe output.

        Trials whose probe result carries ``verify_rounds`` or
        ``output_logprobs`` also get ``probe_verify_rounds`` and
        ``probe_output_logprobs`` (floats as returned; ``json`` writes them
        so that they read back bit for bit).
        """
        return {
            "backend": self.backend,
            "unique_probe_outputs": self.unique_probe_outputs,
            "mean_accept_length": self.mean_accept_length,
            "num_requests": self.num_requests,
            "varying_requests": self.varying_requests,
            "wall_time_s": self.wall_time_s,
            "probe_logprobs_identical": self.probe_logprobs_identical,
            "unique_probe_logprobs": self.unique_probe_logprobs,
            "server_avg_accept_length": self.server_avg_accept_length,
            "trials": [_trial_json(o) for o in self.outcomes],
        }


def _trial_json(o: TrialOutcome) -> dict:
    out = {
        "index": o.trial.index,
        "kind": o.trial.kind,
        "batch_sizes": list(o.trial.batch_sizes),
        "probe_batch": o.trial.probe_batch,
        "probe_row": o.trial.probe_row,
        "probe_output_ids": list(o.probe.output_ids),
        "probe_accept_lengths": list(o.probe.accept_lengths),
    }
    if hasattr(o.probe, "verify_rounds"):
        out["probe_verify_rounds"] = o.probe.verify_rounds
    logprobs = getattr(o.probe, "output_logprobs", None)
    if logprobs is not None:
        out["probe_output_logprobs"] = list(logprobs)
    return out


def _verify_rounds(result: RequestResult) -> int | None:
    """A result's verify rounds: its ``verify_rounds`` if it has that attribute, else one per accept length."""
    if hasattr(result, "verify_rounds"):
        return result.verify_rounds
    return len(result.accept_lengths)


def _logprob_bits(logprobs) -> tuple:
    """The IEEE-754 double bits of each logprob: equal exactly when bitwise equal (so -0.0 != 0.0)."""
    return tuple(None if x is None else struct.pack("<d", x) for x in logprobs)


def run_plan(
    backend: Backend, plan: AuditPlan, on_trial: Callable[[TrialOutcome], None] | None = None
) -> RunSummary:
    """Run every trial of ``plan`` on ``backend`` and summarise.

    Args:
        backend: decodes each sub-batch with one ``generate`` call.
        plan: from :func:`build_plan`.
        on_trial: called after each trial (progress reporting).

    Returns:
        A :class:`RunSummary`.

    Raises:
        RuntimeError: the backend returned a different number of results than
            requests, or a result with no verify rounds.
    """
    outputs: dict[Request, set[tuple[int, ...]]] = {}
    outcomes = []
    tokens = rounds = 0
    all_rounds_known = True
    elapsed = 0.0
    for trial in plan.trials:
        probe_result = None
        for b, batch in enumerate(trial.batches):
            start = time.perf_counter()
            results = backend.generate(batch)
            elapsed += time.perf_counter() - start
            if len(results) != len(batch):
                raise RuntimeError(
                    f"backend {backend.name!r} returned {len(results)} results for {len(batch)} requests"
                )
            for req, res in zip(batch, results):
                res_rounds = _verify_rounds(res)
                if res_rounds is None:
                    all_rounds_known = False
                elif res_rounds < 1:
                    raise RuntimeError(f"backend {backend.name!r} returned a result with no verify rounds")
                else:
                    tokens += len(res.output_ids)
                    rounds += res_rounds
                outputs.setdefault(req, set()).add(res.output_ids)
            if b == trial.probe_batch:
                probe_result = results[trial.probe_row]
        outcome = TrialOutcome(trial, probe_result)
        outcomes.append(outcome)
        if on_trial is not None:
            on_trial(outcome)
    probe_logprobs = [getattr(o.probe, "output_logprobs", None) for o in outcomes]
    unique_logprobs = None
    if all(lp is not None for lp in probe_logprobs):
        unique_logprobs = len({_logprob_bits(lp) for lp in probe_logprobs})
    return RunSummary(
        backend=backend.name,
        outcomes=tuple(outcomes),
        unique_probe_outputs=len({o.probe.output_ids for o in outcomes}),
        mean_accept_length=tokens / rounds if all_rounds_known else None,
        num_requests=len(outputs),
        varying_requests=sum(len(v) > 1 for v in outputs.values()),
        wall_time_s=elapsed,
        probe_logprobs_identical=None if unique_logprobs is None else unique_logprobs == 1,
        unique_probe_logprobs=unique_logprobs,
    )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Outcome of an audit.

    Attributes:
        passed: the seeded run gave exactly one unique probe output and no other request of it varied.
        message: one line saying so, or what went wrong.
        notes: further observations that do not change ``passed``.
    """

    passed: bool
    message: str
    notes: tuple[str, ...] = ()


def judge(seeded: RunSummary, control: RunSummary | None = None, *, bitwise_logprobs: bool = False) -> Verdict:
    """Pass when the seeded run's probe gave exactly one unique output over its trials and none of its other
    requests varied (every request of the plan carries its own seed, so any of them changing output between
    batches is the batch dependence the audit looks for).

    Notes flag a seeded probe whose output logprobs were not bitwise equal
    across trials (the tokens decide the verdict, unless ``bitwise_logprobs``;
    logprobs that move show batch-dependent numerics), and a control run that
    did not vary (its trials then showed no batch dependence to guard against).

    With ``bitwise_logprobs`` (what every deterministic server the E2E
    suites audit gave, whatever its logits claim: that claim compares
    speculative decoding on against off) the probe's output logprobs must
    also be bitwise equal in every trial, and a backend that returned none
    fails.

    Raises:
        ValueError: the seeded run has fewer than ``MIN_TRIALS_TO_JUDGE`` (2)
            trials, so there is nothing to compare its probe output with.
    """
    n = len(seeded.outcomes)
    if n < MIN_TRIALS_TO_JUDGE:
        raise ValueError(
            f"judging batch invariance needs the probe in at least {MIN_TRIALS_TO_JUDGE} trials, "
            f"the seeded run has {n}"
        )
    notes = []
    logprobs_moved = (f"the seeded probe's output logprobs were not bitwise equal across trials "
                      f"({seeded.unique_probe_logprobs} distinct sequences)")
    if seeded.probe_logprobs_identical is False:
        notes.append(logprobs_moved)
    if control is not None and control.unique_probe_outputs == 1:
        notes.append(
            "the control also gave 1 unique probe output, so these trials showed no batch dependence; "
            "use more trials or more tokens"
        )
    if bitwise_logprobs and seeded.unique_probe_outputs == 1 and not seeded.varying_requests and (
            seeded.probe_logprobs_identical is not True):
        moved = ("the backend returned no output logprobs to compare" if seeded.probe_logprobs_identical is None
                 else logprobs_moved)
        return Verdict(False, f"FAIL: the seeded probe gave 1 unique output across {n} trials, but {moved}; "
                              "bitwise logprobs were asked for (--bitwise-logprobs)",
                       tuple(note for note in notes if note != logprobs_moved))  # the verdict says it
    if seeded.unique_probe_outputs == 1 and seeded.varying_requests:
        return Verdict(
            False,
            f"FAIL: {seeded.varying_requests} of {seeded.num_requests} seeded requests changed output between "
            f"batches across {n} trials (the probe gave 1 unique output); with a fixed sampling_seed every request "
            "must give the same tokens in every batch",
            tuple(notes),
        )
    if seeded.unique_probe_outputs == 1:
        return Verdict(True, f"PASS: the seeded probe request gave 1 unique output across {n} trials and no seeded "
                             "request varied", tuple(notes))
    if seeded.varying_requests:
        notes.append(f"{seeded.varying_requests} of {seeded.num_requests} requests of the seeded run changed output "
                     "between batches")
    return Verdict(
        False,
        f"FAIL: the seeded probe request gave {seeded.unique_probe_outputs} different outputs across {n} trials; "
        "with a fixed sampling_seed it must give the same tokens in every batch",
        tuple(notes),
    )


def build_report(plan: AuditPlan, summaries: Sequence[RunSummary], verdict: Verdict, settings: dict) -> dict:
    """JSON-ready audit report: verdict, settings, probe request and each run's summary."""
    probe = plan.probe
    return {
        "passed": verdict.passed,
        "message": verdict.message,
        "notes": list(verdict.notes),
        "settings": dict(settings),
        "probe": {
            "prompt_ids": list(probe.prompt_ids),
            "max_new_tokens": probe.max_new_tokens,
            "temperature": probe.temperature,
            "sampling_seed": probe.sampling_seed,
        },
        "runs": {s.backend: s.to_json() for s in summaries},
    }
