#!/usr/bin/env bash
# Session-5 device call: memcheck smoke, then PATTERN epochs fused vs pyg,
# eager and compiled (compile=true).  Usage: bash scripts/gpu_session5_train.sh OUT
set -u
OUT=${1:?}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s); python -m pyg_dfgnn build > "$OUT/build.log" 2>&1; echo "build $(( $(date +%s)-t0 )) s"
timeout 120 compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?: $(tail -2 $OUT/memcheck.log | tr '\n' ' ')"
SKIP_DEFAULT=1 EPOCHS=3 EXTRA_RUNS='run gt_fused pattern_gt.yaml backend=fused; run gt_pyg pattern_gt.yaml backend=pyg; run gat_fused pattern_gat.yaml backend=fused; run gat_pyg pattern_gat.yaml backend=pyg; run gt_fused_compile pattern_gt.yaml backend=fused compile=true; run gat_fused_compile pattern_gat.yaml backend=fused compile=true' \
  timeout 420 bash scripts/gpu_train_check.sh "$OUT/train" 2000 2>&1 | tail -12
