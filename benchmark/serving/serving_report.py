"""Tables and plots of the serving benchmark from the result rows of one command or several.

Input: one result folder per command (``serving_run.py --out``), each with
``results.jsonl`` and ``meta.json``. A row is one ``bench_serving`` run: the
fields bench_serving wrote (``output_throughput`` tokens/s, ``mean_itl_ms``,
``p99_itl_ms``, ``accept_length``, ``completed``...) plus ``key``, ``name``,
``title``, ``concurrency``, ``rep``, ``num_prompts``, ``duration_s``,
``valid`` (the run lasted at least the command's ``min_seconds`` and counts)
and ``warmup`` (a shorter run: recorded, never counted). A row with ``error``
is a failed run; one with ``note`` says why a cell ended with fewer valid runs
than wanted. Rows without ``valid`` (results written before repetitions
existed) count unless they carry an ``error``.

Per (command, configuration, concurrency) cell, over its valid runs: the
median of every numeric field, its min and max and the number of runs n.
Ratios to (b) are computed within one command only (each command measures
its own (b), so a ratio never mixes two machines' states): the ratio of the
medians, median(X) / median(b), and its range, the min and max of
X_i / b_j over every pair of a valid run i of X and a valid run j of (b) in
that command (min X / max b .. max X / min b). They are reported, never
asserted. Listed beside the tables: the cells with fewer valid runs than the
command's ``repeats`` (2 when its meta.json does not say) and the missing
cells (planned in meta.json, configurations x concurrencies, or else seen in
the rows, without any valid run), each with the reason recorded.

Runs of the interleaved protocol (``serving_run.py --interleave``; rows with
``round`` and ``interleaved``) add paired ratios, each between runs of one
round of one command (``serving_interleave.py``): ``serving.json`` gets
``"interleaved": true``, ``"ratio_to_a": {"<config>": {"<concurrency>":
median}}`` and ``ratio_to_a_spread`` (min, max, n rounds), the same to (b)
and (g) where a command ran them, ``"rounds": {"<config>":
{"<concurrency>": int}}`` (the rounds measured, summed over the commands),
and ``serving.md`` their tables.

Writes ``serving.md``, ``serving.json`` and one PNG per metric (medians, bars
from min to max); for one folder with a ``window.json`` (``--window-profile``)
also its ``window.md``, re-rendered (``serving_window.report``).

    python serving_report.py RESULT_DIR [--out DOCS_DIR]
    python serving_report.py DIR1 DIR2 ... --out MERGED_DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serving_interleave  # noqa: E402

METRICS = (  # (field, label, unit, higher is better)
    ("output_throughput", "output tokens/s", "tokens/s", True),
    ("mean_itl_ms", "mean inter-token latency", "ms", False),
    ("p99_itl_ms", "p99 inter-token latency", "ms", False),
    # bench_serving reads SGLang's avg_spec_accept_length after each run: an average over every verify since the
    # server started, so a cell's value also holds the server's earlier cells (a switching tree's other shape too).
    ("accept_length", "accept length (server's running average since its start)", "tokens/round", True),
)
# The plugin's configurations (SGLANG_DETSPEC active), each compared with SGLang's own deterministic path.
RATIO_KEYS = ("c", "d", "e", "i", "j", "f", "h")
REFERENCE_KEY = "b"
RATIO_FIELDS = ("output_throughput", "mean_itl_ms", "p99_itl_ms")
DEFAULT_REPEATS = 2
# Numeric row fields that are settings of the run, not measurements: no median for them.
SETTING_FIELDS = frozenset({"concurrency", "rep", "round", "max_concurrency", "random_input_len", "random_output_len",
                            "random_range_ratio", "request_rate", "sharegpt_output_len"})


@dataclasses.dataclass
class Command:
    """One command's results: its label (the name the report gives it), rows and meta.json."""

    label: str
    rows: list
    meta: dict


def load_rows(path: str) -> list[dict]:
    """Rows of a JSON-lines file; a truncated last line (a run cut short) is skipped."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def load_command(folder: str, label: str | None = None) -> Command:
    """A result folder: ``results.jsonl`` (required) and ``meta.json`` (optional).

    The label is ``label``, else meta.json's ``label``, else the folder's name.

    Raises:
        FileNotFoundError: no results.jsonl in ``folder``.
    """
    rows_path = os.path.join(folder, "results.jsonl")
    if not os.path.exists(rows_path):
        raise FileNotFoundError(f"no results.jsonl in {folder}")
    meta_path = os.path.join(folder, "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    label = label or meta.get("label") or os.path.basename(os.path.normpath(folder)) or "run"
    return Command(label, load_rows(rows_path), meta)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def counts(row: dict) -> bool:
    """Whether a row is a valid run: ``valid`` true (absent: no ``error`` and no ``note``)."""
    if "error" in row or "note" in row:
        return False
    return row.get("valid", True) is True


def index_rows(rows: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """``{(key, concurrency): [rows of that cell, in file order]}``.

    Raises:
        ValueError: a row without ``key`` or an integer ``concurrency``.
    """
    table: dict[tuple[str, int], list[dict]] = {}
    for i, row in enumerate(rows):
        key, conc = row.get("key"), row.get("concurrency")
        if not isinstance(key, str) or not isinstance(conc, int) or isinstance(conc, bool):
            raise ValueError(f"row {i}: needs a string 'key' and an integer 'concurrency', got {key!r}, {conc!r}")
        table.setdefault((key, conc), []).append(row)
    return table


def aggregate(rows: list[dict]) -> dict:
    """One cell from its rows: ``n`` valid runs, ``median`` / ``min`` / ``max`` / ``values`` per numeric field.

    Also ``warmups`` (short runs), ``errors`` and ``notes`` (texts), ``title``.
    Fields in ``SETTING_FIELDS`` and non-numeric ones are left out; a field
    missing from some valid runs is aggregated over the runs that have it.
    """
    valid = [r for r in rows if counts(r)]
    values: dict[str, list[float]] = {}
    for r in valid:
        for field, value in r.items():
            v = _number(value)
            if v is not None and field not in SETTING_FIELDS:
                values.setdefault(field, []).append(v)
    return {
        "title": next((r["title"] for r in rows if r.get("title")), None),
        "n": len(valid),
        "median": {f: statistics.median(v) for f, v in values.items()},
        "min": {f: min(v) for f, v in values.items()},
        "max": {f: max(v) for f, v in values.items()},
        "values": values,
        "warmups": sum(1 for r in rows if r.get("warmup") and "error" not in r),
        "errors": [r["error"] for r in rows if r.get("error")],
        "notes": [r["note"] for r in rows if r.get("note")],
    }


def ratio(cell: dict | None, reference: dict | None, field: str) -> dict | None:
    """``cell`` relative to ``reference`` (two cells of one command) for ``field``; None without data.

    Returns ``{"ratio": median / median, "min": min over run pairs, "max": max over run pairs,
    "n": runs of cell, "n_b": runs of reference}``; None when either has no value or a value <= 0.
    """
    if not cell or not reference:
        return None
    xs, bs = cell["values"].get(field, []), reference["values"].get(field, [])
    if not xs or not bs or min(bs) <= 0 or min(xs) <= 0:
        return None
    pairs = [x / b for x in xs for b in bs]
    return {"ratio": statistics.median(xs) / statistics.median(bs), "min": min(pairs), "max": max(pairs),
            "n": len(xs), "n_b": len(bs)}


def _unique_labels(commands: list[Command]) -> list[str]:
    seen: dict[str, int] = {}
    labels = []
    for c in commands:
        seen[c.label] = seen.get(c.label, 0) + 1
        labels.append(c.label if seen[c.label] == 1 else f"{c.label}#{seen[c.label]}")
    return labels


def _planned(command: Command, table: dict) -> tuple[list[str], list[int]]:
    keys = list(command.meta.get("configs") or []) or sorted({k for k, _ in table})
    concs = [c for c in command.meta.get("concurrencies") or [] if isinstance(c, int)] or sorted(
        {c for _, c in table})
    return keys, concs


def _absent_reason(meta: dict, key: str) -> str:
    failure = (meta.get("failures") or {}).get(key)
    if failure:
        return f"server failed: {failure.get('why', '?')}"
    state = (meta.get("server_states") or {}).get(key)
    if state == "waiting":
        return "server never started (time budget)"
    return "not measured"


def summarize(commands: list[Command]) -> dict:
    """Everything the report shows, from one or several commands.

    Returns a dict: ``labels`` (one per command, unique), ``metas`` (label ->
    meta), ``concs`` (all concurrencies, sorted), ``cells`` ((label, key,
    concurrency) -> :func:`aggregate` of its rows), ``titles`` (key -> title),
    ``ratios`` (label -> field -> key -> concurrency -> :func:`ratio` or None,
    for the keys of ``RATIO_KEYS`` that command measured), ``no_reference``
    ((label, key, concurrency) where that command measured the key but not
    (b); interleaved commands left out, their references being paired per
    round), ``fewer`` ((label, key, concurrency, n, repeats, reasons) with
    0 < n < repeats) and ``missing`` ((label, key, concurrency, reasons)
    planned without a valid run).

    Raises:
        ValueError: a row without a string ``key`` or an integer ``concurrency``.
    """
    labels = _unique_labels(commands)
    summary = {"labels": labels, "metas": {}, "concs": set(), "cells": {}, "titles": {}, "ratios": {},
               "no_reference": [], "fewer": [], "missing": [], "repeats": {}}
    for label, command in zip(labels, commands):
        meta = command.meta
        summary["metas"][label] = meta
        table = index_rows(command.rows)
        for k, c in (meta.get("configs") or {}).items():
            if isinstance(c, dict) and c.get("title"):
                summary["titles"].setdefault(k, c["title"])
        repeats = meta.get("repeats") if isinstance(meta.get("repeats"), int) else DEFAULT_REPEATS
        summary["repeats"][label] = repeats
        for (key, conc), rows in table.items():
            cell = aggregate(rows)
            summary["cells"][(label, key, conc)] = cell
            if cell["title"]:
                summary["titles"][key] = cell["title"]
        keys, concs = _planned(command, table)
        summary["concs"].update(concs)
        summary["concs"].update(c for _, c in table)
        for key in keys:
            for conc in concs:
                cell = summary["cells"].get((label, key, conc))
                if cell is None:
                    summary["missing"].append((label, key, conc, [_absent_reason(meta, key)]))
                    continue
                reasons = cell["errors"] + cell["notes"]
                if cell["warmups"]:
                    reasons.append(f"{cell['warmups']} warm-up run(s) shorter than "
                                   f"{meta.get('min_seconds', '?')} s")
                if cell["n"] == 0:
                    summary["missing"].append((label, key, conc, reasons or ["no valid run"]))
                elif cell["n"] < repeats:
                    summary["fewer"].append((label, key, conc, cell["n"], repeats, cell["errors"] + cell["notes"]))
        measured = {(k, c) for (lab, k, c), cell in summary["cells"].items() if lab == label and cell["n"]}
        paired = any(r.get("interleaved") is True for r in command.rows)
        per_field = {}
        for field in RATIO_FIELDS:
            per_key = {}
            for key in RATIO_KEYS:
                per_key[key] = {}
                for conc in sorted({c for _, c in table} | set(concs)):
                    per_key[key][conc] = ratio(summary["cells"].get((label, key, conc)),
                                               summary["cells"].get((label, REFERENCE_KEY, conc)), field)
                    if (field == RATIO_FIELDS[0] and not paired and (key, conc) in measured
                            and (REFERENCE_KEY, conc) not in measured):
                        summary["no_reference"].append((label, key, conc))
            per_field[field] = per_key
        summary["ratios"][label] = per_field
    summary["concs"] = sorted(summary["concs"])
    summary["interleaved"] = serving_interleave.ratio_tables([c.rows for c in commands])
    return summary


def _fmt(value, digits=1) -> str:
    v = _number(value)
    return "-" if v is None else f"{v:,.{digits}f}"


def _cell_text(cell: dict | None, field: str, digits: int) -> str:
    if not cell or field not in cell["median"]:
        return "-"
    med = _fmt(cell["median"][field], digits)
    n = len(cell["values"][field])
    if n < 2:
        return f"{med} (n={n})"
    return f"{med} ({_fmt(cell['min'][field], digits)}–{_fmt(cell['max'][field], digits)}, n={n})"


def _where(summary: dict, label: str, key: str, conc: int) -> str:
    text = f"({key}) c={conc}"
    return text if len(summary["labels"]) == 1 else f"{text} [{label}]"


def _row_name(summary: dict, label: str, key: str) -> str:
    title = summary["titles"].get(key) or key
    return title if len(summary["labels"]) == 1 else f"{title} [{label}]"


def _meta_lines(meta: dict, indent: str = "") -> list[str]:
    lines = []
    for label, field in (("date (UTC)", "date_utc"), ("machine", "gpu"), ("torch", "torch_version"),
                         ("Triton", "triton_version"), ("SGLang", "sglang_version"),
                         ("sglang-detspec", "sglang_detspec_version"), ("code revision", "code_revision"),
                         ("attention backend", "attention_backend"), ("models", "models"), ("load", "load"),
                         ("repetitions", "repeat"),
                         ("shared server flags", "server_flags"), ("every server's added flags", "every_server_args"),
                         ("prefill CUDA graphs", "prefill_cuda_graphs"), ("wall time (s)", "wall_s")):
        if meta.get(field) is not None:
            value = meta[field]
            lines.append(f"{indent}- {label}: {json.dumps(value) if isinstance(value, (dict, list)) else value}")
    if meta.get("interleaved"):
        # The load's "rounds" are request waves per run and "repeats" the cell mode's: neither counts these.
        lines.append(f"{indent}- interleaved rounds per cell: {meta.get('alternations')} after one uncounted "
                     "calibration round (the load's `rounds` are request waves within one run)")
    return lines


def _protocol_line(summary: dict) -> str:
    parts = []
    for label in summary["labels"]:
        meta = summary["metas"][label]
        who = "" if len(summary["labels"]) == 1 else f"`{label}`: "
        if isinstance(meta.get("min_seconds"), (int, float)):
            parts.append(f"{who}{summary['repeats'][label]} valid runs wanted per cell, each with bench_serving's "
                         f"duration >= {meta['min_seconds']:g} s (shorter runs are warm-ups, not counted)")
        else:
            parts.append(f"{who}no repetition settings recorded (results from before repetitions: "
                         f"every run counts, {summary['repeats'][label]} wanted)")
    return ("Each cell: median of its valid runs (min–max, n = valid runs). " + "; ".join(parts) + ".")


def render_markdown(summary: dict) -> str:
    """The report of :func:`summarize` as a markdown document."""
    labels, concs, cells = summary["labels"], summary["concs"], summary["cells"]
    multi = len(labels) > 1
    lines = ["# End-to-end serving benchmark", ""]
    if multi:
        lines += [f"Merged from {len(labels)} commands; each row names the command that measured it, and ratios "
                  "to (b) use the (b) of the same command.", ""]
        for label in labels:
            meta = summary["metas"][label]
            keys = "".join(sorted({k for (lab, k, _), c in cells.items() if lab == label and c["n"]}))
            lines.append(f"- command `{label}` (configurations measured: {keys or 'none'})")
            lines += _meta_lines(meta, indent="  ")
    else:
        lines += _meta_lines(summary["metas"][labels[0]]) if labels else []
        if labels and summary["metas"][labels[0]].get("label"):
            lines.append(f"- command: `{labels[0]}`")
    lines += ["", _protocol_line(summary), ""]
    names = []  # (label, key) with at least one valid cell, by key then command
    for key in sorted({k for (_, k, _) in cells}):
        for label in labels:
            if any(cells.get((label, key, c), {}).get("n") for c in concs):
                names.append((label, key))
    header = ["| configuration | " + " | ".join(f"c={c}" for c in concs) + " |", "|---|" + "---|" * len(concs)]
    for field, label_text, unit, _ in METRICS:
        digits = 2 if field == "accept_length" else 1
        lines += [f"## {label_text} ({unit})", "", *header]
        for label, key in names:
            texts = [_cell_text(cells.get((label, key, c)), field, digits) for c in concs]
            lines.append(f"| {_row_name(summary, label, key)} | " + " | ".join(texts) + " |")
        lines.append("")
    measured_b = any(cells.get((label, "b", c), {}).get("n") for label in labels for c in concs)
    for field, label_text in (("output_throughput", "output tokens/s"), ("mean_itl_ms", "mean inter-token latency")):
        rows = [(label, key) for label in labels for key in RATIO_KEYS
                if any(cells.get((label, key, c), {}).get("n") for c in concs)]
        if not measured_b:  # a command without (b) has no ratio to it: no table of dashes
            break
        lines += [f"## ratio to (b), {label_text} (measured, not asserted)", "",
                  "Ratio of the medians, median(X) / median(b), both measured by the same command.", "", *header]
        for label, key in rows:
            r = summary["ratios"][label][field][key]
            lines.append(f"| {_row_name(summary, label, key)} | "
                         + " | ".join(_fmt((r.get(c) or {}).get("ratio"), 3) for c in concs) + " |")
        lines += ["", "Range of the ratio: min and max of X_i / b_j over every pair of valid runs "
                  "(min X / max b .. max X / min b), with the runs n of X and n of (b).", "", *header]
        for label, key in rows:
            r = summary["ratios"][label][field][key]
            texts = []
            for c in concs:
                v = r.get(c)
                texts.append("-" if v is None else
                             f"{_fmt(v['min'], 3)}–{_fmt(v['max'], 3)} (n={v['n']}/{v['n_b']})")
            lines.append(f"| {_row_name(summary, label, key)} | " + " | ".join(texts) + " |")
        lines.append("")
    lines += serving_interleave.render_markdown(summary.get("interleaved") or {}, concs)
    if summary["no_reference"]:
        lines += ["No ratio where the command did not measure (b) at that concurrency: "
                  + ", ".join(_where(summary, *item) for item in summary["no_reference"]), ""]
    if summary["fewer"]:
        items = []
        for label, key, conc, n, repeats, reasons in summary["fewer"]:
            why = f"; {'; '.join(reasons)}" if reasons else ""
            items.append(f"{_where(summary, label, key, conc)} (n={n} of {repeats}{why})")
        wanted = sorted({item[4] for item in summary["fewer"]})
        lines += [f"Cells with fewer than {'/'.join(map(str, wanted))} valid repetitions: " + ", ".join(items), ""]
    if summary["missing"]:
        items = [f"{_where(summary, label, key, conc)}" + (f" ({'; '.join(reasons)})" if reasons else "")
                 for label, key, conc, reasons in summary["missing"]]
        lines += ["Missing measurements: " + ", ".join(items), ""]
    return "\n".join(lines)


def markdown(table: dict, meta: dict) -> str:
    """The markdown report of one command from :func:`index_rows`'s table (or ``{(key, conc): row}``)."""
    rows = [r for v in table.values() for r in (v if isinstance(v, list) else [v])]
    return render_markdown(summarize([Command(meta.get("label") or "run", rows, meta)]))


def plots(summary: dict, out_dir: str) -> list[str]:
    """One PNG per metric (x: concurrency, log scale; one line per configuration and command, bars min–max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells, labels = summary["cells"], summary["labels"]
    meta = summary["metas"][labels[0]] if labels else {}
    paths = []
    # One short line: the date, the first GPU's name (nvidia-smi lists one "name, memory, driver" per GPU)
    # and the versions; the full facts are in the markdown report.
    gpus = [g.split(",")[0].strip() for g in str(meta.get("gpu") or "").split(";") if g.strip()]
    used = meta.get("gpus_used") or len(gpus)
    facts = {"date_utc": str(meta.get("date_utc") or "")[:10],
             "gpu": f"{used} x {gpus[0]}" if gpus else "",
             "torch_version": f"torch {meta['torch_version']}" if meta.get("torch_version") else "",
             "triton_version": f"Triton {meta['triton_version']}" if meta.get("triton_version") else "",
             "sglang_version": f"SGLang {meta['sglang_version']}" if meta.get("sglang_version") else "",
             "attention_backend": f"attention {meta['attention_backend']}" if meta.get("attention_backend") else ""}
    stamp = ", ".join(v for v in facts.values() if v)
    lines = sorted({(k, lab) for (lab, k, _) in cells}, key=lambda kl: (kl[0], labels.index(kl[1])))
    for field, label_text, unit, _ in METRICS:
        fig, ax = plt.subplots(figsize=(8, 5))
        drawn = False
        for key, label in lines:
            points = sorted((c, cell) for (lab, k, c), cell in cells.items()
                            if lab == label and k == key and field in cell["median"])
            if not points:
                continue
            xs = [c for c, _ in points]
            med = [cell["median"][field] for _, cell in points]
            low = [cell["median"][field] - cell["min"][field] for _, cell in points]
            high = [cell["max"][field] - cell["median"][field] for _, cell in points]
            ax.errorbar(xs, med, yerr=[low, high], marker="o", capsize=3, label=_row_name(summary, label, key))
            drawn = True
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(f"{label_text} ({unit})")
        ax.set_title(f"{label_text}: median of valid runs, bars min–max\n{stamp}", fontsize=9)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        path = os.path.join(out_dir, f"serving_{field}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _json_summary(summary: dict, commands: list[Command]) -> dict:
    labels = summary["labels"]
    legacy = {}  # ratios_to_b[field][key][str(c)]: the ratio of medians from the first command that has one
    for field in RATIO_FIELDS:
        legacy[field] = {}
        for key in RATIO_KEYS:
            legacy[field][key] = {}
            for c in summary["concs"]:
                found = [summary["ratios"][lab][field][key].get(c) for lab in labels]
                found = [f for f in found if f]
                legacy[field][key][str(c)] = found[0]["ratio"] if found else None
    rows = [{**r, "measured_by": label} for label, command in zip(labels, commands) for r in command.rows]
    return {
        **summary["interleaved"],
        "meta": summary["metas"][labels[0]] if len(labels) == 1 else {},
        "commands": summary["metas"],
        "rows": rows,
        "cells": [{"measured_by": lab, "key": k, "concurrency": c,
                   **{f: v for f, v in cell.items() if f != "values"}}
                  for (lab, k, c), cell in sorted(summary["cells"].items(),
                                                  key=lambda item: (item[0][1], labels.index(item[0][0]), item[0][2]))],
        "ratios_to_b": legacy,
        "ratio_ranges_to_b": {lab: {f: {k: {str(c): v for c, v in per_c.items()} for k, per_c in per_key.items()}
                                    for f, per_key in per_field.items()}
                              for lab, per_field in summary["ratios"].items()},
        "fewer_repetitions": [{"measured_by": lab, "key": k, "concurrency": c, "n": n, "repeats": r, "why": why}
                              for lab, k, c, n, r, why in summary["fewer"]],
        "missing": [{"measured_by": lab, "key": k, "concurrency": c, "why": why}
                    for lab, k, c, why in summary["missing"]],
    }


def write_commands(commands: list[Command], out_dir: str, *, with_plots: bool = True) -> dict:
    """Write ``serving.md``, ``serving.json`` (and the PNGs) of ``commands`` into ``out_dir``; returns the paths.

    Raises:
        ValueError: a row without a string ``key`` or an integer ``concurrency``.
    """
    os.makedirs(out_dir, exist_ok=True)
    summary = summarize(commands)
    md_path = os.path.join(out_dir, "serving.md")
    with open(md_path, "w") as f:
        f.write(render_markdown(summary))
    json_path = os.path.join(out_dir, "serving.json")
    with open(json_path, "w") as f:
        json.dump(_json_summary(summary, commands), f, indent=1)
    written = {"markdown": md_path, "json": json_path, "plots": []}
    if with_plots and any(cell["n"] for cell in summary["cells"].values()):
        try:
            written["plots"] = plots(summary, out_dir)
        except ImportError as exc:  # the report stands without plots; they can be drawn later from the JSON
            written["plot_error"] = str(exc)
    return written


def write_report(rows: list[dict], meta: dict, out_dir: str, *, with_plots: bool = True) -> dict:
    """The report of one command (label: meta's ``label`` or ``run``); see :func:`write_commands`."""
    return write_commands([Command(meta.get("label") or "run", rows, meta)], out_dir, with_plots=with_plots)


def write_window(folder: str, meta: dict, out_dir: str) -> str | None:
    """``window.md`` re-rendered from ``folder``'s ``window.json`` into ``out_dir``; its path, None without one."""
    path = os.path.join(folder, "window.json")
    if not os.path.exists(path):
        return None
    import serving_window

    with open(path) as f:
        windows = json.load(f)
    titles = {key: cfg.get("title") or key for key, cfg in (meta.get("configs") or {}).items()}
    out = os.path.join(out_dir, "window.md")
    with open(out, "w") as f:
        f.write(serving_window.report(windows["rows"], titles, windows.get("missing", [])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result_dir", nargs="+", help="result folders (results.jsonl, meta.json), one per command")
    parser.add_argument("--out", default=None, help="where to write (default: the result folder; required for several)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    if len(args.result_dir) > 1 and not args.out:
        parser.error("out: required when merging several result folders")
    try:
        commands = [load_command(d) for d in args.result_dir]
    except FileNotFoundError as exc:
        parser.error(f"result_dir: {exc}")
    try:
        written = write_commands(commands, args.out or args.result_dir[0], with_plots=not args.no_plots)
    except ValueError as exc:
        parser.error(str(exc))
    if len(commands) == 1:
        window = write_window(args.result_dir[0], commands[0].meta, args.out or args.result_dir[0])
        if window:
            written["window"] = window
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
