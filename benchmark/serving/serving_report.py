"""Tables and plots of the serving benchmark from its result rows (``results.jsonl``).

One row per (configuration, concurrency), the fields ``bench_serving`` wrote
(``output_throughput`` tokens/s, ``mean_itl_ms``, ``p99_itl_ms``,
``accept_length``, ``completed``...) plus ``key``, ``name``, ``title`` and
``concurrency``. Writes ``serving.md``, ``serving.json`` and one PNG per metric;
the ratios of (c), (d), (e), (h) to (b) are reported, never asserted.

    python serving_report.py RESULT_DIR [--out DOCS_DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

METRICS = (  # (field, label, unit, higher is better)
    ("output_throughput", "output tokens/s", "tokens/s", True),
    ("mean_itl_ms", "mean inter-token latency", "ms", False),
    ("p99_itl_ms", "p99 inter-token latency", "ms", False),
    ("accept_length", "accept length (server average)", "tokens/round", True),
)
RATIO_KEYS = ("c", "d", "e", "i", "h")
REFERENCE_KEY = "b"


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


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def index_rows(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """``{(key, concurrency): row}``; the last row wins when a pair repeats.

    Raises:
        ValueError: a row without ``key`` or an integer ``concurrency``.
    """
    table = {}
    for i, row in enumerate(rows):
        key, conc = row.get("key"), row.get("concurrency")
        if not isinstance(key, str) or not isinstance(conc, int) or isinstance(conc, bool):
            raise ValueError(f"row {i}: needs a string 'key' and an integer 'concurrency', got {key!r}, {conc!r}")
        table[(key, conc)] = row
    return table


def ratios(table: dict, field: str = "output_throughput") -> dict[str, dict[int, float | None]]:
    """``{key: {concurrency: row[key][field] / row[b][field]}}`` for (c), (d), (e), (h); None where missing."""
    out = {}
    concs = sorted({c for _, c in table})
    for key in RATIO_KEYS:
        out[key] = {}
        for c in concs:
            num = _number((table.get((key, c)) or {}).get(field))
            den = _number((table.get((REFERENCE_KEY, c)) or {}).get(field))
            out[key][c] = num / den if num is not None and den not in (None, 0.0) else None
    return out


def _fmt(value, digits=1) -> str:
    v = _number(value)
    return "-" if v is None else f"{v:,.{digits}f}"


def markdown(table: dict, meta: dict) -> str:
    """The results as a markdown document: metadata, one table per metric, the ratio tables."""
    keys = sorted({k for k, _ in table})
    concs = sorted({c for _, c in table})
    titles = {k: (table[(k, c)].get("title") or k) for k, c in table}
    lines = ["# End-to-end serving benchmark", ""]
    for label, field in (("date (UTC)", "date_utc"), ("machine", "gpu"), ("torch", "torch_version"),
                         ("Triton", "triton_version"), ("SGLang", "sglang_version"),
                         ("sglang-detspec", "sglang_detspec_version"), ("models", "models"),
                         ("load", "load"), ("shared server flags", "server_flags")):
        if meta.get(field) is not None:
            value = meta[field]
            lines.append(f"- {label}: {json.dumps(value) if isinstance(value, (dict, list)) else value}")
    lines.append("")
    for field, label, unit, _ in METRICS:
        digits = 2 if field == "accept_length" else 1
        lines += [f"## {label} ({unit})", "", "| configuration | " + " | ".join(f"c={c}" for c in concs) + " |",
                  "|---|" + "---|" * len(concs)]
        for k in keys:
            cells = [_fmt((table.get((k, c)) or {}).get(field), digits) for c in concs]
            lines.append(f"| {titles[k]} | " + " | ".join(cells) + " |")
        lines.append("")
    for field, label in (("output_throughput", "output tokens/s"), ("mean_itl_ms", "mean inter-token latency")):
        r = ratios(table, field)
        lines += [f"## ratio to (b), {label} (measured, not asserted)", "",
                  "| configuration | " + " | ".join(f"c={c}" for c in concs) + " |", "|---|" + "---|" * len(concs)]
        for k in RATIO_KEYS:
            if any((k, c) in table for c in concs):
                lines.append(f"| {titles.get(k, k)} | " + " | ".join(_fmt(r[k][c], 3) for c in concs) + " |")
        lines.append("")
    missing = [f"({k}) c={c}" for k in keys for c in concs if (k, c) not in table]
    if missing:
        lines += ["Missing measurements: " + ", ".join(missing), ""]
    return "\n".join(lines)


def plots(table: dict, meta: dict, out_dir: str) -> list[str]:
    """One PNG per metric (x: concurrency, log scale; one line per configuration); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for k, _ in table})
    paths = []
    # One short line: the date, the first GPU's name (nvidia-smi lists one "name, memory, driver" per GPU)
    # and the versions; the full facts are in the markdown report.
    gpus = [g.split(",")[0].strip() for g in str(meta.get("gpu") or "").split(";") if g.strip()]
    used = meta.get("gpus_used") or len(gpus)
    facts = {"date_utc": str(meta.get("date_utc") or "")[:10],
             "gpu": f"{used} x {gpus[0]}" if gpus else "",
             "torch_version": f"torch {meta['torch_version']}" if meta.get("torch_version") else "",
             "triton_version": f"Triton {meta['triton_version']}" if meta.get("triton_version") else "",
             "sglang_version": f"SGLang {meta['sglang_version']}" if meta.get("sglang_version") else ""}
    stamp = ", ".join(v for v in facts.values() if v)
    for field, label, unit, _ in METRICS:
        fig, ax = plt.subplots(figsize=(8, 5))
        drawn = False
        for k in keys:
            points = sorted((c, _number(r.get(field))) for (kk, c), r in table.items() if kk == k)
            points = [(c, v) for c, v in points if v is not None]
            if not points:
                continue
            title = next(r.get("title") for (kk, _), r in table.items() if kk == k) or k
            ax.plot([c for c, _ in points], [v for _, v in points], marker="o", label=title)
            drawn = True
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(f"{label} ({unit})")
        ax.set_title(f"{label}\n{stamp}", fontsize=9)
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        path = os.path.join(out_dir, f"serving_{field}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(rows: list[dict], meta: dict, out_dir: str, *, with_plots: bool = True) -> dict:
    """Write ``serving.md``, ``serving.json`` (and the PNGs) into ``out_dir``; returns what was written."""
    os.makedirs(out_dir, exist_ok=True)
    table = index_rows(rows)
    md_path = os.path.join(out_dir, "serving.md")
    with open(md_path, "w") as f:
        f.write(markdown(table, meta))
    payload = {"meta": meta, "rows": [table[k] for k in sorted(table)],
               "ratios_to_b": {f: {k: {str(c): v for c, v in d.items()} for k, d in ratios(table, f).items()}
                               for f in ("output_throughput", "mean_itl_ms", "p99_itl_ms")}}
    json_path = os.path.join(out_dir, "serving.json")
    with open(json_path, "w") as f:
        json.dump(payload, f, indent=1)
    written = {"markdown": md_path, "json": json_path, "plots": []}
    if with_plots and table:
        try:
            written["plots"] = plots(table, meta, out_dir)
        except ImportError as exc:  # the report stands without plots; they can be drawn later from the JSON
            written["plot_error"] = str(exc)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result_dir", help="folder with results.jsonl and meta.json")
    parser.add_argument("--out", default=None, help="where to write (default: result_dir)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    rows_path = os.path.join(args.result_dir, "results.jsonl")
    if not os.path.exists(rows_path):
        parser.error(f"result_dir: no results.jsonl in {args.result_dir}")
    meta_path = os.path.join(args.result_dir, "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    try:
        written = write_report(load_rows(rows_path), meta, args.out or args.result_dir, with_plots=not args.no_plots)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
