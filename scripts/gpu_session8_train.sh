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
python - /tmp/dfgnn_runs <<'PY'
import json, pathlib, sys
rows = {}
for d in sorted(p for p in pathlib.Path(sys.argv[1]).iterdir() if p.is_dir()):
    f = d / "results.json"
    if not f.is_file():
        print(d.name, "no results"); continue
    r = json.loads(f.read_text()); h = r["history"][1:] or r["history"]
    mid = sorted(h, key=lambda x: x["epoch_time_s"])[len(h) // 2]
    rows[d.name] = (mid["epoch_time_s"], mid["train_time_s"], (r["timings"]["peak_gpu_mem_bytes"] or 0) / 2**20,
                    max(x["peak_gpu_mem_bytes"] or 0 for x in h) / 2**20, r["history"][-1]["val_metric"], len(r["history"]))
    e, t, p, sp, v, n = rows[d.name]
    print(f"{d.name:10s} epochs {n} epoch {e:.3f}s train {t:.3f}s eval {e - t:.3f}s run-peak {p:.0f} MiB steady-peak {sp:.0f} MiB val {v:.2f}")
for m in ("gt", "gtbf", "gat", "gatbf", "agnn", "agnnbf"):
    f, q = rows.get(m + "_g"), rows.get(m + "_pyg")
    if f and q:
        print(f"{m:7s} epoch {q[0]/f[0]:.2f}x  train {q[1]/f[1]:.2f}x  val-pass {(q[0]-q[1])/max(f[0]-f[1],1e-9):.2f}x  run-peak mem {q[2]/f[2]:.1f}x steady {q[3]/max(f[3],1e-9):.1f}x")
PY
for f in /tmp/dfgnn_runs/*.log; do grep -H -m2 -i "error\|Traceback" "$f"; done 2>/dev/null | head -5
(cd /tmp/dfgnn_runs && tar czf "$OUT/runs.tgz" */results.json *.log)
