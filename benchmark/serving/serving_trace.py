"""Summarise a torch.profiler Chrome trace of SGLang decode steps: the sampler + verify share of GPU time.

SGLang's ``/start_profile`` writes ``*.trace.json.gz`` (torch.profiler,
CPU + CUDA activities, Python stacks on by default). A GPU kernel is counted as
sampler / verify work when either

- its launch (the runtime call with the same ``correlation`` id) happened
  inside a Python frame of the sampling or verification code (this package,
  SGLang's sampler, EAGLE's draft sampling and accept/reject functions) with
  no model-forward frame (model runner, CUDA-graph replay) inside that one:
  the innermost of the two kinds decides, because SGLang's EAGLE ``verify``
  method wraps the whole target forward, which is model work; or
- its name is one of those kernels' (the plugin's Triton kernels, SGLang's
  sampling kernels): kernels replayed from a CUDA graph (the draft model's
  graph holds the draft races) launch from the replay frame, not their own.

Both attributions and their union are reported, with the top kernels, so a
reader can check the classification. Times are kernel durations (``dur``,
microseconds) summed over the trace; the step time is the span from the first
kernel start to the last kernel end divided by the number of steps.

    python serving_trace.py TRACE.json.gz [--steps N] [--out SUMMARY.txt]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import re
import sys

# Python frames (file(line): function in the stack events) of the sampling / verify code. Not
# SGLang's generic ``verify`` / ``forward_batch_generation`` frames: they enclose model forwards.
FRAME_PATTERN = re.compile(
    r"sglang_detspec/|layers/sampler\.py|speculative_sampling|tree_speculative|verify_tree_greedy"
    r"|eagle_utils\.py\(\d+\): (eagle_sample|_verify_coins|_seeded_verify_coins)\b"
    r"|spec_utils\.py\(\d+\): sample_draft_proposal",
    re.IGNORECASE,
)
# Frames of a model forward: a kernel launched inside one of these, inside a sampler frame, is model work.
MODEL_FRAME_PATTERN = re.compile(
    r"model_runner\.py\(\d+\): (forward|_forward_raw)\b|cuda_graph_runner\.py|graphs\.py\(\d+\): replay\b",
    re.IGNORECASE,
)
# Kernel names of the sampling / verify code.
KERNEL_PATTERN = re.compile(
    r"_race_argmax|_race_topk|_race_reduce|_verify_race|_verify_emit"  # this package's Triton kernels
    r"|tree_speculative_sampling|verify_tree_greedy|top_k_renorm|top_p_renorm|sampling_from_probs"
    r"|min_p_sampling|top_k_top_p|SoftMax|softmax|exponential|multinomial|argmax",
    re.IGNORECASE,
)


def load_events(path: str) -> list[dict]:
    """The ``traceEvents`` list of a (gzipped or plain) Chrome trace."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no traceEvents list")
    return events


def _is_kernel(e: dict) -> bool:
    return e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"


def summarize(events: list[dict], *, steps: int | None = None, top: int = 25) -> dict:
    """Totals and the sampler + verify share of GPU kernel time in ``events``.

    Returns a dict with ``kernel_us`` (all kernels), ``by_stack_us``,
    ``by_name_us``, ``union_us``, the three shares, ``span_us``,
    ``steps``, ``step_us`` and ``top`` (rows: name, count, total_us, by_stack, by_name).

    Raises:
        ValueError: no kernel events, or steps below 1.
    """
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    kernels = [e for e in events if _is_kernel(e)]
    if not kernels:
        raise ValueError("the trace has no GPU kernel events (was the GPU activity recorded?)")
    # Launch time and thread of every runtime call, by correlation id.
    launches = {}
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = (e.get("pid"), e.get("tid"), float(e["ts"]))
    # Sampler and model-forward frames, per thread, as sorted (start, end) intervals.
    frames = {"sampler": collections.defaultdict(list), "model": collections.defaultdict(list)}
    for e in events:
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() != "python_function":
            continue
        name = str(e.get("name", ""))
        kind = "sampler" if FRAME_PATTERN.search(name) else "model" if MODEL_FRAME_PATTERN.search(name) else None
        if kind:
            ts = float(e["ts"])
            frames[kind][(e.get("pid"), e.get("tid"))].append((ts, ts + float(e.get("dur", 0.0))))
    starts = {kind: {} for kind in frames}
    for kind, per_thread in frames.items():
        for key, spans in per_thread.items():
            spans.sort()
            starts[kind][key] = [s for s, _ in spans]

    def innermost_start(kind: str, key, ts: float) -> float | None:
        """Start of the innermost ``kind`` frame enclosing ``ts`` on thread ``key`` (None: none encloses it)."""
        spans = frames[kind].get(key)
        if not spans:
            return None
        # Frames nest: scanning back from the last start before ts, the first enclosing one is innermost.
        for j in range(bisect.bisect_right(starts[kind][key], ts) - 1, -1, -1):
            if spans[j][1] >= ts:
                return spans[j][0]
        return None

    def in_matching_frame(corr) -> bool:
        launch = launches.get(corr)
        if launch is None:
            return False
        pid, tid, ts = launch
        sampler = innermost_start("sampler", (pid, tid), ts)
        if sampler is None:
            return False
        model = innermost_start("model", (pid, tid), ts)
        # A tie (both frames start at one timestamp) cannot say which is inner: counted as model work.
        return model is None or model < sampler

    rows = collections.defaultdict(lambda: {"count": 0, "total_us": 0.0, "by_stack": 0, "by_name": False})
    total = by_stack = by_name = union = 0.0
    first, last = float("inf"), float("-inf")
    for k in kernels:
        dur = float(k.get("dur", 0.0))
        ts = float(k["ts"])
        first, last = min(first, ts), max(last, ts + dur)
        name = str(k.get("name", ""))
        stack_hit = in_matching_frame((k.get("args") or {}).get("correlation"))
        name_hit = bool(KERNEL_PATTERN.search(name))
        total += dur
        by_stack += dur if stack_hit else 0.0
        by_name += dur if name_hit else 0.0
        union += dur if (stack_hit or name_hit) else 0.0
        row = rows[name]
        row["count"] += 1
        row["total_us"] += dur
        row["by_stack"] += int(stack_hit)
        row["by_name"] = name_hit
    top_rows = sorted(({"name": n, **r} for n, r in rows.items()), key=lambda r: -r["total_us"])[:top]
    span = last - first
    return {
        "kernels": len(kernels), "kernel_us": total, "by_stack_us": by_stack, "by_name_us": by_name,
        "union_us": union, "share_by_stack": by_stack / total, "share_by_name": by_name / total,
        "share_union": union / total, "span_us": span, "steps": steps,
        "step_us": span / steps if steps else None, "kernel_us_per_step": total / steps if steps else None,
        "stack_frames_seen": sum(len(v) for v in frames["sampler"].values()), "top": top_rows,
    }


def render(summary: dict, title: str) -> str:
    """A plain-text report of :func:`summarize`'s result."""
    s = summary
    lines = [title, "",
             f"GPU kernels: {s['kernels']}, total kernel time {s['kernel_us'] / 1e3:.3f} ms, "
             f"first kernel start to last kernel end {s['span_us'] / 1e3:.3f} ms"]
    if s["steps"]:
        lines.append(f"steps: {s['steps']}, span per step {s['step_us'] / 1e3:.3f} ms, "
                     f"kernel time per step {s['kernel_us_per_step'] / 1e3:.3f} ms")
    lines += [
        f"sampler + verify share of kernel time: {100 * s['share_union']:.2f}% "
        f"(launched in a sampling/verify Python frame: {100 * s['share_by_stack']:.2f}%; "
        f"by kernel name: {100 * s['share_by_name']:.2f}%)",
        f"matching Python frames in the trace: {s['stack_frames_seen']}", "",
        f"{'total us':>10} {'count':>6} {'stack':>5} {'name':>4}  kernel",
    ]
    for r in s["top"]:
        lines.append(f"{r['total_us']:10.1f} {r['count']:6d} {r['by_stack']:5d} {'yes' if r['by_name'] else '':>4}  "
                     f"{r['name'][:140]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=None, help="decode steps the trace covers")
    parser.add_argument("--out", default=None, help="write the text summary here (default: stdout)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        summary = summarize(load_events(args.trace), steps=args.steps)
    except ValueError as exc:
        parser.error(str(exc))
    text = render(summary, args.title or f"trace: {args.trace}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
            json.dump(summary, f, indent=1)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
