#!/usr/bin/env bash
# Session-5 device call: torch.compile without graph breaks, step level.
# Usage: bash scripts/gpu_session5_compile.sh OUT
set -u
OUT=${1:?}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s); python -m pyg_dfgnn build > "$OUT/build.log" 2>&1; echo "build $(( $(date +%s)-t0 )) s"
timeout 150 python -m pytest -q -x -p no:cacheprovider tests/nn/test_compile.py tests/train/test_compile_models.py "tests/ops/test_cuda_kernels.py::test_opcheck_graph_attention" > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?: $(tail -1 $OUT/pytest.log)"
for c in gt gat; do
  for mode in "" "--compile"; do
    timeout 200 python scripts/profile_step.py --config configs/pattern_$c.yaml --store --steps 30 $mode > "$OUT/step_${c}${mode}.log" 2>&1; echo "step $c $mode rc=$?"
  done
  timeout 100 python scripts/profile_step.py --config configs/pattern_$c.yaml --store --steps 30 --backend pyg > "$OUT/step_${c}_pyg.log" 2>&1
done
echo ====; grep -h "ms/step" "$OUT"/step_*.log; grep -h "per step" "$OUT"/step_*.log
