#!/usr/bin/env bash
# On the GPU machine after the wheel install: one tiny DeepSeek-V3 NEXTN server with tree flags (top-k 4, 8 draft
# tokens) on triton; start-up must serve it as the chain of its depth (its start-up line, /server_info), then a
# short changing-batch audit. OUT: results folder; WAIT_S: seconds to wait for /health; AUDIT_S, TRIALS: the audit.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/h200/project_env.sh || exit 1
python3 -c "import sys; sys.path.insert(0, 'scripts'); import tiny_families; tiny_families.main('/tmp/detspec-fam')" || exit 1
m=/tmp/detspec-fam/deepseek_v3
steps=3  # the tree's depth: the server must resolve top-k 1 and steps + 1 draft tokens
python3 -m sglang.launch_server --model-path $m --speculative-algorithm NEXTN --speculative-draft-model-path $m \
  --speculative-num-steps $steps --speculative-eagle-topk 4 --speculative-num-draft-tokens 8 \
  --enable-deterministic-inference --attention-backend triton --skip-tokenizer-init --mem-fraction-static 0.5 --cuda-graph-backend-prefill disabled \
  --host 127.0.0.1 --port 30000 > "$out/server.log" 2>&1 &
pid=$!
ok=""
for _ in $(seq 1 ${WAIT_S:-200}); do
  curl -sf http://127.0.0.1:30000/health >/dev/null 2>&1 && { ok=1; break; }
  kill -0 $pid 2>/dev/null || break; sleep 1
done
echo "healthy=${ok:-no} after ${SECONDS}s"
failed=1
if [ -n "$ok" ]; then
  curl -s http://127.0.0.1:30000/server_info > "$out/server_info.json"
  python3 -c "import json, sys; d=json.load(open('$out/server_info.json')); print({k: d.get(k) for k in ('speculative_eagle_topk','speculative_num_steps','speculative_num_draft_tokens','attention_backend','speculative_use_rejection_sampling')}); sys.exit(0 if (d.get('speculative_eagle_topk'), d.get('speculative_num_draft_tokens')) == (1, $steps + 1) else 1)" && failed=0
  vocab=$(python3 -c "import json; print(json.load(open('$m/config.json'))['vocab_size'])")
  timeout ${AUDIT_S:-90} python3 -m sglang_detspec.cli.main audit --url http://127.0.0.1:30000 --trials ${TRIALS:-12} \
    --max-new-tokens 32 --vocab-size $vocab --json "$out/audit.json" > "$out/audit.txt" 2>&1
  rc=$?; echo "audit rc=$rc"; [ $rc -eq 0 ] || failed=1
  tail -n 15 "$out/audit.txt"
fi
grep -n "sglang-detspec" "$out/server.log" | cut -c1-400 | head -12
grep -qF "$(python3 -c 'from sglang_detspec.sglang_plugin.startup_notes import MLA_CHAIN_LOG; print(MLA_CHAIN_LOG)')" \
  "$out/server.log" || failed=1
kill $pid 2>/dev/null; wait $pid 2>/dev/null
python3 scripts/neutral_paths.py --results "$out" "$out" >/dev/null 2>&1
exit $failed
