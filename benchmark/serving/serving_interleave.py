"""The interleaved serving protocol: its run order and the paired ratios it yields.

With every server of a command up, each concurrency's cell is measured in
rounds; a round runs one ``bench_serving`` call per configuration, the
reference (a) first: ``a, X1, X2, ...``, then again ``a, X1, X2, ...``. Machine
drift (clocks, temperature, other tenants) then hits every configuration of a
round alike, and each ratio is taken between runs of the same round, never
across rounds or commands:

    ratio_r(X, ref, c) = throughput(X, c, round r) / throughput(ref, c, round r)

reported as the median over rounds, with min and max (the spread) and the
number of rounds n. References: (a), SGLang's non-deterministic fast path;
(b), its own deterministic path; (g), no speculative decoding without
deterministic inference (the reference of (f)); each where the command ran it.

Round 0 calibrates: one run per configuration and concurrency of
``RepeatSettings.start_prompts`` prompts (a warm-up, never counted) whose
duration scales each configuration's prompt count so its runs last about
``margin x min_seconds`` (``RepeatSettings.next_prompts``). Rounds go
outermost (all concurrencies in round 1, then round 2...), so a command cut
short by its time limit leaves every cell with the same number of rounds,
give or take one.
"""

from __future__ import annotations

import statistics

REFERENCES = ("a", "b", "g")
FIELD = "output_throughput"


def schedule(keys: list[str], concurrencies: list[int], rounds: int) -> list[tuple[int, int, str]]:
    """``(round, concurrency, key)`` in run order: round 0 (calibration) then rounds 1..``rounds``.

    Within a round and concurrency the reference (a) runs first, then the
    other keys in the given order.

    Raises:
        ValueError: ``keys`` without ``a`` or with fewer than two keys, no
            concurrency, or ``rounds`` outside [1, 20].
    """
    if "a" not in keys or len(keys) < 2:
        raise ValueError(f"configs must hold a (the reference) and at least one more key, got {''.join(keys)!r}")
    if not concurrencies:
        raise ValueError("concurrency must list at least one level")
    if not 1 <= rounds <= 20:
        raise ValueError(f"rounds must lie in [1, 20], got {rounds}")
    order = ["a"] + [k for k in keys if k != "a"]
    return [(r, c, k) for r in range(rounds + 1) for c in concurrencies for k in order]


def paired_ratios(rows: list[dict], reference: str, field: str = FIELD) -> dict[str, dict[int, list[float]]]:
    """``{key: {concurrency: [X_r / ref_r for every round r where both have a valid run]}}``.

    ``rows``: one command's result rows; interleaved runs carry ``round``
    (>= 1 counts; 0 is calibration) and ``valid``. Rows without a positive
    finite ``field`` are skipped; the reference itself and (a) are left out.
    """
    by = {}
    for r in rows:
        rnd, key, conc, value = r.get("round"), r.get("key"), r.get("concurrency"), r.get(field)
        if not (isinstance(rnd, int) and rnd >= 1 and r.get("valid") is True and "error" not in r):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
            continue
        by[(key, conc, rnd)] = float(value)
    out: dict[str, dict[int, list[float]]] = {}
    for (key, conc, rnd), value in sorted(by.items()):
        ref = by.get((reference, conc, rnd))
        if key in (reference, "a") or ref is None:  # (a) is everyone's reference, never measured against one
            continue
        out.setdefault(key, {}).setdefault(conc, []).append(value / ref)
    return out


def ratio_tables(commands_rows: list[list[dict]], field: str = FIELD) -> dict:
    """The ``serving.json`` fields of the interleaved protocol from one or several commands' rows.

    Returns ``{"interleaved": bool, "ratio_to_<ref>": {key: {"<c>": median}},
    "ratio_to_<ref>_spread": {key: {"<c>": {"min", "max", "n"}}}}`` for each
    reference of ``REFERENCES`` that some command paired with another key.
    Ratios of several commands are pooled (each one a pair within one
    round of one command) before the median. ``interleaved`` is true when
    some row carries ``interleaved: true``.
    """
    out: dict = {"interleaved": any(r.get("interleaved") is True for rows in commands_rows for r in rows)}
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
    lines = []
    for ref in REFERENCES:
        per_key = tables.get(f"ratio_to_{ref}")
        if not per_key:
            continue
        spread = tables[f"ratio_to_{ref}_spread"]
        lines += [f"## interleaved: output tokens/s relative to ({ref}), same round (measured, not asserted)", "",
                  "Median over rounds of X_r / ref_r (min–max, n rounds).", "",
                  "| configuration | " + " | ".join(f"c={c}" for c in concurrencies) + " |",
                  "|---|" + "---|" * len(concurrencies)]
        for key, per_c in per_key.items():
            texts = []
            for c in concurrencies:
                v, s = per_c.get(str(c)), spread[key].get(str(c))
                texts.append("-" if v is None else f"{v:.3f} ({s['min']:.3f}–{s['max']:.3f}, n={s['n']})")
            lines.append(f"| ({key}) | " + " | ".join(texts) + " |")
        lines.append("")
    return lines
