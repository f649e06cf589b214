#!/usr/bin/env bash
# Session-5 device call: memcheck smoke, torch.compile without graph breaks at
# the step level (eager vs compiled, fused and pyg).
# Usage: bash scripts/gpu_session5_compile.sh OUT
set -u
OUT=${1:?}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s); python -m pyg_dfgnn build > "$OUT/build.log" 2>&1; echo "build $(( $(date +%s)-t0 )) s"
timeout 100 compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?: $(tail -2 $OUT/memcheck.log | tr '\n' ' ')"
for c in gt gat; do
  for mode in "" "--compile"; do
    timeout 150 python scripts/profile_step.py --config configs/pattern_$c.yaml --store --steps 30 --ops 25 $mode > "$OUT/step_${c}${mode}.log" 2>&1; echo "step $c $mode rc=$?"
  done
done
timeout 100 python scripts/profile_step.py --config configs/pattern_gt.yaml --store --steps 30 --backend pyg > "$OUT/step_gt_pyg.log" 2>&1
echo ====; grep -h "ms/step\|graph cache\|per step:" "$OUT"/step_*.log
