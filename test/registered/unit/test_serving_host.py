"""Host profile of the serving benchmark (benchmark/serving/serving_host.py): py-spy samples, summaries, host.json."""

import json
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

BENCH = Path(__file__).resolve().parents[3] / "benchmark" / "serving"
sys.path.insert(0, str(BENCH))

import serving_host as host  # noqa: E402
import serving_run as run  # noqa: E402

# Lines as py-spy 0.4 writes them with --format raw --threads (root first, count last).
RAW = """\
thread (101): MainThread;event_loop_overlap (sglang/srt/managers/scheduler.py:1200);run_batch (sglang/srt/managers/scheduler.py:2300);forward_batch_generation (/x/site-packages/sglang/srt/speculative/eagle_worker_v2.py:1500);verify (/x/site-packages/sglang/srt/speculative/eagle_worker_v2.py:2000);eagle_sample (/x/site-packages/sglang/srt/speculative/eagle_utils.py:90) 30
thread (101): MainThread;event_loop_overlap (sglang/srt/managers/scheduler.py:1200);run_batch (sglang/srt/managers/scheduler.py:2300);forward_batch_generation (/x/site-packages/sglang/srt/speculative/eagle_worker_v2.py:1500);verify (/x/site-packages/sglang/srt/speculative/eagle_worker_v2.py:2010) 50
thread (101): MainThread;event_loop_overlap (sglang/srt/managers/scheduler.py:1200);process_batch_result (sglang/srt/managers/scheduler.py:2400) 15
thread (101): MainThread;event_loop_overlap (sglang/srt/managers/scheduler.py:1210) 5
thread (202): watchdog;sleep (threading.py:10) 700
not a sample line
"""


def test_parse_and_summarize_a_recording():
    stacks = host.parse_collapsed(RAW)
    assert sum(stacks.values()) == 800 and len(stacks) == 5
    s = host.summarize(stacks, top=3)
    assert s["thread"] == "thread (101): MainThread" and s["samples"] == 100
    # The main thread, although the (idle) watchdog holds more samples.
    assert s["threads"] == {"thread (101): MainThread": 100, "thread (202): watchdog": 700}
    # Innermost frames by samples, paths cut after site-packages.
    assert s["top_host_functions"] == ["50.0% verify (sglang/srt/speculative/eagle_worker_v2.py:2010)",
                                       "30.0% eagle_sample (sglang/srt/speculative/eagle_utils.py:90)",
                                       "15.0% process_batch_result (sglang/srt/managers/scheduler.py:2400)"]
    # The innermost stage decides: eagle_sample inside verify counts as sampling.
    assert s["split"] == {"verify": 0.5, "sampling": 0.3, "result processing": 0.15, "other": 0.05}
    assert s["top_inclusive"][0] == "100.0% event_loop_overlap"
    with pytest.raises(ValueError, match="no samples"):
        host.summarize(host.parse_collapsed("garbage\n"))


def test_frame_helpers():
    assert host.short_frame("f (/a/b/site-packages/sglang/x.py:3)") == "f (sglang/x.py:3)"
    assert host.short_frame("thread (1): MainThread") == "thread (1): MainThread"
    assert host.function_name("Scheduler.run_batch (sglang/x.py:3)") == "run_batch"
    assert host.stage_of(("thread (1)", "draft_forward (x.py:1)", "sample (y.py:2)")) == "sampling"
    assert host.stage_of(("thread (1)", "anything (x.py:1)")) == "other"


def test_record_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"seconds must lie in \[1, 60\], got 0.1"):
        host.record(1, 0.1, str(tmp_path / "s.txt"))
    with pytest.raises(ValueError, match=r"rate must lie in \[10, 2000\], got 5"):
        host.record(1, 1.0, str(tmp_path / "s.txt"), rate=5)
    with pytest.raises(RuntimeError, match="py-spy record failed"):
        host.record(2**22 + 12345, 1.0, str(tmp_path / "s.txt"), exe=host.py_spy() or "false")


def test_host_options_are_checked():
    parser = run.build_parser()
    base = ["--out", "o", "--models", "m", "--gpus", "1", "--max-servers-per-gpu", "5"]
    with pytest.raises(ValueError, match="host_profile: only with --breakdown"):
        run.validate(parser.parse_args(base + ["--host-profile", "1"]))
    with pytest.raises(ValueError, match=r"host_profile: \[2\] not in concurrency"):
        run.validate(parser.parse_args(base + ["--breakdown", "--host-profile", "1,2"]))
    with pytest.raises(ValueError, match=r"host_output_len must lie in \[256, 32768\], got 10"):
        run.validate(parser.parse_args(base + ["--breakdown", "--host-profile", "1", "--host-output-len", "10"]))
    plan = run.validate(parser.parse_args(base + ["--breakdown", "--host-profile", "1,8"]))
    assert plan["host_concs"] == [1, 8]


# A stand-in server (SGLang needs a GPU): streams /generate, writes a trace on /start_profile, and
# has a child process titled as SGLang's scheduler that spends its time in a function named verify.
SPINNER = """
import setproctitle, time
setproctitle.setproctitle("sglang::scheduler_TP0")
def verify():
    while True:
        sum(range(2000))
verify()
"""
STAND_IN = """
import subprocess, sys
sys.path.insert(0, sys.argv[3])
import test_serving_bench as t
subprocess.Popen([sys.executable, "-c", sys.argv[4]])
exec(t.BREAKDOWN_STAND_IN)
"""


@pytest.mark.skipif(host.py_spy() is None, reason="py-spy is not installed (the bench extra installs it)")
def test_breakdown_with_host_profile_samples_the_scheduler(tmp_path, monkeypatch):
    from test_serving_bench import stand_in_servers

    model_dir = stand_in_servers(tmp_path, monkeypatch, STAND_IN, SPINNER)
    out = tmp_path / "out"
    rc = run.main(["--out", str(out), "--models", str(model_dir), "--breakdown", "--configs", "e",
                   "--concurrency", "1", "--host-profile", "1", "--host-seconds", "1", "--host-output-len", "600",
                   "--input-len", "8", "--max-total-tokens", "4096", "--gpus", "1", "--budget-s", "200",
                   "--port-base", "34700"])
    assert rc == 0
    doc = json.loads((out / "host.json").read_text())
    assert set(doc) >= {"date_utc", "machine", "rows"} and not doc["missing"], doc.get("missing")
    (row,) = doc["rows"]
    assert row["config"] == "e" and row["concurrency"] == 1 and row["idle_ms_per_step"] > 0
    assert row["samples"] > 20 and row["split"].get("verify", 0) > 0.8
    assert "verify (" in row["top_host_functions"][0]
    assert row["seconds"] == 1 and isinstance(row["wave_outlasted_recording"], bool)
    assert "(e) c = 1" in (out / "host.md").read_text()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
