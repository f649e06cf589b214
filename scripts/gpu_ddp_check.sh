#!/usr/bin/env bash
# Issue 13: 2-GPU DDP sampled training against one GPU, in one device call on a
# machine with >= 2 GPUs.  configs/powerlaw_gat_sampled.yaml (2M nodes / 40M
# edges, 3-layer GAT 4 x 64, fan-out [15, 10, 5], 1024 seeds per step and
# rank), 2 epochs capped at STEPS steps each, evaluation skipped to the last
# epoch; throughput = seeds per second in epoch 2 after its first batch.
# Usage: bash scripts/gpu_ddp_check.sh OUTDIR [NPROC] [STEPS]
set -u
OUT=${1:?usage: gpu_ddp_check.sh OUTDIR [NPROC] [STEPS]}; NP=${2:-2}; STEPS=${3:-60}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/dfgnn_cache}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python -m pyg_dfgnn build > "$OUT/build.log" 2>&1 || { tail "$OUT/build.log"; exit 1; }
COMMON="configs/powerlaw_gat_sampled.yaml epochs=2 max_steps_per_epoch=$STEPS data.root=/tmp/ddp_data data.eval=sampled eval_test_every=0 checkpoint.enabled=false"
run() {  # label nproc
  local label=$1 np=$2
  if [ "$np" = 1 ]; then
    timeout 280 python -m pyg_dfgnn train $COMMON out_dir=/tmp/ddp_runs/$label > "$OUT/$label.log" 2>&1
  else
    timeout 280 torchrun --standalone --nproc-per-node="$np" -m pyg_dfgnn train $COMMON \
      out_dir=/tmp/ddp_runs/$label > "$OUT/$label.log" 2>&1
  fi
  echo "$label: exit $?"
}
run gpu1 1
run gpu$NP "$NP"
python - "$NP" <<'PY'
import json, sys
np_ = int(sys.argv[1])
res = {}
for label, ranks in (("gpu1", 1), (f"gpu{np_}", np_)):
    try:
        r = json.load(open(f"/tmp/ddp_runs/{label}/results.json"))
    except OSError:
        print(f"{label}: no results"); continue
    h = r["history"][-1]
    t = h["train_time_s"] - (h.get("first_batch_s") or 0.0)
    steps = h["steps"]
    seeds = steps * r["config"]["batch_size"] * ranks if "config" in r else steps * 1024 * ranks
    res[label] = seeds / t
    print(f"{label}: {ranks} rank(s), epoch 2: {steps} steps in {t:.2f}s after the first batch "
          f"-> {seeds / t:,.0f} seeds/s ({1e3 * t / steps:.1f} ms/step)")
if len(res) == 2:
    print(f"throughput {np_} GPUs / 1 GPU: {res[f'gpu{np_}'] / res['gpu1']:.2f}x")
PY
