#!/usr/bin/env bash
# On the H200 after the wheel install (README.md here): runs end-to-end suite files of
# test/registered/e2e against real SGLang servers, the files in parallel (one pytest process
# each, one server per process at a time: the tiny models share the GPU easily, and the
# fixed KV pool of the default server flags keeps their memory profiling apart).
#
#   bash scripts/h200/run_e2e_suite.sh test/registered/e2e/test_chain_eagle.py   # about 4 min alone
#   bash scripts/h200/run_e2e_suite.sh test/registered/e2e/test_*.py              # all three, 5-6 min
#
# Arguments not ending in .py go to every pytest (e.g. -k "not concurrent").
# With sgl-kernel's FA3 library installed (pack_fa3.py) the multi-layer EAGLE servers use it
# (test/registered/e2e/_e2e.py); DETSPEC_E2E_MTP_SERVER_ARGS overrides.
# Results land in $OUT (default /tmp/detspec-out): one JSON per check, server log excerpts,
# the pytest log per file; with ARCHIVE=PATH also packed into one .tgz there, even when a
# time limit stops the run (about 30 files: easier to move as one).
# Server flags: DETSPEC_E2E_SERVER_ARGS / DETSPEC_E2E_MTP_SERVER_ARGS (test/registered/e2e/_e2e.py).
set -uo pipefail
# OUT and ARCHIVE are taken relative to the caller's folder, before the cd below.
out=$(realpath -m "${OUT:-/tmp/detspec-out}"); mkdir -p "$out"
archive=${ARCHIVE:+$(realpath -m "$ARCHIVE")}
case $archive in "$out"/*) echo "ARCHIVE must lie outside OUT ($out)" >&2; exit 2 ;; esac
files=(); args=()
for a in "$@"; do case $a in *.py|*.py::*) files+=("$a") ;; *) args+=("$a") ;; esac; done
cd "$(dirname "$0")/../.."
. /tmp/e2e/remote/env.sh
pids=()
finish() {  # stop pytest runs still going (interrupted), then pack what was written
  for pid in "${pids[@]+"${pids[@]}"}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  if [ -n "$archive" ]; then tar czf "$archive" -C "$(dirname "$out")" "$(basename "$out")"; fi
}
trap finish EXIT
[ ${#files[@]} -gt 0 ] || { echo "usage: $0 TEST_FILE... [pytest args]" >&2; exit 2; }

# SGLang's plugin loader finds entry points through dist-info metadata on sys.path, so this
# working tree is installed next to SGLang (a copy on PYTHONPATH alone would not load).
python3 -m pip install -q --no-deps --no-index --no-build-isolation --upgrade --target /tmp/site . || exit 1
export PATH=/tmp/site/bin:$PATH

# popen_launch_server runs the `sglang` console script. The wheels were unpacked with zipfile,
# which writes no console scripts, and pip --upgrade --target just replaced /tmp/site/bin with
# this package's scripts: write SGLang's own entry point (sglang.cli.main:main) as the command.
cat > /tmp/site/bin/sglang <<'PY'
#!/usr/bin/env python3
import sys

from sglang.cli.main import main

# The guard matters: SGLang starts its scheduler with multiprocessing's spawn, which re-runs
# this file as the child's main module; unguarded, each child would start a whole server.
if __name__ == "__main__":
    sys.exit(main())
PY
chmod +x /tmp/site/bin/sglang

# A run that skips everything must not pass as a GPU run.
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "run_e2e_suite: no CUDA GPU visible to torch" >&2; exit 1; }
echo "multi-layer EAGLE extra server flags: ${DETSPEC_E2E_MTP_SERVER_ARGS:-$(python3 -c \
  'import sys; sys.path.insert(0, "test/registered/e2e"); import _e2e; print(_e2e.default_mtp_server_args())')}"

# The tiny models are written once per machine and reused by the following commands; written
# here, before the parallel runs, so no two processes write the same folder.
export DETSPEC_E2E_OUT=$out DETSPEC_E2E_MODELS=${DETSPEC_E2E_MODELS:-/tmp/detspec-e2e-models}
[ -f "$DETSPEC_E2E_MODELS/.complete" ] || { python3 scripts/make_tiny_models.py "$DETSPEC_E2E_MODELS" \
  && touch "$DETSPEC_E2E_MODELS/.complete"; } || exit 1
# A healthy start takes 70-90 s on an H200. SGLang's helper retries a failed start once with
# HF_HUB_OFFLINE=0 (env.sh sets it to 1), so a start that hangs costs twice this.
export DETSPEC_E2E_LAUNCH_TIMEOUT=${DETSPEC_E2E_LAUNCH_TIMEOUT:-300}
start=$(date +%s)
for f in "${files[@]}"; do
  name=$(basename "${f%%::*}" .py)
  # --show-capture=no: the server output is in $out/server_*.log, not repeated in failure reports.
  # The time limit leaves room, inside a 600 s budget, to stop servers pytest left running.
  timeout -k 5 "${DETSPEC_E2E_COMMAND_TIMEOUT:-560}" \
    python3 -m pytest -v -p no:cacheprovider --show-capture=no "$f" ${args[@]+"${args[@]}"} > "$out/pytest_$name.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; r=$?
  echo "${files[$i]}: pytest exit $r (all runs up to this one done after $(( $(date +%s) - start )) s)"
  [ $r -eq 0 ] || rc=$r
done
pids=()
for pid_file in "$out"/server_*.pid; do  # written by the suite while a server it started runs
  [ -e "$pid_file" ] || continue
  echo "stopping the server left by pytest: $(basename "$pid_file" .pid)"
  python3 -c "import sys; from sglang.srt.utils import kill_process_tree; kill_process_tree(int(sys.argv[1]))" \
    "$(cat "$pid_file")" || true
  rm -f "$pid_file"
done
for f in "${files[@]}"; do
  name=$(basename "${f%%::*}" .py)
  echo "== $name (log: $out/pytest_$name.log)"
  grep -E "(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) +\[|^=+ .*(passed|failed|error)" "$out/pytest_$name.log" | tail -n 30
done
exit $rc
