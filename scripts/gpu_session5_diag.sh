#!/usr/bin/env bash
# Session-5 diagnostic device call: build, CUDA op tests, width A/B, step and
# host profiles.  Usage: bash scripts/gpu_session5_diag.sh OUT
set -u
OUT=${1:?}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s); python -m pyg_dfgnn build > "$OUT/build.log" 2>&1; echo "build $(( $(date +%s)-t0 )) s rc=$?"
timeout 200 python -m pytest -q -m cuda -x tests/ops -p no:cacheprovider > "$OUT/pytest_ops.log" 2>&1; echo "pytest ops rc=$?: $(tail -1 $OUT/pytest_ops.log)"
timeout 120 python scripts/width_ab.py --reps 10 > "$OUT/width_ab.log" 2>&1; echo "width_ab rc=$?"
for c in gt gat; do
  timeout 90 python scripts/profile_step.py --config configs/pattern_$c.yaml --store --ops 40 --host 30 > "$OUT/step_$c.log" 2>&1; echo "step $c rc=$?"
done
timeout 90 python scripts/host_overhead.py > "$OUT/host.log" 2>&1; echo "host rc=$?"
echo ==== ; cat "$OUT/width_ab.log"; grep -h "ms/step" "$OUT"/step_*.log; head -30 "$OUT/host.log"
