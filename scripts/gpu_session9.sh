#!/usr/bin/env bash
# Session 9 device calls.  Usage: bash scripts/gpu_session9.sh OUT MODE...
#   host     host time per layer call (scripts/host_overhead.py, with the profiler
#            breakdown) and the eager GT / GAT step's host ops (profile_step.py --ops)
#   floor    host time per layer call next to torch.nn.Linear's (the floor)
#   memory   where a graphed GT bf16 run's memory goes (memory_graphed.py)
#   cluster  full-size generated CLUSTER (10k training graphs), GT / GAT / AGNN,
#            fp32 and bf16, fused cuda_graphs=true vs PyG eager, 3 epochs
#   runs     the same with the run list in RUNS_S9 (one 'run LABEL CONFIG ARGS...'
#            line each, as in scripts/gpu_train_check.sh; also used in session 10)
#   shipped  the shipped CLUSTER AGNN config as a user runs it (cuda_graphs: auto, no
#            override): fused and PyG, fp32 and bf16, full size, 3 epochs; what
#            auto chose for each run
#   tests    the CUDA test suite (pytest -m cuda tests; TESTS=... narrows it)
set -u
OUT=$1; shift
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/dfgnn_cache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
python -c "import pyg_dfgnn._build as b; b.load()" > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
for mode in "$@"; do
case $mode in
floor)
  timeout 150 python scripts/host_overhead.py > $OUT/host_floor.log 2>&1
  grep -E "fused:|floor" $OUT/host_floor.log ;;
host)
  timeout 150 python scripts/host_overhead.py --profile 16 > $OUT/host.log 2>&1
  grep -E "fused:|--" $OUT/host.log
  for c in gt gat; do
    timeout 90 python scripts/profile_step.py --config configs/pattern_$c.yaml --ops 30 \
      > $OUT/step_$c.log 2>&1
    grep -E "ms/step|per step" $OUT/step_$c.log
  done ;;
memory)
  timeout 150 python scripts/memory_graphed.py configs/pattern_gt.yaml backend=fused \
    cuda_graphs=true precision=bf16 epochs=2 data.num_train=2000 data.num_val=400 \
    data.num_test=400 data.root=/tmp/dfgnn_data checkpoint.enabled=false log.progress=false \
    out_dir=/tmp/mem_gt > $OUT/memory_gt_bf16.log 2>&1
  tail -25 $OUT/memory_gt_bf16.log ;;
cluster|runs)
  SKIP_DEFAULT=1 EPOCHS=3 EXTRA_RUNS="${RUNS_S9:-
run gt_g cluster_gt.yaml backend=fused cuda_graphs=true
run gt_pyg cluster_gt.yaml backend=pyg
run gtbf_g cluster_gt.yaml backend=fused cuda_graphs=true precision=bf16
run gtbf_pyg cluster_gt.yaml backend=pyg precision=bf16
run gat_g cluster_gat.yaml backend=fused cuda_graphs=true
run gat_pyg cluster_gat.yaml backend=pyg
run gatbf_g cluster_gat.yaml backend=fused cuda_graphs=true precision=bf16
run gatbf_pyg cluster_gat.yaml backend=pyg precision=bf16
run agnn_g cluster_agnn.yaml backend=fused cuda_graphs=true
run agnn_pyg cluster_agnn.yaml backend=pyg
run agnnbf_g cluster_agnn.yaml backend=fused cuda_graphs=true precision=bf16
run agnnbf_pyg cluster_agnn.yaml backend=pyg precision=bf16
}" timeout ${CLUSTER_S:-420} bash scripts/gpu_train_check.sh "$OUT" "${NT:-10000}" > "$OUT/train_lines.txt" 2>&1
  python scripts/summarize_runs.py /tmp/dfgnn_runs
  (cd /tmp/dfgnn_runs && tar czf "$OUT/runs_$mode.tgz" */results.json *.log) ;;
shipped)
  SKIP_DEFAULT=1 EPOCHS=3 EXTRA_RUNS="
run agnn_g cluster_agnn.yaml backend=fused
run agnn_pyg cluster_agnn.yaml backend=pyg
run agnnbf_g cluster_agnn.yaml backend=fused precision=bf16
run agnnbf_pyg cluster_agnn.yaml backend=pyg precision=bf16
" timeout ${SHIPPED_S:-300} bash scripts/gpu_train_check.sh "$OUT" "${NT:-10000}" > "$OUT/train_lines.txt" 2>&1
  python scripts/summarize_runs.py /tmp/dfgnn_runs
  grep -H "cuda_graphs:" /tmp/dfgnn_runs/*.log | sed 's|/tmp/dfgnn_runs/||' | cut -c1-150
  (cd /tmp/dfgnn_runs && tar czf "$OUT/runs_shipped.tgz" */results.json *.log) ;;
tests)
  timeout 240 python -m pytest -q -m cuda ${TESTS:-tests} -p no:cacheprovider > $OUT/pytest.log 2>&1
  echo "tests: $(tail -1 $OUT/pytest.log)"
  grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head -8 ;;
esac
echo "[$mode done at $(( $(date +%s) - t0 )) s]"
done
