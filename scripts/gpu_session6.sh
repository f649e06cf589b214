#!/usr/bin/env bash
# Session 6 device call: build, CUDA tests (CUDA-graph steps first), then PATTERN
# epochs with cuda_graphs=true against the eager fused and the PyG runs.
# Usage: bash scripts/gpu_session6.sh OUTDIR [NUM_TRAIN] [PART]
#   PART=all (default) | tests | train
set -u
OUT=${1:-/tmp/s6}; NT=${2:-2000}; PART=${3:-all}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/dfgnn_cache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
python -c "import pyg_dfgnn._build as b; b.load()" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ "$PART" != train ]; then
  timeout 240 python -m pytest -q -m cuda tests/train/test_graphed.py -p no:cacheprovider \
    > "$OUT/pytest_graphed.log" 2>&1; echo "graphed tests: $(tail -1 "$OUT/pytest_graphed.log")"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/pytest_graphed.log" | head -8
  timeout 300 python -m pytest -q -m cuda tests -p no:cacheprovider \
    > "$OUT/pytest_cuda.log" 2>&1; echo "cuda tests: $(tail -1 "$OUT/pytest_cuda.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_cuda.log" | head -8
fi
if [ "$PART" != tests ]; then
  SKIP_DEFAULT=1 EXTRA_RUNS="${RUNS_S6:-
run gt_graphed pattern_gt.yaml backend=fused cuda_graphs=true
run gt_eager pattern_gt.yaml backend=fused
run gt_pyg pattern_gt.yaml backend=pyg
run gat_graphed pattern_gat.yaml backend=fused cuda_graphs=true
run gat_eager pattern_gat.yaml backend=fused
run gat_pyg pattern_gat.yaml backend=pyg
run agnn_graphed pattern_agnn.yaml backend=fused cuda_graphs=true
run agnn_pyg pattern_agnn.yaml backend=pyg
run gt_graphed_bf16 pattern_gt.yaml backend=fused cuda_graphs=true precision=bf16
run gt_pyg_bf16 pattern_gt.yaml backend=pyg precision=bf16
run gat_graphed_bf16 pattern_gat.yaml backend=fused cuda_graphs=true precision=bf16
run gat_pyg_bf16 pattern_gat.yaml backend=pyg precision=bf16
}" bash scripts/gpu_train_check.sh "$OUT" "$NT" | tee "$OUT/train_lines.txt"
  for f in /tmp/dfgnn_runs/*_graphed*.log; do grep -m1 "cuda_graphs:" "$f"; done 2>/dev/null | head -3
  cp /tmp/dfgnn_runs/*.log "$OUT/" 2>/dev/null
fi
echo "total: $(( $(date +%s) - t0 )) s"
