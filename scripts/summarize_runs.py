"""One line per training run under RUNS (``*/results.json`` of ``dfgnn train``):
median epoch (epochs 2..), train / evaluation time, run peak and steady peak
memory; then fused (label ``<model>_g``, or ``<model>-<variant>_g``) against PyG
(``<model>_pyg``) ratios.

    python scripts/summarize_runs.py RUNS
"""
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
for name in rows:   # fused <m>[-variant]_g against PyG <m>_pyg
    if not name.endswith("_g"):
        continue
    m = name[:-2]
    f, q = rows[name], rows.get(m.split("-")[0] + "_pyg")
    if q:
        print(f"{m:7s} epoch {q[0]/f[0]:.2f}x  train {q[1]/f[1]:.2f}x  val-pass {(q[0]-q[1])/max(f[0]-f[1],1e-9):.2f}x  run-peak mem {q[2]/f[2]:.1f}x steady {q[3]/max(f[3],1e-9):.1f}x")
