#!/usr/bin/env bash
# On the H200 after the wheel install: chain EAGLE + rejection sampling + deterministic
# inference on the tiny high-acceptance pair, with CUDA graphs on and then off (and,
# with WITH_CONTROL=1, a control server without deterministic inference); each server
# runs `detspec audit --url`. Writes JSON and log tails to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200/project_env.sh || exit 1
models=/tmp/detspec-smoke-models
python3 scripts/make_tiny_models.py "$models" || exit 1
port=30000
common=(--model-path "$models/target" --speculative-algorithm EAGLE --speculative-draft-model-path "$models/eagle"
        --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4
        --speculative-use-rejection-sampling --attention-backend triton
        --skip-tokenizer-init --cuda-graph-backend-prefill disabled --mem-fraction-static 0.4
        --host 127.0.0.1 --port $port)

server_pid=""
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null' EXIT
failed=0
run_config() {  # name, seed encoding, extra server args...
  local name=$1 encoding=$2 healthy=""; shift 2
  python3 -m sglang.launch_server "${common[@]}" "$@" > "$out/server_$name.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && { healthy=1; break; }
    kill -0 "$server_pid" 2>/dev/null || break; sleep 1
  done
  if [ -z "$healthy" ]; then
    echo "server $name did not become healthy; its log ends:"; tail -n 30 "$out/server_$name.log"; failed=1
  else
    python3 -m sglang_detspec.cli.main audit --url "http://127.0.0.1:$port" --trials "${TRIALS:-24}" \
        --max-new-tokens "${MAX_NEW:-32}" --vocab-size 4096 --seed-encoding "$encoding" \
        --json "$out/audit_$name.json" > "$out/audit_$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$out/audit_$name.txt"
    # The control is expected to fail the audit (its probe varies); the others must pass.
    [ "$name" = control ] || [ $rc -eq 0 ] || failed=1
    grep -m3 "sglang-detspec" "$out/server_$name.log"
  fi
  kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""
  tail -c 20000 "$out/server_$name.log" > "$out/server_$name.tail.log"; rm -f "$out/server_$name.log"
}
# The control has no plugin active: stock SGLang admits seeds >= 2**63 only as int64 bits.
run_config cuda_graph uint64 --enable-deterministic-inference
run_config no_cuda_graph uint64 --enable-deterministic-inference --disable-cuda-graph
[ -n "${WITH_CONTROL:-}" ] && run_config control int64
python3 - "$out" <<'PY'
import json, os, sys
def probes(name):
    path = f"{sys.argv[1]}/audit_{name}.json"
    if not os.path.exists(path):
        return None
    report = json.load(open(path))
    return {tuple(t["probe_output_ids"]) for run in report["runs"].values() for t in run["trials"]}
on, off, control = probes("cuda_graph"), probes("no_cuda_graph"), probes("control")
if on is not None and off is not None:
    print(f"unique probe outputs across both servers (CUDA graphs on, then off after a restart): {len(on | off)}")
if control is not None:
    print(f"control without --enable-deterministic-inference: {len(control)} unique probe outputs")
sys.exit(0 if on is None or off is None or len(on | off) == 1 else 1)
PY
[ $? -eq 0 ] || failed=1
# Results that end up in docs/ name no machine folders.
python3 scripts/neutral_paths.py --results "$out" "$out" || echo "e2e_smoke: machine paths left in $out" >&2
exit $failed
