#!/usr/bin/env bash
# session 8 device call B: build, the kernel tests, then full-size PATTERN epochs, fused (CUDA graphs)
# vs PyG, fp32 and bf16 (RUNS_S8 overrides the runs, NT the training graphs).
# Usage: bash scripts/gpu_session8_train.sh OUT
set -u
OUT=$1; NT=${NT:-10000}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=/tmp/dfgnn_cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
python -c "import pyg_dfgnn._build as b; b.load()" > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
timeout 120 python -m pytest -q -m cuda tests/ops/test_cuda_kernels.py tests/nn/test_large_logits.py tests/nn/test_fuzz.py -p no:cacheprovider > $OUT/pytest.log 2>&1
echo "tests: $(tail -1 $OUT/pytest.log) ($(( $(date +%s) - t0 )) s)"
grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -8
SKIP_DEFAULT=1 EPOCHS=3 EXTRA_RUNS="${RUNS_S8:-
run gt_g pattern_gt.yaml backend=fused cuda_graphs=true
run gt_pyg pattern_gt.yaml backend=pyg
run gtbf_g pattern_gt.yaml backend=fused cuda_graphs=true precision=bf16
run gtbf_pyg pattern_gt.yaml backend=pyg precision=bf16
run gat_g pattern_gat.yaml backend=fused cuda_graphs=true
run gat_pyg pattern_gat.yaml backend=pyg
run gatbf_g pattern_gat.yaml backend=fused cuda_graphs=true precision=bf16
run gatbf_pyg pattern_gat.yaml backend=pyg precision=bf16
run agnn_g pattern_agnn.yaml backend=fused cuda_graphs=true
run agnn_pyg pattern_agnn.yaml backend=pyg
run agnnbf_g pattern_agnn.yaml backend=fused cuda_graphs=true precision=bf16
run agnnbf_pyg pattern_agnn.yaml backend=pyg precision=bf16
}" timeout 430 bash scripts/gpu_train_check.sh "$OUT" "$NT" > "$OUT/train_lines.txt" 2>&1
python scripts/summarize_runs.py /tmp/dfgnn_runs
for f in /tmp/dfgnn_runs/*.log; do grep -H -m2 -i "error\|Traceback" "$f"; done 2>/dev/null | head -5
(cd /tmp/dfgnn_runs && tar czf "$OUT/runs.tgz" */results.json *.log)
