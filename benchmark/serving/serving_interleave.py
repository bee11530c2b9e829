"""The interleaved serving protocol: its run order, the prompt counts, and the paired ratios it yields.

With every server of a command up (at most ``MAX_SERVERS``: idle servers
beside the measured one share the host and the GPU, and five of them gave
spreads of 0.45-0.90 at one cell), each concurrency's cell is measured in
rounds; a round runs one ``bench_serving`` call per configuration, in an
order that changes from round to round (:func:`round_order`): with two
configurations ABBA (round 1 ``a, X``, round 2 ``X, a``, round 3 ``a, X``),
with more a Williams design (each configuration in each position equally
often, and each one right after each other one equally often, over a full
cycle of rounds), so a drift within a round (clocks, temperature, caches)
favours no configuration over the rounds. Each ratio is taken between runs
of the same round, never across rounds or commands:

    ratio_r(X, ref, c) = throughput(X, c, round r) / throughput(ref, c, round r)

reported as the median over rounds, with min and max (the spread) and the
number of rounds n. References (:func:`reference_of`): (a), SGLang's
non-deterministic fast path, for every speculative configuration; (g), no
speculative decoding without deterministic inference, for (f) (the same
without speculative decoding, deterministic); (b), SGLang's own
deterministic path, where the command ran it.

Round 0 calibrates: one warm-up run per configuration and concurrency, all
with the same ``RepeatSettings.start_prompts`` prompts, never counted. From
them one prompt count per concurrency (:func:`common_prompts`): scaled so
the fastest configuration's run lasts about ``margin x min_seconds``. Every
configuration then runs that count in every round, so both arms of a pair
serve the same requests (``bench_serving`` draws them from one seed) and
the slower arm simply runs longer; when a round's fastest run falls short
of ``min_seconds`` (the machine got faster), the count is raised for the
next round, again for every configuration. Rounds go outermost (all
concurrencies in round 1, then round 2...), so a command cut short by its
time limit leaves every cell with the same number of rounds, give or take
one.
"""

from __future__ import annotations

import statistics

MAX_SERVERS = 3  # servers of one interleaved command
REFERENCES = ("a", "b", "g")
# The reference of each configuration that is measured against one other than (a).
PAIRED_WITH = {"f": "g"}
FIELD = "output_throughput"


def reference_of(key: str) -> str | None:
    """The configuration ``key`` is measured against: (g) for (f), none for (a) and (g), else (a)."""
    if key in ("a", "g"):
        return None
    return PAIRED_WITH.get(key, "a")


def check_keys(keys: list[str]) -> None:
    """Raise unless ``keys`` can be interleaved: at least two, at most ``MAX_SERVERS``, each key with its
    reference and each reference with a key measured against it.

    Raises:
        ValueError: fewer than two keys, more than ``MAX_SERVERS``, a key twice,
            a key whose reference (:func:`reference_of`) is missing, or a
            reference that no key uses.
    """
    text = "".join(keys)
    if len(set(keys)) != len(keys):
        raise ValueError(f"configs: each key at most once, got {text!r}")
    if len(keys) < 2:
        raise ValueError(f"configs must hold a reference and at least one more key, got {text!r}")
    if len(keys) > MAX_SERVERS:
        raise ValueError(f"configs: at most {MAX_SERVERS} servers per interleaved command (more disturb each "
                         f"other's runs), got {len(keys)} ({text})")
    for key in keys:
        ref = reference_of(key)
        if ref is not None and ref not in keys:
            raise ValueError(f"configs must hold ({ref}), the reference of ({key}); got {text!r} "
                             f"(the pairs: a with any speculative configuration, g with f)")
    unused = [k for k in keys if k not in pairable(keys)]
    if unused:
        raise ValueError(f"configs: ({unused[0]}) is the reference of no other key in {text!r} "
                         f"(the pairs: a with any speculative configuration, g with f)")


def pairable(keys: list[str]) -> list[str]:
    """``keys`` (order kept) without those whose reference is absent and references nobody uses."""
    measured = [k for k in keys if reference_of(k) is not None and reference_of(k) in keys]
    used = {reference_of(k) for k in measured}
    return [k for k in keys if k in measured or k in used]


def williams_rows(n: int) -> list[list[int]]:
    """The rows of a Williams design for ``n`` treatments (Williams 1949), as position -> treatment index.

    ``n`` rows for even ``n`` (and 1), ``2n`` for odd ``n`` (each row and its reverse).
    Every treatment takes every position equally often, and every ordered
    pair of different treatments is adjacent equally often. For ``n = 2``:
    ``[[0, 1], [1, 0]]`` (ABBA).

    Raises:
        ValueError: ``n`` below 1.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(t + shift) % n for t in first] for shift in range(n)]
    return rows if n % 2 == 0 or n == 1 else rows + [row[::-1] for row in rows]


def round_order(keys: list[str], rnd: int) -> list[str]:
    """The order of ``keys`` in round ``rnd``: round 0 and 1 in the base order, then row ``rnd - 1`` of
    :func:`williams_rows` (round 2 reversed for two keys).

    The base order puts the references first, then the others as given.

    Raises:
        ValueError: ``rnd`` below 0.
    """
    if rnd < 0:
        raise ValueError(f"rnd must be >= 0, got {rnd}")
    base = [k for k in keys if reference_of(k) is None] + [k for k in keys if reference_of(k) is not None]
    rows = williams_rows(len(base))
    return [base[i] for i in rows[max(0, rnd - 1) % len(rows)]]


def schedule(keys: list[str], concurrencies: list[int], rounds: int) -> list[tuple[int, int, str]]:
    """``(round, concurrency, key)`` in run order: round 0 (calibration) then rounds 1..``rounds``.

    Within a round the keys follow :func:`round_order` at every concurrency.

    Raises:
        ValueError: ``keys`` failing :func:`check_keys`, no concurrency, or
            ``rounds`` outside [1, 20].
    """
    check_keys(keys)
    if not concurrencies:
        raise ValueError("concurrency must list at least one level")
    if not 1 <= rounds <= 20:
        raise ValueError(f"rounds must lie in [1, 20], got {rounds}")
    return [(r, c, k) for r in range(rounds + 1) for c in concurrencies for k in round_order(keys, r)]


def common_prompts(repeat, prompts: int, durations: list[float], concurrency: int) -> int:
    """The prompt count of every configuration's next run at one concurrency.

    ``durations``: bench_serving's ``duration`` (s) of the runs of ``prompts``
    prompts that just ended at that concurrency (one per configuration; the
    calibration, or a round whose fastest run was short). The fastest sets
    the count: kept when it lasted at least ``margin x min_seconds``, else
    scaled by ``repeat.next_prompts`` to about that; the slower
    configurations then last longer, never shorter.

    Raises:
        ValueError: no positive duration.
    """
    positive = [d for d in durations if d > 0]
    if not positive:
        raise ValueError(f"durations: need at least one positive duration, got {durations!r}")
    fastest = min(positive)
    if fastest >= repeat.margin * repeat.min_seconds:
        return prompts
    return repeat.next_prompts(prompts, fastest, concurrency)


def measured_runs(rows: list[dict], field: str = FIELD) -> dict[tuple[str, int, int], float]:
    """``{(key, concurrency, round): field}`` of the counted interleaved runs of one command.

    ``rows``: one command's result rows; interleaved runs carry ``round``
    (>= 1 counts; 0 is calibration) and ``valid``. Rows with an ``error``,
    ``valid`` not true, or without a positive finite ``field`` are left out.
    """
    by = {}
    for r in rows:
        rnd, key, conc, value = r.get("round"), r.get("key"), r.get("concurrency"), r.get(field)
        if not (isinstance(rnd, int) and rnd >= 1 and r.get("valid") is True and "error" not in r):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            continue
        by[(key, conc, rnd)] = float(value)
    return by


def paired_ratios(rows: list[dict], reference: str, field: str = FIELD) -> dict[str, dict[int, list[float]]]:
    """``{key: {concurrency: [X_r / ref_r for every round r where both have a counted run]}}``.

    ``rows``: one command's result rows (see :func:`measured_runs`); the
    reference itself and (a) are left out.
    """
    by = measured_runs(rows, field)
    out: dict[str, dict[int, list[float]]] = {}
    for (key, conc, rnd), value in sorted(by.items()):
        ref = by.get((reference, conc, rnd))
        if key in (reference, "a") or ref is None:  # (a) is everyone's reference, never measured against one
            continue
        out.setdefault(key, {}).setdefault(conc, []).append(value / ref)
    return out


def ratio_tables(commands_rows: list[list[dict]], field: str = FIELD) -> dict:
    """The ``serving.json`` fields of the interleaved protocol from one or several commands' rows.

    Returns ``{"interleaved": bool}``, and where some row carries
    ``interleaved: true`` also ``"rounds": {key: {"<c>": int}}`` (the rounds
    measured: counted runs of rounds >= 1, summed over the commands),
    ``"ratio_to_a"`` (always, ``{}`` when no command paired a key with (a))
    and, for each reference of ``REFERENCES`` that some command paired with
    another key, ``"ratio_to_<ref>": {key: {"<c>": median}}`` and
    ``"ratio_to_<ref>_spread": {key: {"<c>": {"min", "max", "n"}}}`` (n: the
    rounds paired). Ratios of several commands are pooled (each one a pair
    within one round of one command) before the median.
    """
    out: dict = {"interleaved": any(r.get("interleaved") is True for rows in commands_rows for r in rows)}
    if not out["interleaved"]:
        return out
    rounds: dict[str, dict[int, int]] = {}
    for rows in commands_rows:
        for key, conc, _ in measured_runs(rows, field):
            rounds.setdefault(key, {}).setdefault(conc, 0)
            rounds[key][conc] += 1
    out["rounds"] = {k: {str(c): n for c, n in sorted(per.items())} for k, per in sorted(rounds.items())}
    out["ratio_to_a"] = {}
    for ref in REFERENCES:
        pooled: dict[str, dict[int, list[float]]] = {}
        for rows in commands_rows:
            for key, per_c in paired_ratios(rows, ref, field).items():
                for conc, values in per_c.items():
                    pooled.setdefault(key, {}).setdefault(conc, []).extend(values)
        if not pooled:
            continue
        out[f"ratio_to_{ref}"] = {k: {str(c): statistics.median(v) for c, v in sorted(per.items())}
                                  for k, per in sorted(pooled.items())}
        out[f"ratio_to_{ref}_spread"] = {k: {str(c): {"min": min(v), "max": max(v), "n": len(v)}
                                             for c, v in sorted(per.items())}
                                         for k, per in sorted(pooled.items())}
    return out


def render_markdown(tables: dict, concurrencies: list[int]) -> list[str]:
    """Markdown lines of :func:`ratio_tables` (empty when nothing was interleaved)."""
    if not tables.get("interleaved"):
        return []
    header = ["| configuration | " + " | ".join(f"c={c}" for c in concurrencies) + " |",
              "|---|" + "---|" * len(concurrencies)]
    lines = []
    for ref in REFERENCES:
        per_key = tables.get(f"ratio_to_{ref}")
        if not per_key:
            continue
        spread = tables[f"ratio_to_{ref}_spread"]
        lines += [f"## interleaved: output tokens/s relative to ({ref}), same round (measured, not asserted)", "",
                  "Median over rounds of X_r / ref_r (min–max, n rounds).", "", *header]
        for key, per_c in per_key.items():
            texts = []
            for c in concurrencies:
                v, s = per_c.get(str(c)), spread[key].get(str(c))
                texts.append("-" if v is None else f"{v:.3f} ({s['min']:.3f}–{s['max']:.3f}, n={s['n']})")
            lines.append(f"| ({key}) | " + " | ".join(texts) + " |")
        lines.append("")
    if tables.get("rounds"):
        lines += ["## interleaved: rounds measured (valid runs of rounds 1, 2, ...; calibration not counted)", "",
                  *header]
        for key, per_c in tables["rounds"].items():
            lines.append(f"| ({key}) | " + " | ".join(str(per_c.get(str(c), 0)) for c in concurrencies) + " |")
        lines.append("")
    return lines
