#!/usr/bin/env bash
# Session 7 device call: build, then the parts asked for (space-separated):
#   tests    - the float64-reference kernel/shape tests and the large-logit
#              gradient test (GAT/GATv2 centred row sums)
#   graphed  - the CUDA-graph training tests
#   cudaall  - the whole `pytest -m cuda tests`
#   profile  - per-kernel GPU time of fused layers, fp32 vs bf16 (profile_layer.py)
#   sanitize - compute-sanitizer memcheck on the smoke script
#   host     - host time per layer call, this tree and _carry/base
#   train    - epochs: CUDA-graph buckets vs one capacity vs PyG (RUNS_S7, NT)
#   bench    - the layer/op shape x dtype matrix (dfgnn bench, no training)
#   variants - kernel times per launch-bounds variant (VARIANTS, PROFILE_SPECS)
#   ncu      - Nsight Compute sections of the three kernels of a layer f+b (NCU_SPECS)
# Usage: bash scripts/gpu_session7.sh OUTDIR "tests profile"
set -u
OUT=${1:-/tmp/s7}; PARTS=${2:-tests}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/dfgnn_cache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
python -c "import pyg_dfgnn._build as b; b.load()" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has tests; then
  timeout 300 python -m pytest -q -m cuda tests/nn/test_large_logits.py tests/ops/test_cuda_kernels.py \
    tests/ops/test_cuda_shapes.py tests/nn/test_fuzz.py -p no:cacheprovider > "$OUT/pytest_kernels.log" 2>&1
  echo "kernel tests: $(tail -1 "$OUT/pytest_kernels.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_kernels.log" | head -8
fi
if has graphed; then
  timeout 300 python -m pytest -q -m cuda tests/train/test_graphed.py -p no:cacheprovider \
    > "$OUT/pytest_graphed.log" 2>&1; echo "graphed tests: $(tail -1 "$OUT/pytest_graphed.log")"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/pytest_graphed.log" | head -8
fi
if has cudaall; then
  timeout 400 python -m pytest -q -m cuda tests -p no:cacheprovider > "$OUT/pytest_cuda.log" 2>&1
  echo "cuda tests: $(tail -1 "$OUT/pytest_cuda.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest_cuda.log" | head -8
fi
if has sanitize; then
  timeout 300 compute-sanitizer --tool memcheck python scripts/sanitizer_smoke.py > "$OUT/sanitizer.log" 2>&1
  echo "sanitizer: $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
fi
if has profile; then
  for spec in ${PROFILE_SPECS:-transformer:8x10 gatv2:4x64 gat:8x19 transformer:4x64}; do
    for dt in fp32 bf16; do
      timeout 120 python scripts/profile_layer.py --layer "${spec%%:*}" --shape "${spec##*:}" \
        --dtype $dt --graph ${PROFILE_GRAPH:-uniform_100k} --rows 6 >> "$OUT/profile.log" 2>&1
    done
  done
  grep "==" "$OUT/profile.log"
fi
if has ncu; then
  for spec in ${NCU_SPECS:-transformer:8x10:fp32 transformer:8x10:bf16}; do
    IFS=: read -r L S D <<< "$spec"
    timeout 200 ncu -k regex:'fwd_kernel|bwd_row|bwd_col' --launch-skip 6 --launch-count 3 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      python scripts/ncu_layer.py --layer $L --shape $S --dtype $D > "$OUT/ncu_${L}_${S}_${D}.txt" 2>&1
    echo "ncu $spec: $(grep -c 'Duration' "$OUT/ncu_${L}_${S}_${D}.txt") kernels"
  done
fi
if has bench; then
  # the shape x dtype matrix of issue 11 (layers and ops vs PyG, same weights),
  # without the training section and the compile contender
  timeout 420 python -m pyg_dfgnn bench configs/bench_default.yaml --out "$OUT/bench" --no-train \
    --no-compile --no-plots --contenders fused,pyg --graphs uniform_100k,powerlaw_100k,pattern_128 \
    > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"; tail -30 "$OUT/bench.log"
fi
if has host; then
  # host time per layer call (scripts/host_overhead.py); with _carry/base (a
  # checkout of an older commit, carried to the device) the same script on it
  timeout 200 python scripts/host_overhead.py --top 8 > "$OUT/host_new.log" 2>&1
  echo "host (this tree):"; grep -v "^ " "$OUT/host_new.log" | tail -12
  if [ -d _carry/base ]; then
    (cd _carry/base && PYTHONPATH=$PWD PYG_DFGNN_CACHE=/tmp/dfgnn_cache_base timeout 240 \
      python scripts/host_overhead.py --top 8) > "$OUT/host_base.log" 2>&1
    echo "host (_carry/base):"; grep -v "^ " "$OUT/host_base.log" | tail -12
  fi
fi
if has train; then
  # epochs with per-size CUDA-graph buckets against one worst-case capacity
  # and PyG (RUNS_S7 overrides the list; NT training graphs)
  SKIP_DEFAULT=1 EXTRA_RUNS="${RUNS_S7:-
run cgt_b4 cluster_gt.yaml backend=fused cuda_graphs=true
run cgt_b1 cluster_gt.yaml backend=fused cuda_graphs=true cuda_graph_buckets=1
run cgt_pyg cluster_gt.yaml backend=pyg
run cgat_b4 cluster_gat.yaml backend=fused cuda_graphs=true
run cgat_pyg cluster_gat.yaml backend=pyg
run pgt_b4 pattern_gt.yaml backend=fused cuda_graphs=true
run pgt_b1 pattern_gt.yaml backend=fused cuda_graphs=true cuda_graph_buckets=1
run pgt_pyg pattern_gt.yaml backend=pyg
run pgat_b4 pattern_gat.yaml backend=fused cuda_graphs=true
run pgat_pyg pattern_gat.yaml backend=pyg
}" bash scripts/gpu_train_check.sh "$OUT" "${NT:-2000}" > "$OUT/train_lines.txt" 2>&1
  python - /tmp/dfgnn_runs <<'PY'
import json, pathlib, sys
for d in sorted(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir()):
    f = d / "results.json"
    if not f.is_file():
        print(d.name, "no results"); continue
    r = json.loads(f.read_text()); h = r["history"][1:] or r["history"]
    mid = sorted(h, key=lambda x: x["epoch_time_s"])[len(h) // 2]
    cg = (r.get("training") or {}).get("cuda_graphs")
    b = ""
    if isinstance(cg, dict):
        b = " buckets " + ",".join(f"{x.get('num_nodes')}:{x.get('train_steps')}"
                                   for x in cg.get("cuda_graph_buckets", []) or []) + f" captures {cg.get('captures')}"
    print(f"{d.name:10s} epoch {mid['epoch_time_s']:.3f}s train {mid['train_time_s']:.3f}s "
          f"eval {mid['epoch_time_s'] - mid['train_time_s']:.3f}s steady-peak "
          f"{(mid['peak_gpu_mem_bytes'] or 0) / 2**20:.0f} MiB run-peak "
          f"{(r['timings']['peak_gpu_mem_bytes'] or 0) / 2**20:.0f} MiB val {r['history'][-1]['val_metric']:.2f}{b}")
PY
  for f in /tmp/dfgnn_runs/*.log; do grep -H -m2 -i "error\|Traceback" "$f"; done 2>/dev/null | head -5
  (cd /tmp/dfgnn_runs && tar czf "$OUT/runs.tgz" */results.json *.log)
fi
if has variants; then
  # kernel time per launch-bounds variant (separate build caches); VARIANTS is
  # a ';'-separated list of nvcc flag sets, "" = the defaults
  IFS=';' read -ra VS <<< "${VARIANTS:-;-DDFGNN_FWD_BLOCKS=3 -DDFGNN_ROW_BLOCKS=3 -DDFGNN_COL_BLOCKS=3}"
  vi=0
  for v in "${VS[@]}"; do
    vi=$((vi + 1))
    echo "== variant $vi: '${v}'" | tee -a "$OUT/variants.log"
    for spec in ${PROFILE_SPECS:-transformer:8x10 gat:8x19 gatv2:4x64 transformer:4x64}; do
      for dt in fp32 bf16; do
        PYG_DFGNN_NVCC_EXTRA="$v" PYG_DFGNN_CACHE=/tmp/dfgnn_var$vi timeout 240 python scripts/profile_layer.py \
          --layer "${spec%%:*}" --shape "${spec##*:}" --dtype $dt --graph ${PROFILE_GRAPH:-uniform_100k} \
          --rows 4 2>/dev/null | grep -E "==.*forward\+backward|dfgnn::" | sed 's/(dfgnn::Params.*//; s/void dfgnn:://' >> "$OUT/variants.log"
      done
    done
  done
  cat "$OUT/variants.log"
fi
echo "total: $(( $(date +%s) - t0 )) s"
