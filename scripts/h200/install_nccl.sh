#!/usr/bin/env bash
# On the H200, instead of remote/install.sh when the NCCL wheel was sent (pack_nccl.py):
# runs the kit's install (which builds the symbol stub against the machine's old NCCL),
# then, when the unpacked wheel's libnccl.so.2 is present, drops the stub (the empty
# /tmp/ld_preload makes env.sh preload nothing) and checks that torch loads NCCL 2.30.7
# from the wheel. If that check fails, the stub is put back and the script fails.
set -e
bash /tmp/e2e/remote/install.sh
lib=$(ls /tmp/site/nvidia/nccl/lib/libnccl.so.2 2>/dev/null || true)
if [ -z "$lib" ]; then echo "install_nccl: no NCCL wheel unpacked; the stub stays" >&2; exit 1; fi
saved=$(cat /tmp/ld_preload 2>/dev/null || true)
: > /tmp/ld_preload
. /tmp/e2e/remote/env.sh
if python3 -c "import torch, sys; v = torch.cuda.nccl.version(); print('torch', torch.__version__, 'nccl', v, 'gpus', torch.cuda.device_count()); sys.exit(0 if tuple(v)[:2] == (2, 30) else 1)"; then
  echo "install_nccl: NCCL from the wheel, symbol stub dropped"
else
  echo "$saved" > /tmp/ld_preload; echo "install_nccl: torch did not load the wheel's NCCL; stub restored" >&2; exit 1
fi
