#!/usr/bin/env bash
# One device call: training-level checks of issues 12/13 on a reduced PATTERN
# (2000 training graphs) and a reduced power-law graph, fused vs pyg in the same
# call.  Usage: bash scripts/gpu_train_check.sh OUTDIR [NUM_TRAIN]
# Writes OUTDIR/train_summary.json and prints one line per run.
set -u
OUT=${1:-/tmp/train_check}; NT=${2:-2000}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/dfgnn_cache}
RUNS=/tmp/dfgnn_runs; rm -rf "$RUNS"; mkdir -p "$RUNS"
COMMON="epochs=${EPOCHS:-3} checkpoint.enabled=false data.num_train=$NT data.num_val=400 data.num_test=400 data.root=/tmp/dfgnn_data log.progress=false"
run() {  # label config args...
  local label=$1 cfg=$2; shift 2
  timeout 300 python -m pyg_dfgnn train "configs/$cfg" $COMMON "$@" out_dir="$RUNS/$label" \
    > "$RUNS/$label.log" 2>&1 || echo "$label: exit $? ($(tail -1 "$RUNS/$label.log"))"
}
if [ -z "${SKIP_DEFAULT:-}" ]; then   # SKIP_DEFAULT=1: only the EXTRA_RUNS
run gt_fused pattern_gt.yaml backend=fused
run gt_pyg pattern_gt.yaml backend=pyg
run gat_fused pattern_gat.yaml backend=fused
run gat_pyg pattern_gat.yaml backend=pyg
run agnn_fused pattern_agnn.yaml backend=fused
run agnn_pyg pattern_agnn.yaml backend=pyg
run gt_fused_bf16 pattern_gt.yaml backend=fused precision=bf16
run gt_pyg_bf16 pattern_gt.yaml backend=pyg precision=bf16
run gat_fused_bf16 pattern_gat.yaml backend=fused precision=bf16
run gat_pyg_bf16 pattern_gat.yaml backend=pyg precision=bf16
run gat_fused_dataloader pattern_gat.yaml backend=fused data.batcher=pyg
run gat_pyg_dataloader pattern_gat.yaml backend=pyg data.batcher=pyg
fi
eval "${EXTRA_RUNS:-}"
python - "$RUNS" "$OUT" <<'EOF'
import json, sys, pathlib
runs, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = {}
for d in sorted(p for p in runs.iterdir() if p.is_dir()):
    f = d / "results.json"
    if not f.is_file():
        continue
    r = json.loads(f.read_text())
    h = r["history"][1:] or r["history"]          # epoch 1 includes warm-up / compile
    med = sorted(x["epoch_time_s"] for x in h)[len(h) // 2]
    trn = sorted(x["train_time_s"] for x in h)[len(h) // 2]
    rows[d.name] = {"epoch_s": med, "train_s": trn, "eval_s": med - trn,
                    "peak_mib": (r["timings"]["peak_gpu_mem_bytes"] or 0) / 2**20,
                    "val_metric": r["history"][-1]["val_metric"],
                    "train_loss": [x["train_loss"] for x in r["history"]],
                    "training": r.get("training"), "gpu": r["environment"].get("gpu")}
    x = rows[d.name]
    print(f"{d.name:18s} epoch {x['epoch_s']:7.3f}s  train {x['train_s']:7.3f}s  "
          f"eval {x['eval_s']:6.3f}s  peak {x['peak_mib']:8.1f} MiB  val {x['val_metric']:.2f}")
for m in ("gt", "gat", "agnn", "gt_{}_bf16", "gat_{}_bf16", "gat_{}_dataloader"):
    f, p = (rows.get(m.format("fused")), rows.get(m.format("pyg"))) if "{}" in m else \
        (rows.get(f"{m}_fused"), rows.get(f"{m}_pyg"))
    if f and p:
        print(f"{m.replace('_{}', '')}: fused/pyg epoch speedup {p['epoch_s'] / f['epoch_s']:.2f}x, train pass "
              f"{p['train_s'] / f['train_s']:.2f}x, eval {p['eval_s'] / max(f['eval_s'], 1e-9):.2f}x, "
              f"memory {p['peak_mib'] / max(f['peak_mib'], 1e-9):.1f}x")
(out / "train_summary.json").write_text(json.dumps(rows, indent=1))
EOF
