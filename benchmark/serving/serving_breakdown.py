"""Per-step GPU time by kernel class of one SGLang server at fixed concurrencies: load, profile, tables.

For one concurrency c (:func:`capture`):

1. a warm-up wave: c streamed ``/generate`` requests of ``warmup_tokens``
   new tokens (JIT compilation and allocator growth at this batch size
   happen here, not in the profile);
2. the measured wave: c requests of ``input_len`` random token ids and
   ``output_len`` new tokens (temperature 1, EOS ignored), all sent at once;
   once every request has streamed ``start_tokens`` tokens, the whole batch
   is decoding in lockstep and no prefill can interleave until the first
   request ends, so ``/start_profile`` is sent then (GPU activity only, no
   Python stacks: the trace is small and its export short) for
   ``profile_steps`` forwards;
3. the trace SGLang writes (``<dir>/<profile id>-TP-0.trace.json.gz``) is
   classified by ``serving_kernels.breakdown``: milliseconds per step of each
   kernel class and of GPU idle time (by kernel name alone over the
   ``profile_steps`` steps where the layer pattern is not found).

``start_tokens`` sets the context length the steps see (input_len +
start_tokens), ``output_len - start_tokens`` must leave more steps than
``profile_steps`` at up to four tokens a step (the chain's and the tree's
most per verify). Nothing here imports SGLang or torch: the load is plain
HTTP, so the orchestrator (``serving_run.py --breakdown``) runs it in-process.

:func:`write_breakdown` writes ``breakdown.json`` (``{"date_utc", "machine",
"rows": [{"config", "concurrency", "class", "gpu_ms_per_step"}], ...}``, the
class ``idle`` included, plus ``steps`` / ``step_ms`` per cell and the
cells that were not measured, with the reason) and ``breakdown.md``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import random
import threading
import time
import urllib.error
import urllib.request

import serving_kernels
from gpu_fit import kv_tokens

# Classes shown as their own column in breakdown.md; the rest are summed into "rest".
TABLE_CLASSES = ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down", "gemm_lm_head", "gemm_draft_fc",
                 "gemm_draft_layer", "gemm_draft_lm_head", "gemm_other", "attention", "norm", "elementwise",
                 "plugin_sampling", "plugin_verify", "plugin_draft", "sampling", "idle")
MAX_TOKENS_PER_STEP = 4  # the chain's and the tree's 3 draft steps: at most 4 tokens per verify


@dataclasses.dataclass(frozen=True)
class CaptureSettings:
    """The load and profile of one breakdown cell (see the module docstring).

    Raises ValueError naming the field and its bound when out of range, or
    when ``output_len - start_tokens`` leaves fewer than ``profile_steps + 2``
    steps at ``MAX_TOKENS_PER_STEP`` tokens a step.
    """

    input_len: int = 128
    output_len: int = 192
    start_tokens: int = 64
    warmup_tokens: int = 8
    profile_steps: int = 8
    skip_steps: int = 1
    vocab: int = 128256
    seed: int = 1
    wave_timeout_s: float = 60.0
    trace_timeout_s: float = 45.0

    def __post_init__(self):
        for name, lo, hi in (("input_len", 1, 32768), ("output_len", 2, 32768), ("start_tokens", 1, 32768),
                             ("warmup_tokens", 0, 1024), ("profile_steps", 3, 100), ("skip_steps", 0, 10),
                             ("vocab", 1000, 10_000_000)):
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"{name} must lie in [{lo}, {hi}], got {value}")
        for name in ("wave_timeout_s", "trace_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 1.0 <= value <= 3600.0):
                raise ValueError(f"{name} must lie in [1, 3600], got {value}")
        if self.skip_steps + 2 > self.profile_steps:
            raise ValueError(f"profile_steps must be >= skip_steps + 2 = {self.skip_steps + 2}, "
                             f"got {self.profile_steps}")
        room = (self.output_len - self.start_tokens) // MAX_TOKENS_PER_STEP
        if room < self.profile_steps + 2:
            raise ValueError(f"output_len - start_tokens must be >= {MAX_TOKENS_PER_STEP} x (profile_steps + 2) = "
                             f"{MAX_TOKENS_PER_STEP * (self.profile_steps + 2)} tokens, got "
                             f"{self.output_len} - {self.start_tokens}")

    def kv_tokens(self, concurrency: int) -> int:
        """KV-pool tokens one wave at ``concurrency`` holds (prompt, output and a page of slack per request)."""
        return kv_tokens(concurrency, self.input_len, self.output_len)


def parse_stream_line(line: bytes | str) -> dict | None:
    """One line of SGLang's streamed ``/generate`` answer: the JSON of a ``data:`` line, else None.

    ``data: [DONE]`` and blank or other lines give None.
    """
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    text = text.strip()
    if not text.startswith("data:"):
        return None
    body = text[5:].strip()
    if not body or body == "[DONE]":
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class Wave:
    """``concurrency`` streamed ``/generate`` requests sent at once, one thread each.

    ``tokens[i]`` is request i's completion tokens so far (SGLang's
    ``meta_info.completion_tokens`` of its last chunk); ``errors`` holds the
    failures (text).
    """

    def __init__(self, url: str, concurrency: int, *, input_len: int, output_len: int, vocab: int, seed: int):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        rng = random.Random(seed)
        # Ids away from the ends of the vocabulary, where special tokens sit.
        self.prompts = [[rng.randrange(1000, vocab - 1000) for _ in range(input_len)] for _ in range(concurrency)]
        self.url, self.output_len = url, output_len
        self.tokens = [0] * concurrency
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._one, args=(i,), daemon=True) for i in range(concurrency)]

    def _one(self, i: int) -> None:
        body = {"input_ids": self.prompts[i], "stream": True,
                "sampling_params": {"max_new_tokens": self.output_len, "temperature": 1.0, "ignore_eos": True}}
        req = urllib.request.Request(self.url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                for line in resp:
                    chunk = parse_stream_line(line)
                    if chunk is None:
                        continue
                    count = (chunk.get("meta_info") or {}).get("completion_tokens")
                    if isinstance(count, int):
                        self.tokens[i] = count
        except Exception as exc:  # reported by the caller, which stops waiting for this wave
            self.errors.append(f"request {i}: {type(exc).__name__}: {exc}")

    def start(self) -> "Wave":
        for t in self._threads:
            t.start()
        return self

    def wait_tokens(self, at_least: int, deadline: float, clock=time.monotonic) -> bool:
        """Wait until every request has streamed ``at_least`` tokens; False at ``deadline`` or on an error."""
        while clock() < deadline:
            if self.errors:
                return False
            if min(self.tokens) >= at_least:
                return True
            time.sleep(0.005)
        return False

    def join(self, deadline: float) -> bool:
        """Wait for every request to end; False when some are still running at ``deadline``."""
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)


def post_json(url: str, body: dict | None, timeout: float = 60.0) -> str:
    """POST ``body`` as JSON to ``url``; the answer's text (urllib's errors pass through)."""
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read().decode("utf-8", "replace")


def profile_request(trace_dir: str, profile_id: str, steps: int, activities: tuple[str, ...] = ("GPU",)) -> dict:
    """The ``/start_profile`` body: ``steps`` forwards from now, ``activities`` (GPU only by default: the
    kernel classes need no host events), no stacks or shapes (a small trace, a short export)."""
    return {"output_dir": trace_dir, "num_steps": steps, "activities": list(activities), "with_stack": False,
            "record_shapes": False, "profile_by_stage": False, "profile_id": profile_id}


def flush_profile(url: str, timeout: float = 30.0) -> None:
    """``/stop_profile`` where the profiled steps never came, so the next cell starts clean (errors ignored:
    a server that cannot answer fails that cell anyway); ``timeout`` in seconds."""
    try:
        post_json(url + "/stop_profile", None, timeout=timeout)
    except (urllib.error.URLError, OSError):
        pass


# A trace file that keeps its size this long and still does not parse is whole and unreadable, not being written.
UNREADABLE_AFTER_S = 5.0


def wait_trace(trace_dir: str, profile_id: str, deadline: float,
               load=None) -> tuple[str, object] | tuple[None, None]:
    """The trace SGLang exported for ``profile_id``, read by ``load`` (default :func:`trace_kernels`) once whole.

    ``(None, None)`` when none is written by ``deadline`` (monotonic seconds).

    Raises:
        RuntimeError: a trace file that kept its size for :data:`UNREADABLE_AFTER_S` s and still
            does not read (a whole file that is not a trace), naming the file and the error.
    """
    load = load or trace_kernels
    pattern = os.path.join(trace_dir, f"{profile_id}*.trace.json.gz")
    stable: dict[str, tuple[int, float]] = {}  # path -> (size, when first seen at that size)
    while time.monotonic() < deadline:
        for path in sorted(glob.glob(pattern)):
            try:
                return path, load(path)
            except (OSError, EOFError, ValueError) as exc:  # still being written, or unreadable
                size = os.path.getsize(path) if os.path.exists(path) else -1
                since = stable.get(path, (None, time.monotonic()))
                stable[path] = since = (size, since[1] if since[0] == size else time.monotonic())
                if time.monotonic() - since[1] >= UNREADABLE_AFTER_S:
                    raise RuntimeError(f"trace {path} does not read: {type(exc).__name__}: {exc}") from None
        time.sleep(0.5)
    return None, None


def trace_kernels(path: str) -> list[serving_kernels.Kernel]:
    """The GPU activities of a (gzipped) Chrome trace (ValueError when it has no event list)."""
    import serving_trace

    return serving_kernels.kernels_from_events(serving_trace.load_events(path))


def capture(url: str, trace_dir: str, profile_id: str, concurrency: int, settings: CaptureSettings,
            *, time_left_s: float) -> dict:
    """One breakdown cell: warm-up wave, measured wave with ``profile_steps`` forwards profiled, classified.

    Returns ``serving_kernels.breakdown``'s dict plus ``trace`` (path),
    ``wall_s`` and ``concurrency``.

    Raises:
        RuntimeError: a request failed, the batch never reached
            ``start_tokens`` in every request, no trace was written, or the
            time ran out (``time_left_s``); the message says which.
    """
    started = time.monotonic()
    deadline = started + time_left_s
    os.makedirs(trace_dir, exist_ok=True)
    if settings.warmup_tokens:
        warm = Wave(url, concurrency, input_len=settings.input_len, output_len=settings.warmup_tokens,
                    vocab=settings.vocab, seed=settings.seed + 1).start()
        if not warm.join(min(deadline, time.monotonic() + settings.wave_timeout_s)) or warm.errors:
            raise RuntimeError(f"warm-up wave of {concurrency} requests did not finish: "
                               f"{warm.errors[:2] or 'time limit'}")
    wave = Wave(url, concurrency, input_len=settings.input_len, output_len=settings.output_len,
                vocab=settings.vocab, seed=settings.seed).start()
    wave_deadline = min(deadline, time.monotonic() + settings.wave_timeout_s)
    if not wave.wait_tokens(settings.start_tokens, wave_deadline):
        wave.join(wave_deadline)
        raise RuntimeError(f"not every one of {concurrency} requests reached {settings.start_tokens} tokens "
                           f"(fewest {min(wave.tokens)}; a KV pool too small to hold the batch?): "
                           f"{wave.errors[:2] or 'time limit'}")
    post_json(url + "/start_profile", profile_request(trace_dir, profile_id, settings.profile_steps))
    tokens_at_start = min(wave.tokens)
    ended = wave.join(wave_deadline)
    trace, kernels = wait_trace(trace_dir, profile_id, min(deadline, time.monotonic() + settings.trace_timeout_s))
    if trace is None:
        flush_profile(url)
        raise RuntimeError(f"no trace {profile_id} within the time limit (wave ended: {ended})")
    if not ended:
        raise RuntimeError(f"the measured wave of {concurrency} requests did not end in time")
    # steps_in_trace: a trace whose layer pattern is not found is still classed by kernel name.
    result = serving_kernels.breakdown(kernels, skip_steps=settings.skip_steps, steps_in_trace=settings.profile_steps)
    result.update({"trace": trace, "wall_s": round(time.monotonic() - started, 2), "concurrency": concurrency,
                   "tokens_at_profile_start": tokens_at_start})
    return result


def cell_rows(config: str, concurrency: int, result: dict) -> list[dict]:
    """``breakdown.json`` rows of one cell: one per class of ``serving_kernels.CLASSES``, idle included.

    Each row carries the cell's ``classified_by`` (``layer_pattern``, or
    ``kernel_name`` where the layer pattern was not found and every GEMM is
    ``gemm_other``; a result without the field is by layer pattern).
    """
    how = result.get("classified_by", "layer_pattern")
    return [{"config": config, "concurrency": concurrency, "class": cls, "gpu_ms_per_step": round(ms, 5),
             "step_ms": round(result["step_ms"], 5), "steps": result["steps"], "classified_by": how}
            for cls, ms in result["gpu_ms_per_step"].items()]


def render_markdown(doc: dict) -> str:
    """``breakdown.md``: one row per (configuration, concurrency), ms per step by class, then what is missing."""
    cells = cell_table(doc)
    steps = {(r["config"], r["concurrency"]): (r["step_ms"], r.get("steps", 0)) for r in doc["rows"] if "step_ms" in r}
    by_name = {(r["config"], r["concurrency"]) for r in doc["rows"] if r.get("classified_by") == "kernel_name"}
    lines = ["# GPU time per decode / verify step by kernel class", "",
             f"- date (UTC): {doc.get('date_utc')}", f"- machine: {doc.get('machine')}"]
    for field in ("settings", "server_env", "server_args"):
        if doc.get(field):
            lines.append(f"- {field.replace('_', ' ')}: {json.dumps(doc[field])}")
    lines += ["", "Milliseconds per step (one target forward and its drafts, sampling and idle time); "
              "`rest` sums the classes without a column; `step` is the mean step period."
              + (" `*`: the layer pattern was not found, classes by kernel name only (every GEMM in "
                 "`gemm_other`; the whole trace over the profiled steps)." if by_name else ""), ""]
    head = ["config", "c", "step", *TABLE_CLASSES, "rest"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (config, conc) in sorted(cells, key=lambda k: (k[0], k[1])):
        values = cells[(config, conc)]
        rest = sum(v for c, v in values.items() if c not in TABLE_CLASSES)
        step = steps.get((config, conc), (None, 0))[0]
        mark = "*" if (config, conc) in by_name else ""
        row = [config + mark, str(conc), "-" if step is None else f"{step:.3f}",
               *(f"{values.get(c, 0.0):.3f}" for c in TABLE_CLASSES), f"{rest:.3f}"]
        lines.append("| " + " | ".join(row) + " |")
    if doc.get("missing"):
        lines += ["", "Not measured:", ""]
        lines += [f"- {m['config']} c={m['concurrency']}: {m['why']}" for m in doc["missing"]]
    if doc.get("anomalies"):
        lines += ["", "Kernel sequences that did not fit the layer pattern (their GEMMs are gemm_other):", ""]
        lines += [f"- {a['config']} c={a['concurrency']}: {a['text']}" for a in doc["anomalies"]]
    return "\n".join(lines) + "\n"


def cell_table(doc: dict) -> dict[tuple[str, int], dict[str, float]]:
    """``{(config, concurrency): {class: ms per step}}`` of ``doc``'s rows."""
    cells: dict[tuple[str, int], dict[str, float]] = {}
    for r in doc["rows"]:
        cells.setdefault((r["config"], r["concurrency"]), {})[r["class"]] = r["gpu_ms_per_step"]
    return cells


def plot(doc: dict, path: str) -> str:
    """A stacked-bar PNG of ``doc``: one panel per concurrency, one bar per configuration, ms per step by class.

    The stacks are ``TABLE_CLASSES`` (classes without one summed into
    ``rest``), idle on top, so a bar's height is the step period.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = cell_table(doc)
    concs = sorted({c for _, c in cells})
    configs = sorted({k for k, _ in cells})
    stacks = [c for c in TABLE_CLASSES if c != "idle"] + ["rest", "idle"]
    colors = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, max(1, len(concs)), figsize=(3.2 * max(1, len(concs)) + 2.5, 5), squeeze=False)
    for ax, conc in zip(axes[0], concs):
        names = [k for k in configs if (k, conc) in cells]
        bottom = [0.0] * len(names)
        for i, cls in enumerate(stacks):
            heights = []
            for k in names:
                values = cells[(k, conc)]
                heights.append(sum(v for c, v in values.items() if c not in TABLE_CLASSES) if cls == "rest"
                               else values.get(cls, 0.0))
            ax.bar(names, heights, bottom=bottom, color="lightgrey" if cls == "idle" else colors[i % len(colors)],
                   label=cls, edgecolor="white", linewidth=0.3)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_title(f"c = {conc}")
        ax.set_xlabel("configuration")
    axes[0][0].set_ylabel("ms per decode / verify step")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="center right", fontsize=7)
    fig.suptitle(f"GPU time per step by kernel class ({str(doc.get('date_utc') or '')[:10]}, "
                 f"{str(doc.get('machine') or '').split(',')[0]})", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1 - 2.2 / (3.2 * max(1, len(concs)) + 2.5), 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out: str, name: str, doc: dict, markdown: str) -> list[str]:
    """``<name>.json`` (``doc``) and ``<name>.md`` (``markdown``) into ``out`` (created); returns both paths."""
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, f"{name}.json"), os.path.join(out, f"{name}.md")]
    with open(paths[0], "w") as f:
        json.dump(doc, f, indent=1)
    with open(paths[1], "w") as f:
        f.write(markdown)
    return paths


def write_breakdown(out: str, doc: dict, *, with_plot: bool = False) -> list[str]:
    """Write ``breakdown.json`` and ``breakdown.md`` of ``doc`` into ``out``; returns the paths.

    ``doc``: ``date_utc`` (str), ``machine`` (str), ``rows`` (see
    :func:`cell_rows`), optionally ``missing`` ([{config, concurrency, why}]),
    ``anomalies`` ([{config, concurrency, text}]) and settings to record.
    ``with_plot``: also ``breakdown.png`` (:func:`plot`; skipped without matplotlib).

    Raises:
        ValueError: a row without config (str), concurrency (int), class (str)
            or a finite gpu_ms_per_step.
    """
    for i, r in enumerate(doc.get("rows", [])):
        ok = (isinstance(r.get("config"), str) and isinstance(r.get("concurrency"), int)
              and isinstance(r.get("class"), str) and isinstance(r.get("gpu_ms_per_step"), (int, float))
              and math.isfinite(r["gpu_ms_per_step"]))
        if not ok:
            raise ValueError(f"rows[{i}] needs config (str), concurrency (int), class (str) and a finite "
                             f"gpu_ms_per_step, got {r!r}")
    paths = write_report(out, "breakdown", doc, render_markdown(doc))
    if with_plot and doc["rows"]:
        try:
            paths.append(plot(doc, os.path.join(out, "breakdown.png")))
        except ImportError:  # the tables stand without the plot; it can be drawn later from the JSON
            pass
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python serving_breakdown.py breakdown.json [--out DIR]``: tables and the stacked-bar plot again."""
    import argparse

    parser = argparse.ArgumentParser(description="breakdown.md and breakdown.png from a breakdown.json")
    parser.add_argument("breakdown_json")
    parser.add_argument("--out", default=None, help="folder to write (default: the JSON's folder)")
    args = parser.parse_args(argv)
    try:
        doc = json.load(open(args.breakdown_json))
        written = write_breakdown(args.out or os.path.dirname(os.path.abspath(args.breakdown_json)), doc,
                                  with_plot=True)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"breakdown_json: {exc}")
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
