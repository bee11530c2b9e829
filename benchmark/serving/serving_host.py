"""Where a serving SGLang scheduler spends its host time: py-spy samples of the scheduler process, summarised.

The GPU trace of a breakdown cell (``serving_breakdown.py``) says how long the
GPU sits idle per step; it cannot say what the host is doing meanwhile. Here
the scheduler process of the same server is sampled from outside by py-spy (a
sampling profiler that reads a running CPython's stacks through the OS, with
``--nonblocking`` so the process is never paused) while a lockstep wave of
``c`` requests decodes (:func:`capture`), and the samples are summarised
(:func:`summarize`):

- ``top_host_functions``: the Python lines holding the most samples as the
  innermost frame. A line that calls into C (``.tolist()``, ``.item()``, a
  kernel launch, a CUDA synchronisation) is charged with the C time, so a
  host-device synchronisation shows as the line that makes it;
- ``split``: the share of samples under each stage of SGLang's speculative
  worker and scheduler (:data:`STAGES`, matched on function names from the
  innermost frame outwards; ``other`` where none matches).

Nothing here imports SGLang or torch; py-spy is an executable (its wheel
carries only the binary).

    python serving_host.py summarize STACKS.txt[.gz]   # the summary of one raw py-spy recording
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time

SCHEDULER_TITLE = "sglang::scheduler"  # SGLang 0.5.23 sets this process title (setproctitle) on its scheduler

# Stages of a step, each by the SGLang function names that enter it. The innermost matching frame
# decides, so sampling inside verify counts as sampling, and a draft inside the prefill batch as draft.
STAGES = (
    ("sampling", ("eagle_sample", "sample", "_sample", "sampling_from_probs", "top_k_top_p_sampling_from_probs")),
    ("draft", ("draft", "draft_forward", "_draft_extend_for_decode", "_draft_extend_for_prefill", "draft_extend")),
    ("verify", ("verify",)),
    ("prefill/extend", ("_forward_prefill_batch", "forward_extend", "run_prefill_batch")),
    ("result processing", ("process_batch_result", "process_batch_result_decode", "process_batch_result_prefill",
                           "stream_output", "stream_output_generation")),
    ("scheduling", ("get_next_batch_to_run", "recv_requests", "process_input_requests", "update_running_batch",
                    "get_new_batch_prefill", "prepare_for_decode")),
)
_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)$")


def scheduler_pids(root_pid: int, proc: str = "/proc") -> list[int]:
    """The descendants of ``root_pid`` whose command line starts with :data:`SCHEDULER_TITLE`, sorted.

    Reads ``proc`` (the Linux process file system): a process's parent from
    ``<pid>/stat``, its title from ``<pid>/cmdline``. Processes that end while
    being read are skipped.
    """
    parent: dict[int, int] = {}
    title: dict[int, str] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat")) as f:
                stat = f.read()
            with open(os.path.join(proc, name, "cmdline"), "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        # The command name in stat is in parentheses and may hold spaces: the ppid follows its ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        parent[int(name)] = int(fields[1])
        title[int(name)] = cmd
    found = []
    for pid in parent:
        p, seen = pid, set()
        while p in parent and p not in seen and p != root_pid:
            seen.add(p)
            p = parent[p]
        if p == root_pid and pid != root_pid and title[pid].startswith(SCHEDULER_TITLE):
            found.append(pid)
    return sorted(found)


MIN_SECONDS, MAX_SECONDS = 1, 60  # py-spy records whole seconds


def recorded_seconds(seconds: float) -> int:
    """The whole seconds py-spy records for a request of ``seconds``."""
    return max(MIN_SECONDS, round(seconds))


def py_spy() -> str | None:
    """The py-spy executable on ``PATH`` or beside this interpreter (a venv's ``bin``), or None."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def record(pid: int, seconds: float, out_path: str, *, rate: int = 250, exe: str | None = None) -> str:
    """Sample process ``pid`` for ``seconds`` with py-spy; the raw (collapsed) stacks go to ``out_path``.

    ``--idle`` keeps samples of waiting threads (a wait is host time too),
    ``--threads`` puts each thread's id at the root of its stacks,
    ``--nonblocking`` never pauses the process. Returns ``out_path``.

    Raises:
        ValueError: ``seconds`` outside [0.5, 120] or ``rate`` outside [10, 2000].
        RuntimeError: no py-spy executable, or py-spy failed (its output in the message).
    """
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must lie in [{MIN_SECONDS}, {MAX_SECONDS}], got {seconds}")
    if not 10 <= rate <= 2000:
        raise ValueError(f"rate must lie in [10, 2000], got {rate}")
    exe = exe or py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not on PATH (scripts/h200/install_py_spy.sh installs it from the kit)")
    argv = [exe, "record", "--pid", str(pid), "--duration", str(recorded_seconds(seconds)), "--rate", str(rate),
            "--format", "raw", "--output", out_path, "--nonblocking", "--idle", "--threads"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0 or not os.path.exists(out_path):
        raise RuntimeError(f"py-spy record failed (rc {done.returncode}): {(done.stderr or done.stdout)[-800:]}")
    return out_path


def parse_collapsed(text: str) -> collections.Counter:
    """py-spy's raw output: ``{(frame, ...): samples}``, frames from the root (thread) to the innermost.

    Lines are ``frame;frame;...;frame COUNT``; lines that do not end in a
    count are skipped.
    """
    stacks: collections.Counter = collections.Counter()
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def short_frame(frame: str) -> str:
    """``func (/.../site-packages/sglang/srt/x.py:12)`` -> ``func (sglang/srt/x.py:12)``; other frames unchanged."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m["file"]
    for anchor in ("site-packages/", "dist-packages/", "/python/", "/benchmark/"):
        if anchor in path:
            path = path.rsplit(anchor, 1)[1]
            break
    return f"{m['func']} ({path}{':' + m['line'] if m['line'] else ''})"


def function_name(frame: str) -> str:
    """The function name of a frame (``Class.method`` keeps its last part)."""
    m = _FRAME.match(frame)
    name = m["func"] if m else frame
    return name.rsplit(".", 1)[-1]


def stage_of(stack: tuple[str, ...]) -> str:
    """The :data:`STAGES` name of the innermost frame that enters one, else ``other``."""
    for frame in reversed(stack):
        name = function_name(frame)
        for stage, names in STAGES:
            if name in names:
                return stage
    return "other"


def summarize(stacks: collections.Counter, *, top: int = 12) -> dict:
    """Summary of one recording (:func:`parse_collapsed`), over its main thread (else the one with most samples).

    Returns ``{"samples": int, "threads": {thread: samples}, "thread": str,
    "top_host_functions": [str] ("<share>% <frame>", innermost frames by
    samples, at most ``top``), "top_inclusive": [str] (functions by the
    samples of the stacks they are on), "split": {stage: share}}``; shares
    are fractions of that thread's samples.

    Raises:
        ValueError: no samples.
    """
    threads: collections.Counter = collections.Counter()
    for stack, n in stacks.items():
        threads[stack[0]] += n
    if not threads:
        raise ValueError("the recording holds no samples")
    # With --idle every thread holds a sample at every tick; SGLang's scheduler loop runs on the main thread.
    main = [t for t in threads if t.endswith(": MainThread")]
    thread = main[0] if main else threads.most_common(1)[0][0]
    total = threads[thread]
    own = {s[1:]: n for s, n in stacks.items() if s[0] == thread and len(s) > 1}
    leaf: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    split: collections.Counter = collections.Counter()
    for stack, n in own.items():
        leaf[short_frame(stack[-1])] += n
        for name in {function_name(f) for f in stack}:
            inclusive[name] += n
        split[stage_of(stack)] += n

    def share(n: int) -> float:
        return round(n / total, 4)

    return {"samples": total, "threads": dict(threads), "thread": thread,
            "top_host_functions": [f"{100 * share(n):.1f}% {f}" for f, n in leaf.most_common(top)],
            "top_inclusive": [f"{100 * share(n):.1f}% {f}" for f, n in inclusive.most_common(top)],
            "split": {stage: share(n) for stage, n in split.most_common()}}


def capture(url: str, root_pid: int, concurrency: int, out_path: str, *, seconds: float, input_len: int,
            output_len: int, start_tokens: int, vocab: int, seed: int, time_left_s: float) -> dict:
    """One host cell: a lockstep wave of ``concurrency`` requests, the scheduler sampled for ``seconds``.

    The wave (``serving_breakdown.Wave``) must keep every request decoding
    for the whole recording: ``output_len`` leaves room for it. Returns
    :func:`summarize`'s dict plus ``pid``, ``seconds``, ``stacks`` (the raw
    file) and ``tokens_during`` (the fewest tokens any request streamed while
    it was recorded: the recording saw pure decode only if the wave lasted).

    Raises:
        RuntimeError: no scheduler process below ``root_pid``, a request
            failed, the wave never reached ``start_tokens``, py-spy failed.
    """
    import serving_breakdown

    pids = scheduler_pids(root_pid)
    if not pids:
        raise RuntimeError(f"no {SCHEDULER_TITLE} process below pid {root_pid}")
    deadline = time.monotonic() + time_left_s
    wave = serving_breakdown.Wave(url, concurrency, input_len=input_len, output_len=output_len, vocab=vocab,
                                  seed=seed).start()
    if not wave.wait_tokens(start_tokens, deadline):
        wave.join(deadline)
        raise RuntimeError(f"not every one of {concurrency} requests reached {start_tokens} tokens: "
                           f"{wave.errors[:2] or 'time limit'}")
    before = min(wave.tokens)
    record(pids[0], seconds, out_path)
    during = min(wave.tokens) - before
    finished = max(wave.tokens) >= output_len
    wave.join(deadline)
    if wave.errors:
        raise RuntimeError(f"the wave failed: {wave.errors[:2]}")
    with open(out_path) as f:
        result = summarize(parse_collapsed(f.read()))
    result.update({"pid": pids[0], "seconds": recorded_seconds(seconds), "stacks": out_path,
                   "tokens_during": during, "wave_outlasted_recording": not finished})
    return result


def host_row(config: str, concurrency: int, result: dict, idle_ms_per_step: float | None,
             step_ms: float | None) -> dict:
    """A ``host.json`` row: the breakdown cell's GPU idle per step beside the host summary."""
    return {"config": config, "concurrency": concurrency,
            "idle_ms_per_step": None if idle_ms_per_step is None else round(idle_ms_per_step, 4),
            "step_ms": None if step_ms is None else round(step_ms, 4),
            "top_host_functions": result["top_host_functions"], "top_inclusive": result["top_inclusive"],
            "split": result["split"], "samples": result["samples"], "seconds": result["seconds"],
            "tokens_during": result["tokens_during"],
            # False: some request ended while sampled, so the recording also holds the idle loop after it.
            "wave_outlasted_recording": result["wave_outlasted_recording"]}


def render_markdown(doc: dict) -> str:
    """``host.md``: per (configuration, concurrency) the GPU idle per step, the stage split and the top lines."""
    lines = ["# Host time of the scheduler while the GPU waits", "",
             f"- date (UTC): {doc.get('date_utc')}", f"- machine: {doc.get('machine')}", "",
             "py-spy samples of the scheduler process (its main thread) during a lockstep decode wave; "
             "`idle` is the GPU idle time per step of the breakdown cell at the same concurrency. "
             "A line that calls into C is charged with that C time (a synchronisation shows as its caller).", ""]
    for r in sorted(doc["rows"], key=lambda r: (r["config"], r["concurrency"])):
        idle = "-" if r.get("idle_ms_per_step") is None else f"{r['idle_ms_per_step']:.3f} ms"
        split = ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["split"].items())
        ended = ("" if r.get("wave_outlasted_recording", True)
                 else " A request ended during the recording: it also holds the idle loop after that.")
        lines += [f"## ({r['config']}) c = {r['concurrency']}: GPU idle {idle} per step", "",
                  f"{r['samples']} samples in {r['seconds']} s; stages: {split}.{ended}", ""]
        lines += [f"- {f}" for f in r["top_host_functions"]]
        lines.append("")
    for m in doc.get("missing", []):
        lines.append(f"- not measured: ({m['config']}) c = {m['concurrency']}: {m['why']}")
    return "\n".join(lines) + "\n"


def write_host(out: str, doc: dict) -> list[str]:
    """``host.json`` and ``host.md`` of ``doc`` (``date_utc``, ``machine``, ``rows`` of :func:`host_row`)."""
    import serving_breakdown

    return serving_breakdown.write_report(out, "host", doc, render_markdown(doc))


def main(argv: list[str] | None = None) -> int:
    """``python serving_host.py summarize STACKS [--top N]``: the summary of one raw recording (or its ``.gz``) as JSON."""
    import argparse

    parser = argparse.ArgumentParser(description="summary of a raw py-spy recording of an SGLang scheduler")
    parser.add_argument("command", choices=["summarize"])
    parser.add_argument("stacks")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    try:
        with (gzip.open(args.stacks, "rt") if args.stacks.endswith(".gz") else open(args.stacks)) as f:
            print(json.dumps(summarize(parse_collapsed(f.read()), top=args.top), indent=1))
    except (OSError, ValueError) as exc:
        parser.error(f"stacks: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
