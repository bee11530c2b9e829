"""benchmark/serving/serving_window.py: a serving window's wall time by SGLang step stage, and GPU idle."""

import contextlib
import gzip
import http.server
import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=45, suite="detspec-unit-cpu")

BENCH = Path(__file__).resolve().parents[3] / "benchmark" / "serving"
sys.path.insert(0, str(BENCH))

import serving_report  # noqa: E402
import serving_trace  # noqa: E402
import serving_window as window  # noqa: E402


def _span(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def _launch(corr, ts, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1, "pid": 7, "tid": tid,
            "args": {"correlation": corr}}


def _kernel(corr, ts, dur, name="k", stream=7):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": {"correlation": corr}}


def _window_events():
    """Host: a prefill of 2 requests, a draft extend, a draft, a verify with sampling after it. GPU: one kernel each."""
    return [
        _span("step[EXTEND bs=2 toks=256]", 0, 100), _launch(1, 10), _kernel(1, 20, 100),
        _span("draft_extend", 110, 60), _span("step[DRAFT bs=2 toks=256]", 115, 40), _launch(2, 120),
        _kernel(2, 130, 30),
        _span("draft", 180, 40), _launch(3, 185), _kernel(3, 190, 20),  # a graph replay: no step span inside
        _span("step[VERIFY bs=2]", 230, 50), _launch(4, 235), _kernel(4, 240, 60),
        _launch(5, 290), _kernel(5, 300, 10, name="sampling"),  # after the verify forward, outside every span
        _kernel(6, 320, 10),  # its launch is not in the trace
    ]


def test_stages_and_idle_add_up_to_the_window():
    s = window.summarize(_window_events())
    assert s["window_ms"] == pytest.approx(0.310)  # first GPU activity at 20 us, last ends at 330 us
    ms = {stage: round(row["ms"] * 1e3, 6) for stage, row in s["stages"].items()}
    assert ms == {"verify": 60, "prefill_extend": 100, "decode": 0, "draft_extend": 30, "draft": 20, "other": 20}
    assert s["idle_ms"] == pytest.approx(0.310 - 0.230)
    assert sum(r["share"] for r in s["stages"].values()) + s["idle_share"] == pytest.approx(1.0)
    # The draft step's kernel inside the draft-extend span counts for that span; the spec spans count the stages.
    assert s["steps"] == {"verify": 1, "prefill_extend": 1, "decode": 0, "draft_extend": 1, "draft": 1, "other": 0}
    assert s["draft_forwards"] == 1
    assert s["extend"] == {"steps": 1, "requests": 2, "tokens": 256}
    assert s["target_forwards"] == 2 and s["ms_per_target_forward"] == pytest.approx(0.155)
    assert s["unattributed"] == 1
    # Host thread over [20, 330]: EXTEND 20-100, draft extend 110-170, draft 180-220, VERIFY 230-280.
    host = {k: round(v * 1e3, 6) for k, v in s["host"]["stages_ms"].items()}
    assert host == {"verify": 50, "prefill_extend": 80, "decode": 0, "draft_extend": 60, "draft": 40, "other": 0}
    assert s["host"]["outside_spans_ms"] * 1e3 == pytest.approx(310 - 230)
    # The prefill span's CUDA runtime calls: one launch of 1 us in its 100 us of host time.
    assert s["extend_spans"] == [{"requests": 2, "tokens": 256, "host_ms": pytest.approx(0.1), "calls": 1,
                                  "calls_ms": pytest.approx(0.001), "longest_call_ms": pytest.approx(0.001),
                                  "longest_call": "cudaLaunchKernel"}]


def test_a_prefill_span_that_waits_names_its_longest_call():
    """A synchronising call inside a prefill span (no correlation, no GPU activity of its own) is its longest call."""
    sync = {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 40, "dur": 45, "pid": 7,
            "tid": 1}
    other_thread = _launch(99, 50, tid=2)  # another thread's call inside the span's time: not the span's
    s = window.summarize(_window_events() + [sync, other_thread, _kernel(99, 60, 1)])
    (span,) = s["extend_spans"]
    assert span["calls"] == 2 and span["calls_ms"] == pytest.approx(0.046)
    assert span["longest_call"] == "cudaStreamSynchronize" and span["longest_call_ms"] == pytest.approx(0.045)
    text = window.render(s, "t")
    assert ("Prefill / extend spans of the host thread: 1; per span, median: 2 requests, 256 tokens, 0.10 ms of host "
            "time, 2 CUDA runtime / driver calls taking 0.05 ms of it; the longest call of any span 0.04 ms "
            "(cudaStreamSynchronize).") in text
    md = window.compare([{"config": "d", "concurrency": 2, **s}])
    row = "| prefill / extend span, medians over spans: runtime calls / their ms / longest call ms |"
    assert f"{row} 2 / 0.05 / 0.04 |" in md


def _runtime(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def test_prefill_span_calls_count_their_part_inside_the_span():
    """Calls at the span's edges count for the part inside it; a later, shorter call is not the longest."""
    events = [
        _span("step[EXTEND bs=1 toks=128]", 100, 100), _span("step[VERIFY bs=1]", 300, 50),
        _launch(1, 305), _kernel(1, 310, 20),
        _runtime("cudaMalloc", 90, 20),  # 100-110 inside: 10 us
        {**_runtime("cudaLaunchKernel", 100, 2), "args": {"correlation": 9}}, _kernel(9, 105, 50),  # at the start
        _runtime("cudaMemcpyAsync", 120, 30),  # the longest
        _runtime("cudaEventRecord", 160, 5),
        _runtime("cudaStreamSynchronize", 195, 40),  # 195-200 inside: 5 us
        _runtime("cudaLaunchKernel", 200, 1),  # at the end: outside
        _span("step[EXTEND bs=3 toks=384]", 100, 100, tid=2), _runtime("cudaFree", 150, 49, tid=2),  # another thread
    ]
    s = window.summarize(events)
    assert s["extend"]["steps"] == 2  # both threads' prefill spans count as forwards
    (span,) = s["extend_spans"]  # only the host thread's (the one holding the most spans) is timed
    assert span["requests"] == 1 and span["calls"] == 5
    assert span["calls_ms"] == pytest.approx((10 + 2 + 30 + 5 + 5) / 1e3)
    assert span["longest_call"] == "cudaMemcpyAsync" and span["longest_call_ms"] == pytest.approx(0.030)


def test_a_trace_without_runtime_calls_says_so():
    """GPU activity joined by correlation but no runtime call on the host thread: the call fields are None."""
    gpu = {"ph": "X", "cat": "kernel", "name": "k", "ts": 20, "dur": 10, "pid": 0, "tid": 7, "args": {}}
    s = window.summarize([_span("step[EXTEND bs=2 toks=256]", 0, 100), gpu])
    assert s["extend_spans"] == [{"requests": 2, "tokens": 256, "host_ms": pytest.approx(0.1), "calls": None,
                                  "calls_ms": None, "longest_call_ms": None, "longest_call": None}]
    assert "recorded no CUDA runtime / driver call on that thread" in window.render(s, "t")
    old_row = {k: v for k, v in s.items() if k != "extend_spans"}  # window.json written before the field
    md = window.compare([{"config": "a", "concurrency": 2, **s}, {"config": "b", "concurrency": 2, **old_row}])
    row = "| prefill / extend span, medians over spans: runtime calls / their ms / longest call ms |"
    assert f"{row} not recorded | not recorded |" in md
    assert "### b, c = 2" in window.report([{"config": "b", "concurrency": 2, **old_row}], {}, [])


def test_graph_replays_copies_driver_launches_and_a_second_thread():
    """Kernels of one graph replay share its launch's correlation id; a memcpy launched through the driver
    API counts as GPU activity; the host split follows the thread that holds the most spans."""
    graph = [_span("step[VERIFY bs=8]", 0, 50), _launch(1, 5)] + [_kernel(1, 10 + 10 * i, 10) for i in range(3)]
    copy = [{"ph": "X", "cat": "cuda_driver", "name": "cuMemcpyAsync", "ts": 60, "dur": 1, "pid": 7, "tid": 1,
             "args": {"correlation": 2}},
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 70, "dur": 10, "pid": 0, "tid": 7,
             "args": {"correlation": 2}}]
    # Another thread with one short span of its own (a tokenizer-side annotation, say).
    other = [_span("step[DECODE bs=1]", 0, 5, tid=2)]
    s = window.summarize(graph + copy + other)
    assert s["stages"]["verify"]["activity_ms"] * 1e3 == pytest.approx(30)
    assert s["stages"]["other"]["activity_ms"] * 1e3 == pytest.approx(10)
    assert s["window_ms"] * 1e3 == pytest.approx(70)
    assert s["host"]["stages_ms"]["verify"] * 1e3 == pytest.approx(40)  # thread 1's span over [10, 80]
    assert s["host"]["stages_ms"]["decode"] == 0.0  # thread 2's span is not the host split's


def test_a_trace_merged_over_devices_is_refused():
    events = [_span("step[VERIFY bs=8]", 0, 50), _launch(1, 5), _kernel(1, 10, 10),
              {**_kernel(1, 30, 10), "pid": 1}]
    with pytest.raises(ValueError, match="GPU activity of 2 devices"):
        window.summarize(events)


def test_overlapping_streams_count_once_for_the_first_stage():
    """A sampling kernel on another stream under a verify forward: the overlap is the verify's, not twice."""
    events = [_span("step[VERIFY bs=4]", 0, 100), _launch(1, 1), _kernel(1, 10, 50),
              _launch(2, 150), _kernel(2, 30, 40, stream=8)]
    s = window.summarize(events)
    assert s["stages"]["verify"]["ms"] * 1e3 == pytest.approx(50)
    assert s["stages"]["other"]["ms"] * 1e3 == pytest.approx(10)  # 60..70 only
    assert s["stages"]["other"]["activity_ms"] * 1e3 == pytest.approx(40)
    assert s["idle_ms"] == pytest.approx(0.0)


def test_decode_without_speculation_and_other_prefill_modes():
    events = [_span("step[DECODE bs=8]", 0, 10), _launch(1, 1), _kernel(1, 5, 10),
              _span("step[MIXED bs=3]", 20, 10), _launch(2, 21), _kernel(2, 25, 10)]
    s = window.summarize(events)
    assert s["steps"]["decode"] == 1 and s["steps"]["prefill_extend"] == 1
    assert s["extend"] == {"steps": 1, "requests": 3, "tokens": 0}  # SGLang writes toks= on EXTEND spans only


def test_nested_spans_with_one_start_and_launches_far_from_any_span():
    """Two spans starting together: the shorter is inner. A launch after every span ends: no stage (other)."""
    events = [_span("draft_extend", 0, 100), _span("step[VERIFY bs=1]", 0, 50), _launch(1, 10), _kernel(1, 20, 5),
              _span("step[DECODE bs=1]", 200, 10), _launch(2, 205), _kernel(2, 210, 5),
              _launch(3, 500), _kernel(3, 510, 5)]
    s = window.summarize(events)
    assert s["stages"]["draft_extend"]["activity_ms"] * 1e3 == pytest.approx(5)  # the spec span wins
    assert s["stages"]["decode"]["activity_ms"] * 1e3 == pytest.approx(5)
    assert s["stages"]["other"]["activity_ms"] * 1e3 == pytest.approx(5)
    spans = window._Spans()
    for start, end, stage in ((0, 100, "outer"), (0, 50, "inner"), (200, 210, "late")):
        spans.add(start, end, stage)
    spans.seal()
    assert [spans.innermost(t) for t in (10, 60, 150, 205, 300)] == ["inner", "outer", None, "late", None]


def test_errors_name_what_the_trace_lacks():
    with pytest.raises(ValueError, match="GPU activity"):
        window.summarize([_span("step[DECODE bs=1]", 0, 1)])
    with pytest.raises(ValueError, match="CPU activities"):
        window.summarize([_launch(1, 0), _kernel(1, 1, 1)])


def test_sglang_spans_in_a_real_torch_trace(tmp_path):
    """SGLang's own span helpers under torch.profiler on the CPU: the exported names and category are what
    the summary reads (GPU activities are added beside them, launched from inside the spans' threads)."""
    from sglang.srt.speculative.spec_utils import spec_stage_span
    from sglang.srt.utils.nvtx_utils import profile_range

    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with profile_range("step[EXTEND bs=3 toks=384]"):
            x = x @ x
        with spec_stage_span("draft_extend"):
            with profile_range("step[DRAFT bs=3 toks=384]"):
                x = x @ x
        with profile_range("step[VERIFY bs=3]"):
            x = x @ x
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    events = serving_trace.load_events(str(gz))
    spans = [e for e in events if e.get("cat") == "user_annotation"]
    names = [e["name"] for e in spans]
    assert names.count("step[EXTEND bs=3 toks=384]") == 1 and "draft_extend" in names and "step[VERIFY bs=3]" in names
    # One GPU activity per span, launched at the middle of each span on the span's own thread.
    extra = []
    for corr, e in enumerate(sorted(spans, key=lambda e: e["ts"]), start=100):
        mid = float(e["ts"]) + float(e["dur"]) / 2
        extra.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": mid, "dur": 0.1,
                      "pid": e["pid"], "tid": e["tid"], "args": {"correlation": corr}})
        extra.append(_kernel(corr, mid + 1, 10))
    s = window.summarize(events + extra)
    assert s["steps"]["prefill_extend"] == 1 and s["steps"]["verify"] == 1 and s["steps"]["draft_extend"] == 1
    assert s["extend"] == {"steps": 1, "requests": 3, "tokens": 384}
    # The draft step's kernel counts for its draft-extend span: 2 kernels there (the span's and the step's).
    assert s["stages"]["draft_extend"]["activity_ms"] * 1e3 == pytest.approx(20)
    assert s["stages"]["prefill_extend"]["activity_ms"] * 1e3 == pytest.approx(10)
    assert s["stages"]["verify"]["activity_ms"] * 1e3 == pytest.approx(10)
    assert s["unattributed"] == 0


def test_cli_writes_table_and_json(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _window_events()}))
    out, js = tmp_path / "w.md", tmp_path / "w.json"
    assert window.main([str(path), "--out", str(out), "--json", str(js)]) == 0
    text = out.read_text()
    assert "| prefill_extend | 0.10 |" in text and "| idle |" in text and "no launch in the trace" in text
    # The host thread's time inside the stage's spans beside its GPU work (EXTEND 20-100 us on the host).
    assert "| prefill_extend | 0.10 | 32.3% | 1 | 0.10 | 0.08 |" in text
    assert json.loads(js.read_text())["target_forwards"] == 2


def test_report_of_windows_without_prefills_calls_or_titles():
    """report(): a window without prefill spans or runtime calls shows "-", a key without a title names itself."""
    s = window.summarize([_span("step[VERIFY bs=2]", 0, 50), _launch(1, 5), _kernel(1, 10, 30)])
    assert s["extend"]["steps"] == 0 and s["extend_spans"] == []
    md = window.report([{"config": "z", "concurrency": 4, **s}], {}, [{"config": "y", "concurrency": 4, "why": "w"}])
    assert "| prefill / extend ms per forward, GPU / host thread | - |" in md
    assert "| prefill / extend span, medians over spans: runtime calls / their ms / longest call ms | - |" in md
    assert "### z, c = 4" in md and "Prefill / extend spans" not in md and md.endswith("- (y) c = 4: not measured, w\n")


def test_report_regenerates_only_where_a_window_json_is(tmp_path):
    """serving_report.write_window: no window.json, nothing written; one without "missing" or titles renders."""
    assert serving_report.write_window(str(tmp_path), {}, str(tmp_path)) is None
    assert not (tmp_path / "window.md").exists()
    s = window.summarize(_window_events())
    (tmp_path / "window.json").write_text(json.dumps({"rows": [{"config": "d", "concurrency": 2, **s}]}))
    out = serving_report.write_window(str(tmp_path), {"configs": {"d": {"title": "(d) chain"}}}, str(tmp_path))
    assert out == str(tmp_path / "window.md")
    assert "### (d) chain, c = 2" in (tmp_path / "window.md").read_text()


def test_profile_body_asks_sglang_for_host_and_gpu_activities():
    """The window's /start_profile body builds SGLang's own ProfileReq, CPU activities included (spans)."""
    import pydantic
    import serving_breakdown
    from sglang.srt.managers.io_struct import ProfileReq

    body = serving_breakdown.profile_request("traces", "w", 40, ("CPU", "GPU"))
    req = pydantic.TypeAdapter(ProfileReq).validate_python(body)
    assert req.activities == ["CPU", "GPU"] and req.num_steps == 40 and req.profile_by_stage is False


class _StandIn(http.server.BaseHTTPRequestHandler):
    """A stand-in for a server's HTTP routes (no SGLang server runs on a CPU): /generate answers after 5 ms,
    /start_profile writes a trace of _window_events() where SGLang would."""

    generated = 0
    lengths: list = []
    profiling = False
    fail_while_profiling = False

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        if self.path == "/generate":
            assert len(body["input_ids"]) == 16
            type(self).lengths.append(body["sampling_params"]["max_new_tokens"])
            if type(self).profiling and type(self).fail_while_profiling:
                self.send_error(500)
                return
            time.sleep(0.005 * body["sampling_params"]["max_new_tokens"])
            type(self).generated += 1
        elif self.path == "/start_profile":
            type(self).profiling = True
            time.sleep(0.1)  # the window's iterations run while requests keep arriving
            assert body["activities"] == ["CPU", "GPU"] and body["num_steps"] == 40
            path = Path(body["output_dir"]) / f"{body['profile_id']}-TP-0.trace.json.gz"
            path.write_bytes(gzip.compress(json.dumps({"traceEvents": _window_events()}).encode()))
        out = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@contextlib.contextmanager
def _stand_in(fail_while_profiling=False):
    """_StandIn served on a free port for the block; yields its URL."""
    _StandIn.lengths, _StandIn.profiling, _StandIn.fail_while_profiling = [], False, fail_while_profiling
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        _StandIn.fail_while_profiling = False


def test_capture_loads_the_server_then_profiles_a_window(tmp_path):
    with _stand_in() as url:
        got = window.capture(url, str(tmp_path), "pid1", 4, input_len=16, output_len=4, vocab=5000, steps=40,
                             time_left_s=30)
    assert got["requests_done"] >= 4 and got["concurrency"] == 4 and got["target_forwards"] == 2
    assert got["trace"].endswith("pid1-TP-0.trace.json.gz") and _StandIn.generated >= got["requests_done"]
    assert got["drained"] is True and got["iterations"] == 40 and got["steps"]["verify"] == 1
    # The slots' first requests ask 1..4 of the 4 new tokens (staggered arrivals), every later one all 4.
    assert sorted(_StandIn.lengths[:4]) == [1, 2, 3, 4] and set(_StandIn.lengths[4:]) == {4}
    with pytest.raises(ValueError, match="steps must lie in"):
        window.capture("http://127.0.0.1:1", str(tmp_path), "p", 1, input_len=1, output_len=1, vocab=5000, steps=4)
    with pytest.raises(RuntimeError, match="not every one of the 2 slots finished a request"):
        window.capture("http://127.0.0.1:9", str(tmp_path), "p", 2, input_len=4, output_len=1, vocab=5000,
                       steps=40, time_left_s=5)


def test_a_request_failing_during_the_window_fails_the_window(tmp_path):
    with _stand_in(fail_while_profiling=True) as url:
        with pytest.raises(RuntimeError, match="a request failed during the window"):
            window.capture(url, str(tmp_path), "pid2", 2, input_len=16, output_len=4, vocab=5000, steps=40,
                           time_left_s=30)


def test_cli_names_the_file_it_cannot_read(tmp_path, capsys):
    with pytest.raises(SystemExit):
        window.main([str(tmp_path / "absent.json.gz")])
    assert "absent.json.gz" in capsys.readouterr().err


def test_a_whole_file_that_is_not_a_trace_fails_at_once(tmp_path, monkeypatch):
    """A trace file that keeps its size and does not parse is reported, not waited on until the deadline."""
    import serving_breakdown

    monkeypatch.setattr(serving_breakdown, "UNREADABLE_AFTER_S", 0.6)
    (tmp_path / "p-TP-0.trace.json.gz").write_bytes(gzip.compress(b"{not json"))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="p-TP-0.trace.json.gz does not read"):
        serving_breakdown.wait_trace(str(tmp_path), "p", started + 30, load=serving_trace.load_events)
    assert time.monotonic() - started < 10
    assert serving_breakdown.wait_trace(str(tmp_path), "absent", time.monotonic() + 0.6) == (None, None)


def test_window_profile_flags_are_checked_where_serving_run_reads_them(monkeypatch):
    import serving_run as run

    monkeypatch.setattr(run, "gpu_memory_gib", lambda: None)  # as on a machine whose GPU memory is unknown

    def plan(*extra):
        args = run.build_parser().parse_args(["--out", "x", "--models", "m", "--gpus", "1", "--configs", "ad",
                                              "--concurrency", "8,32", *extra])
        return run.validate(args)

    assert plan("--interleave", "--window-profile", "32")["window_concs"] == [32]
    assert plan("--interleave")["window_concs"] == []
    for extra, match in ((("--window-profile", "32"), "only with --interleave"),
                         (("--interleave", "--window-profile", "64"), r"\[64\] not in concurrency"),
                         (("--interleave", "--window-profile", "32", "--window-steps", "4"), "window_steps")):
        with pytest.raises(ValueError, match=match):
            plan(*extra)


def _write_window_trace(path, num_steps):
    """What the stand-in server writes on /start_profile (test_serving_bench.BREAKDOWN_STAND_IN's trace-writer=)."""
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": _window_events()}, f)


def test_orchestrator_profiles_a_window_per_server_after_the_rounds(tmp_path, monkeypatch):
    """serving_run --interleave --window-profile end to end: stand-in servers (no SGLang server runs on a
    CPU) that stream /generate and write _window_events() on /start_profile; window.json / .md per server."""
    import serving_run as run
    import test_serving_bench as tsb

    monkeypatch.setattr(run, "gpu_memory_gib", lambda: None)
    monkeypatch.setattr(run, "WINDOW_TRACES", str(tmp_path / "traces"))
    writer = "trace-writer=test_serving_window:_write_window_trace"
    model_dir, _ = tsb._stand_in_servers(tmp_path, monkeypatch, tsb.BREAKDOWN_STAND_IN,
                                         extra_argv=[str(Path(__file__).parent), writer])
    out = tmp_path / "out"
    rc = run.main(["--out", str(out), "--models", str(model_dir), "--interleave", "--configs", "da",
                   "--concurrency", "2", "--input-len", "8", "--output-len", "4", "--rounds", "1",
                   "--max-total-tokens", "1024", "--gpus", "1", "--budget-s", "300", "--port-base", "34800",
                   "--min-seconds", "0", "--alternations", "1", "--window-profile", "2", "--sleep-on-idle"])
    assert rc == 0
    js = json.loads((out / "window.json").read_text())
    assert [(r["config"], r["concurrency"]) for r in js["rows"]] == [("d", 2), ("a", 2)] and js["missing"] == []
    assert all(r["trace"].endswith("-TP-0.trace.json.gz") and "/" not in r["trace"] for r in js["rows"])
    md = (out / "window.md").read_text()
    assert "(d) EAGLE chain, plugin coupled, c = 2" in md and "| verify | 0.06 |" in md
    # The side-by-side table first: one column per server, the same trace so the same figures.
    per_forward = f"{0.310 / 2:.2f}"  # _window_events(): a 310 us window, 2 target forwards
    assert "### c = 2\n\n| | (d) | (a) |" in md and f"| ms per target forward | {per_forward} | {per_forward} |" in md
    assert "| GPU idle | 25.8% | 25.8% |" in md
    assert "| prefill / extend ms per forward, GPU / host thread | 0.10 / 0.08 | 0.10 / 0.08 |" in md
    meta = json.loads((out / "meta.json").read_text())
    assert meta["every_server_args"] == ["--sleep-on-idle"] and meta["prefill_cuda_graphs"] is True
    # The report regenerated from the folder renders the same window.md from window.json.
    (out / "window.md").unlink()
    assert serving_report.main([str(out), "--no-plots"]) == 0
    assert (out / "window.md").read_text() == md


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
