"""Where a serving window's wall time goes: GPU time by SGLang step stage, and GPU idle, from one trace.

The lockstep profiles (``serving_breakdown``, ``serving_host``) time decode
steps of one batch with no arrivals. Serving has arrivals: a request that
ends makes room for one that needs its prefill, so prefill (extend) steps
and the draft model's extend of the new prompts sit between decode steps.
This module reads one torch.profiler Chrome trace of N consecutive scheduler
iterations taken while ``c`` requests stay in flight (:class:`ClosedLoop`,
the load of ``bench_serving --max-concurrency``; SGLang's ``/start_profile``
with ``num_steps`` and CPU + GPU activities) and
splits the window's wall time (first GPU activity to last) into stages:

- ``prefill_extend``: target forwards of new prompts (SGLang's span
  ``step[EXTEND ...]``, also ``MIXED`` / ``SPLIT_PREFILL``);
- ``decode``: target decode forwards (no speculative decoding);
- ``verify``: target verify forwards (``step[VERIFY ...]``);
- ``draft``: the draft model proposing (SGLang's ``draft`` span, and draft
  forwards outside any draft-extend span);
- ``draft_extend``: the draft model's extend after a verify or a prefill
  (SGLang's ``draft_extend`` span);
- ``other``: GPU work launched outside those spans: the target's
  sampling, the accept walk, the plugin's verify kernel, copies between
  steps (the draft's own draws, inside its spans, count as ``draft``);
- ``idle``: no GPU activity (the GPU waiting for the host);

and, over the same wall window, the host thread that launches the forwards:
its time inside each stage's spans and outside every span (SGLang's
scheduler building batches, processing results, launching the sampling
and the accept walk, or waiting).

Method: each GPU activity (kernel, memcpy, memset) is joined to the host
call that launched it through the profiler's ``correlation`` id, and takes
the stage of the spans enclosing that launch on its thread (a spec-stage
span, ``draft`` / ``draft_extend``, wins over the step spans inside it; else
the innermost step span). CUDA-graph replays launch their kernels from the
replay call, inside the step's span. Where activities on several streams
overlap, the overlap counts once, for the first stage of :data:`STAGES`
among them, so the stages and ``idle`` add up to the window. SGLang stops
the profiler as the iteration after the last one starts, and the profiler
synchronizes the device as it stops, so every recorded iteration's GPU
work is in the trace. A trace merged over several GPUs is refused: its
correlation ids repeat across processes.

:func:`capture` takes such a trace from a running server (``serving_run.py
--window-profile``): ``c`` request slots, each sending its next request when
the last one ends (``bench_serving``'s ``--max-concurrency`` load), until
every slot has finished one request (arrivals are staggered from then on),
then ``/start_profile`` for ``steps`` scheduler iterations.

    python serving_window.py TRACE.json.gz [--out SUMMARY.md]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import random
import re
import statistics
import sys
import threading
import time

from serving_breakdown import flush_profile, post_json, profile_request, wait_trace
from serving_trace import load_events

# Stages in the order an overlap is credited to (the first one active wins), then idle.
STAGES = ("verify", "prefill_extend", "decode", "draft_extend", "draft", "other")
# SGLang's step span names (sglang.srt.utils.profile_utils.build_step_span_name): ``step[<STAGE> bs=<n>
# [toks=<n>] ...]`` where STAGE is VERIFY, DRAFT (any draft-model forward) or a ForwardMode name.
STEP_SPAN = re.compile(r"^step\[(\w+) bs=(\d+)(?: toks=(\d+))?")
# SGLang's coarse speculative stage spans (sglang.srt.speculative.spec_utils.spec_stage_span), named as the stages.
SPEC_SPANS = ("draft", "draft_extend")
STEP_STAGES = {"VERIFY": "verify", "DECODE": "decode", "IDLE": "other", "DRAFT": "draft"}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cuda_runtime", "cuda_driver")


def _span_stage(mode: str) -> str:
    # Everything else a target forward can be (EXTEND, MIXED, SPLIT_PREFILL, ...) takes new tokens: prefill.
    return STEP_STAGES.get(mode, "prefill_extend")


class _Spans:
    """The annotation spans of one thread, sorted by start, for the innermost-enclosing lookup."""

    def __init__(self):
        self.items: list[tuple[float, float, str]] = []
        self.starts: list[float] = []
        self.reach: list[float] = []  # reach[j]: the latest end among spans 0..j

    def add(self, start: float, end: float, stage: str) -> None:
        self.items.append((start, end, stage))

    def seal(self) -> None:
        # Equal starts: the longer (outer) span first, so the scan back meets the inner one first.
        self.items.sort(key=lambda it: (it[0], -it[1]))
        self.starts = [s for s, _, _ in self.items]
        reach = float("-inf")
        self.reach = []
        for _, end, _ in self.items:
            reach = max(reach, end)
            self.reach.append(reach)

    def innermost(self, ts: float) -> str | None:
        # Spans nest: scanning back from the last start at or before ts, the first that encloses ts is
        # innermost; once no span up to j reaches ts, none before it does either.
        for j in range(bisect.bisect_right(self.starts, ts) - 1, -1, -1):
            if self.reach[j] < ts:
                return None
            start, end, stage = self.items[j]
            if end >= ts:
                return stage
        return None


def summarize(events: list[dict]) -> dict:
    """The stage split of one serving window's trace (see the module docstring).

    Args:
        events: a Chrome trace's ``traceEvents`` (``serving_trace.load_events``),
            recorded with CPU and GPU activities so that launches, spans and
            GPU activities share correlation ids.

    Returns:
        ``{"window_ms", "busy_ms", "idle_ms", "stages": {stage: {"ms", "share", "activity_ms"}}``
        (``ms``: wall time credited to the stage, ``share`` of the window,
        ``activity_ms`` the stage's GPU activity durations summed, overlaps
        included), ``"idle_share"`` (of the window), ``"steps": {stage: count}``
        (spans that overlap the window: SGLang's ``draft`` / ``draft_extend``
        spans for those stages, its step spans for the target's), ``"draft_forwards"``
        (its ``step[DRAFT ...]`` spans: eager draft forwards; a CUDA-graph
        replay has none), ``"extend": {"steps", "requests", "tokens"}`` (the
        target's prefill / extend forwards; SGLang writes ``toks=`` on
        ``EXTEND`` spans only, so a ``MIXED`` forward adds no tokens), ``"extend_spans"``
        (per prefill / extend span of the host thread: ``requests``, ``tokens``,
        ``host_ms``, and the CUDA runtime / driver ``calls`` inside it with
        their ``calls_ms`` and the ``longest_call_ms`` / ``longest_call``, the
        call fields None where the thread has no such call in the trace), ``"target_forwards"``
        (prefill / extend, decode and verify forwards), ``"ms_per_target_forward"``,
        ``"unattributed"`` (GPU activities whose launch the trace lacks: ``other``),
        ``"host": {"stages_ms", "outside_spans_ms", "outside_share"}`` (over the
        same wall window, the thread holding the most spans: ms inside each
        stage's spans, and outside every span, where SGLang's scheduler builds
        batches, processes results and launches the sampling and the accept
        walk, or waits)}.

    Raises:
        ValueError: the trace has no GPU activity, GPU activity of several
            devices (a merged trace), or no SGLang step span (the CPU activity
            was not recorded).
    """
    gpu = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS]
    if not gpu:
        raise ValueError("the trace has no GPU activity (record GPU activities)")
    devices = {e.get("pid") for e in gpu}
    if len(devices) > 1:
        raise ValueError(f"the trace holds GPU activity of {len(devices)} devices ({sorted(map(str, devices))}): "
                         "summarize one rank's trace (correlation ids repeat across processes)")
    launches = {}
    runtime: dict[tuple, list] = collections.defaultdict(list)  # host thread -> CUDA runtime / driver calls
    spans: dict[tuple, _Spans] = collections.defaultdict(_Spans)
    spec: dict[tuple, _Spans] = collections.defaultdict(_Spans)
    step_rows = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        if cat in HOST_CATS:
            key = (e.get("pid"), e.get("tid"))
            runtime[key].append((float(e["ts"]), float(e.get("dur", 0.0)), str(e.get("name", ""))))
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = (key, float(e["ts"]))
        elif cat == "user_annotation":
            name = str(e.get("name", ""))
            start = float(e["ts"])
            end = start + float(e.get("dur", 0.0))
            key = (e.get("pid"), e.get("tid"))
            m = STEP_SPAN.match(name)
            if m:
                stage = _span_stage(m.group(1))
                spans[key].add(start, end, stage)
                # Draft forwards are counted apart: how many sit inside one draft or draft-extend span
                # depends on CUDA graphs (a graph replay has none), so the spec spans count those stages.
                row_stage = "draft_forward" if m.group(1) == "DRAFT" else stage
                step_rows.append((start, end, row_stage, int(m.group(2)), int(m.group(3) or 0), key))
            elif name in SPEC_SPANS:
                spec[key].add(start, end, name)
                step_rows.append((start, end, name, 0, 0, key))
    if not step_rows:
        raise ValueError("the trace has no SGLang step span (record CPU activities: spans are host events)")
    # The host side: the thread holding the most spans (the one that launches the forwards).
    host_key = max(set(spans) | set(spec), key=lambda k: len(spans[k].items) + len(spec[k].items))
    host_spans = spans[host_key].items + spec[host_key].items
    for table in (spans, spec):
        for s in table.values():
            s.seal()

    intervals = []
    unattributed = 0
    for e in gpu:
        start = float(e["ts"])
        end = start + float(e.get("dur", 0.0))
        launch = launches.get((e.get("args") or {}).get("correlation"))
        stage = "other"
        if launch is None:
            unattributed += 1
        else:
            key, ts = launch
            # A spec span (draft, draft extend) wins over the draft forwards' step spans inside it.
            stage = ((spec[key].innermost(ts) if key in spec else None)
                     or (spans[key].innermost(ts) if key in spans else None) or "other")
        intervals.append((start, end, stage))

    lo = min(s for s, _, _ in intervals)
    hi = max(e for _, e, _ in intervals)
    credited = _credit(intervals)
    activity = collections.Counter()
    for s, e, stage in intervals:
        activity[stage] += e - s
    window = hi - lo
    busy = sum(credited.values())
    # The same wall window on the host thread: time inside each kind of span (the innermost kind by
    # STAGES order, as for the GPU), and outside every span: scheduling, result processing, launches
    # of sampling and the accept walk, and waits.
    host = _credit([(max(s, lo), min(e, hi), stage) for s, e, stage in host_spans if e > lo and s < hi])
    host_in = sum(host.values())
    # Host spans run ahead of the GPU: a span counts where it overlaps the window.
    in_window = [r for r in step_rows if r[0] <= hi and r[1] >= lo]
    steps = collections.Counter(r[2] for r in in_window)
    extend = [r for r in in_window if r[2] == "prefill_extend"]
    calls = sorted(runtime[host_key]) if runtime.get(host_key) else None
    target = sum(steps[s] for s in ("prefill_extend", "decode", "verify"))
    return {
        "window_ms": window / 1e3,
        "busy_ms": busy / 1e3,
        "idle_ms": (window - busy) / 1e3,
        "stages": {stage: {"ms": credited.get(stage, 0.0) / 1e3,
                           "share": credited.get(stage, 0.0) / window if window else 0.0,
                           "activity_ms": activity.get(stage, 0.0) / 1e3} for stage in STAGES},
        "idle_share": (window - busy) / window if window else 0.0,
        "steps": {stage: steps.get(stage, 0) for stage in STAGES},
        "draft_forwards": steps.get("draft_forward", 0),
        "extend": {"steps": len(extend), "requests": sum(r[3] for r in extend), "tokens": sum(r[4] for r in extend)},
        "extend_spans": [_span_calls(r, calls) for r in extend if r[5] == host_key],
        "target_forwards": target,
        "ms_per_target_forward": window / 1e3 / target if target else None,
        "unattributed": unattributed,
        # "other" on the host: SGLang's IDLE forwards (a data-parallel rank without requests).
        "host": {"stages_ms": {stage: host.get(stage, 0.0) / 1e3 for stage in STAGES},
                 "outside_spans_ms": (window - host_in) / 1e3,
                 "outside_share": (window - host_in) / window if window else 0.0},
    }


def _span_calls(row: tuple, calls: list[tuple[float, float, str]] | None) -> dict:
    """One host span's CUDA runtime / driver calls: how much of its host time is launching, and its longest call.

    ``calls``: the host thread's ``(ts, dur, name)`` sorted by start, or None
    where the trace recorded none on that thread (the call fields are then
    None). A call counts for the part of it inside the span. Host time outside
    these calls is Python and C++ between launches; a long call is a launch
    that blocked or a synchronising copy (its name says which). A driver call
    the trace records inside a runtime call counts twice.
    """
    start, end, _, bs, toks, _ = row
    out = {"requests": bs, "tokens": toks, "host_ms": (end - start) / 1e3}
    if calls is None:
        return {**out, "calls": None, "calls_ms": None, "longest_call_ms": None, "longest_call": None}
    first = bisect.bisect_left(calls, (start,))
    # The two calls before the first start inside may reach into the span (a runtime call and a driver call in it).
    inside = [(min(ts + dur, end) - max(ts, start), name)
              for ts, dur, name in calls[max(0, first - 2):bisect.bisect_left(calls, (end,))] if ts + dur > start]
    longest = max(inside, default=(0.0, ""))
    return {**out, "calls": len(inside), "calls_ms": sum(d for d, _ in inside) / 1e3,
            "longest_call_ms": longest[0] / 1e3, "longest_call": longest[1]}


def _credit(intervals: list[tuple[float, float, str]]) -> dict[str, float]:
    """Wall time (trace units) credited per stage: each instant with activity goes to the first active stage."""
    rank = {stage: i for i, stage in enumerate(STAGES)}
    points = []
    for s, e, stage in intervals:
        if e > s:
            points.append((s, 1, stage))
            points.append((e, -1, stage))
    points.sort(key=lambda p: (p[0], p[1]))
    active = [0] * len(STAGES)
    out = collections.Counter()
    prev = None
    for t, delta, stage in points:
        if prev is not None and t > prev:
            first = next((i for i, n in enumerate(active) if n > 0), None)
            if first is not None:
                out[STAGES[first]] += t - prev
        active[rank[stage]] += delta
        prev = t
    return dict(out)


def render(summary: dict, title: str) -> str:
    """Markdown of one summary: a table by stage, then the host thread's lines.

    Per stage: ms and share of the window, span count, GPU activity and the
    host thread's time in its spans; then the host thread outside every span
    and, where the summary has them, the prefill / extend spans' CUDA runtime
    calls (:func:`summarize`'s ``extend_spans``).
    """
    lines = [f"### {title}", "",
             f"window {summary['window_ms']:.1f} ms, {summary['target_forwards']} target forwards "
             f"({summary['extend']['steps']} prefill / extend of {summary['extend']['requests']} requests, "
             f"{summary['extend']['tokens']} tokens); GPU idle {100 * summary['idle_share']:.1f}%", "",
             "| stage | ms | share | spans | GPU activity ms | host thread ms in its spans |",
             "|---|---|---|---|---|---|"]
    host = summary["host"]
    for stage in STAGES:
        row = summary["stages"][stage]
        lines.append(f"| {stage} | {row['ms']:.2f} | {100 * row['share']:.1f}% | {summary['steps'][stage]} | "
                     f"{row['activity_ms']:.2f} | {host['stages_ms'][stage]:.2f} |")
    lines.append(f"| idle | {summary['idle_ms']:.2f} | {100 * summary['idle_share']:.1f}% | | | |")
    inside = ", ".join(f"{stage} {ms:.2f}" for stage, ms in host["stages_ms"].items() if ms > 0)
    lines += ["", f"Host thread over the same window: inside spans {inside or 'none'} ms; outside every span "
                  f"{host['outside_spans_ms']:.2f} ms ({100 * host['outside_share']:.1f}%: scheduling, result "
                  "processing, sampling and accept-walk launches, waits)."]
    spans = summary.get("extend_spans") or []
    if spans:
        text = (f"Prefill / extend spans of the host thread: {len(spans)}; per span, median: "
                f"{_median(spans, 'requests'):g} requests, {_median(spans, 'tokens'):g} tokens, "
                f"{_median(spans, 'host_ms'):.2f} ms of host time")
        if spans[0]["calls"] is None:
            text += "; the trace recorded no CUDA runtime / driver call on that thread."
        else:
            longest = max(spans, key=lambda r: r["longest_call_ms"])
            text += (f", {_median(spans, 'calls'):g} CUDA runtime / driver calls taking "
                     f"{_median(spans, 'calls_ms'):.2f} ms of it; the longest call of any span "
                     f"{longest['longest_call_ms']:.2f} ms ({longest['longest_call'] or 'none'}).")
        lines += ["", text]
    if summary["unattributed"]:
        lines += ["", f"{summary['unattributed']} GPU activities had no launch in the trace (counted as other)."]
    lines += ["", "Profiled with host activities, which add host time to every launch: the idle share is above "
                  "an unprofiled run's; compare windows with each other."]
    return "\n".join(lines) + "\n"


class ClosedLoop:
    """``concurrency`` request slots, each sending its next ``/generate`` when the last one ends, until stopped.

    Requests: ``input_len`` random token ids (away from the vocabulary's ends,
    where special tokens sit), ``output_len`` new tokens, temperature 1, EOS
    ignored; slot i's first request asks ``round(output_len * (i + 1) / concurrency)``
    tokens, which staggers the arrivals that follow. ``done`` counts finished
    requests, ``slots_done`` the slots that finished their first, ``errors``
    holds failures (text; a slot stops at its first).
    """

    def __init__(self, url: str, concurrency: int, *, input_len: int, output_len: int, vocab: int, seed: int):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.url, self.input_len, self.output_len, self.vocab = url, input_len, output_len, vocab
        self.done = 0
        self.slots_done = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # Slot i's first request asks (i + 1) / c of output_len new tokens, so the slots' later requests
        # (all output_len) arrive spread over one request's length instead of as one wave.
        first_lens = [max(1, round(output_len * (i + 1) / concurrency)) for i in range(concurrency)]
        self._threads = [threading.Thread(target=self._slot, args=(random.Random(seed + i), first_lens[i]), daemon=True)
                         for i in range(concurrency)]

    def _slot(self, rng: random.Random, first_len: int) -> None:
        first = True
        while not self._stop.is_set():
            body = {"input_ids": [rng.randrange(1000, self.vocab - 1000) for _ in range(self.input_len)],
                    "sampling_params": {"max_new_tokens": first_len if first else self.output_len,
                                        "temperature": 1.0, "ignore_eos": True}}
            try:
                post_json(self.url + "/generate", body, timeout=300)
            except Exception as exc:  # any failure ends this slot and is reported: none may pass silently
                with self._lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                return
            with self._lock:
                self.done += 1
                self.slots_done += first
            first = False

    def start(self) -> "ClosedLoop":
        for t in self._threads:
            t.start()
        return self

    def stop(self, wait_s: float) -> bool:
        """No new requests; wait up to ``wait_s`` seconds for the ones in flight. False when some still run."""
        self._stop.set()
        end = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)


# The requests in flight when a window ends are waited for this long, so the next window's server runs alone.
DRAIN_S = 60.0


def capture(url: str, trace_dir: str, profile_id: str, concurrency: int, *, input_len: int, output_len: int,
            vocab: int, steps: int, seed: int = 1, time_left_s: float = 120.0) -> dict:
    """One serving window of a running server: closed-loop load, ``steps`` iterations profiled, :func:`summarize`.

    Args:
        url: the server (``http://host:port``); trace_dir: where SGLang writes the trace (made if missing);
            profile_id: the trace's name prefix (``<profile_id>-TP-0.trace.json.gz``).
        concurrency: request slots of the :class:`ClosedLoop` load; input_len / output_len: tokens per
            request; vocab: the target's vocabulary size; seed: the prompts' random seed.
        steps: scheduler iterations profiled (SGLang's ``num_steps``), in [5, 400].
        time_left_s: seconds for all of it: the load's first requests, the profile, the trace and the
            drain of the requests in flight (up to :data:`DRAIN_S`, within the same time).

    Returns the summary plus ``trace`` (path), ``concurrency``, ``iterations`` (``steps``),
    ``requests_done`` (when the profile started), ``drained`` (whether the requests in flight
    ended in time) and ``wall_s``.

    Raises:
        ValueError: ``steps`` outside [5, 400]; a whole trace without GPU activity or SGLang spans
            (:func:`summarize`).
        RuntimeError: a request failed (before or during the window), some slot did not finish its
            first request, or no readable trace came back within ``time_left_s``; the message says which.
        urllib.error.URLError: ``/start_profile`` refused.
    """
    if not 5 <= steps <= 400:
        raise ValueError(f"steps must lie in [5, 400], got {steps}")
    started = time.monotonic()
    deadline = started + time_left_s
    os.makedirs(trace_dir, exist_ok=True)
    load = ClosedLoop(url, concurrency, input_len=input_len, output_len=output_len, vocab=vocab, seed=seed).start()
    summary = None
    try:
        while load.slots_done < concurrency and not load.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        if load.errors or load.slots_done < concurrency:
            raise RuntimeError(f"not every one of the {concurrency} slots finished a request: "
                               f"{load.errors[:2] or f'{load.slots_done} had by the time limit'}")
        done_at_start = load.done
        # CPU activities too: SGLang's step spans are host events.
        post_json(url + "/start_profile", profile_request(trace_dir, profile_id, steps, ("CPU", "GPU")))
        path, events = wait_trace(trace_dir, profile_id, deadline, load=load_events)
        if path is None:
            flush_profile(url, timeout=min(30.0, max(1.0, deadline - time.monotonic())))
            raise RuntimeError(f"no trace {profile_id} within the time limit: {load.errors[:2] or 'none written'}")
        if load.errors:  # a slot that stopped during the window left fewer requests in flight than asked
            raise RuntimeError(f"a request failed during the window: {load.errors[:2]}")
        summary = summarize(events)
        summary.update({"trace": path, "concurrency": concurrency, "iterations": steps,
                        "requests_done": done_at_start})
    finally:
        drained = load.stop(min(DRAIN_S, max(1.0, deadline - time.monotonic())))
    summary.update({"drained": drained, "wall_s": round(time.monotonic() - started, 2)})
    return summary


def _median(rows: list[dict], field: str) -> float:
    return statistics.median(r[field] for r in rows)


def _extend_calls(summary: dict) -> str:
    spans = summary.get("extend_spans")
    if spans is None or (spans and spans[0]["calls"] is None):
        return "not recorded"  # a window.json from before the field, or a trace without runtime calls
    if not spans:
        return "-"
    return f"{_median(spans, 'calls'):g} / {_median(spans, 'calls_ms'):.2f} / {_median(spans, 'longest_call_ms'):.2f}"


def _per_extend(summary: dict) -> str:
    # Host time inside the prefill / extend spans against their GPU work: an eager forward's launches
    # can take longer than the kernels they launch.
    n = summary["steps"]["prefill_extend"]
    if not n:
        return "-"
    return (f"{summary['stages']['prefill_extend']['activity_ms'] / n:.2f} / "
            f"{summary['host']['stages_ms']['prefill_extend'] / n:.2f}")


def compare(rows: list[dict]) -> str:
    """Markdown tables, one per concurrency, with one column per configuration: the windows side by side.

    ``rows``: summaries of :func:`capture`, each with ``config`` (its key) and ``concurrency``. Per column:
    the window, its target forwards, ms per target forward, prefill / extend forwards (requests), each
    stage's share of the window, per prefill / extend forward its GPU activity and the host thread's time
    inside its spans, GPU idle, and the host thread's share outside every span.
    """
    out = []
    for conc in sorted({r["concurrency"] for r in rows}):
        cols = [r for r in rows if r["concurrency"] == conc]
        per_forward = ["-" if r["ms_per_target_forward"] is None else f"{r['ms_per_target_forward']:.2f}"
                       for r in cols]
        table = [("window ms", [f"{r['window_ms']:.1f}" for r in cols]),
                 ("target forwards", [str(r["target_forwards"]) for r in cols]),
                 ("ms per target forward", per_forward),
                 ("prefill / extend forwards (requests)",
                  [f"{r['extend']['steps']} ({r['extend']['requests']})" for r in cols])]
        table += [(f"{stage} share", [f"{100 * r['stages'][stage]['share']:.1f}%" for r in cols]) for stage in STAGES]
        table += [("prefill / extend ms per forward, GPU / host thread", [_per_extend(r) for r in cols]),
                  ("prefill / extend span, medians over spans: runtime calls / their ms / longest call ms",
                   [_extend_calls(r) for r in cols])]
        table += [("GPU idle", [f"{100 * r['idle_share']:.1f}%" for r in cols]),
                  ("host outside every span", [f"{100 * r['host']['outside_share']:.1f}%" for r in cols])]
        out += [f"### c = {conc}", "", "| | " + " | ".join(f"({r['config']})" for r in cols) + " |",
                "|---|" + "---|" * len(cols)]
        out += [f"| {name} | " + " | ".join(values) + " |" for name, values in table]
        out.append("")
    return "\n".join(out)


def report(rows: list[dict], titles: dict[str, str], missing: list[dict]) -> str:
    """``window.md`` of one command: :func:`compare`, then :func:`render` per window, then the windows not measured.

    ``rows`` as in ``window.json`` (summaries with ``config`` and
    ``concurrency``), ``titles`` each configuration key's title, ``missing``
    ``{"config", "concurrency", "why"}`` entries.
    """
    texts = [render(r, f"{titles.get(r['config'], r['config'])}, c = {r['concurrency']}") for r in rows]
    return ("# Serving windows: wall time by stage\n\n" + compare(rows) + "\n" + "\n".join(texts)
            + "".join(f"\n- ({m['config']}) c = {m['concurrency']}: not measured, {m['why']}" for m in missing)
            + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a torch.profiler Chrome trace (.json or .json.gz) of a serving window")
    p.add_argument("--out", default=None, help="write the Markdown table here (default: stdout)")
    p.add_argument("--json", default=None, help="also write the summary as JSON here")
    args = p.parse_args(argv)
    try:
        summary = summarize(load_events(args.trace))
    except (OSError, EOFError, ValueError) as exc:
        p.error(f"{args.trace}: {exc}")
    text = render(summary, args.trace)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
