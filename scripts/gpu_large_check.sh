#!/usr/bin/env bash
# One device call (<= 9 min): large-graph training, fused vs PyG's layers (issue 13).
#
#  a. Neighbour-sampled training on the graph of configs/powerlaw_gat_sampled.yaml
#     (2M nodes / 40M edges, 3-layer GAT 4 x 64, fan-out [15, 10, 5], 1024 seeds per
#     step), 2 epochs capped at DFGNN_LARGE_STEPS steps each (max_steps_per_epoch;
#     results.json says capped), evaluated with data.eval=layerwise.  Reports the
#     time per step (epoch 2 after its first batch = steady state; epoch 1
#     includes warm-up), the extrapolated time of a whole epoch (loader start +
#     steps_per_epoch x step) and pyg / fused.
#  b. Full-batch training beyond PyG's memory, configs/powerlaw_gat_full_large.yaml
#     on power-law graphs of growing size (edges 8M .. 128M, nodes = edges / 32),
#     2 epochs each; per backend up to its first OOM (sizes whose `--dry-run`
#     estimate exceeds DFGNN_LARGE_SKIP_FACTOR x the free GPU memory are skipped,
#     not run).  Reports epoch time and peak memory per size.
#
# Every graph is generated once (data.name=file under $DFGNN_LARGE_WORK, in a
# background process at low priority while the extension builds) and shared
# by both backends.  Every run is under `timeout`; a global time budget skips
# what no longer fits (and says so).  OUTDIR gets 7 files: build.log, gen.log,
# plan.log, a_sampled.log, b_full.log, summary.json (rewritten after every run)
# and summary.txt (printed last).
#
# Usage: bash scripts/gpu_large_check.sh OUTDIR
# Env:   DFGNN_LARGE_SCALE=full|tiny   tiny = CPU, tiny graphs (tests this script)
#        DFGNN_LARGE_BUDGET_S (530 / 300)   DFGNN_LARGE_STEPS (100 / 3)
#        DFGNN_LARGE_EDGES (8e6,16e6,32e6,64e6,128e6 / 8000,16000,32000)
#        DFGNN_LARGE_SKIP_FACTOR (2.0)  DFGNN_LARGE_FAKE_FREE_GIB (pretend free memory)
#        DFGNN_LARGE_PARTS (ab)  DFGNN_LARGE_WORK (/tmp/dfgnn_large[_tiny])
set -u
OUT=${1:?usage: bash scripts/gpu_large_check.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PYG_DFGNN_CACHE=${PYG_DFGNN_CACHE:-/tmp/dfgnn_cache}
exec python3 - "$OUT" <<'PYEOF'
import json, os, re, shutil, signal, subprocess, sys, time

T0 = time.time()
OUT = os.path.abspath(sys.argv[1])
E = os.environ
SCALE = E.get("DFGNN_LARGE_SCALE", "full")
if SCALE not in ("full", "tiny"):
    sys.exit(f"gpu_large_check: DFGNN_LARGE_SCALE must be full or tiny, got {SCALE!r}")
TINY = SCALE == "tiny"


def env_num(name, default, conv=float):
    try:
        return conv(float(E.get(name, default)))
    except ValueError:
        sys.exit(f"gpu_large_check: {name} must be a number, got {E[name]!r}")


BUDGET = env_num("DFGNN_LARGE_BUDGET_S", 300 if TINY else 530)
STEPS = env_num("DFGNN_LARGE_STEPS", 3 if TINY else 100, int)
SKIP_FACTOR = env_num("DFGNN_LARGE_SKIP_FACTOR", 2.0)
try:
    EDGES = [int(float(x)) for x in E.get(
        "DFGNN_LARGE_EDGES", "8000,16000,32000" if TINY else "8e6,16e6,32e6,64e6,128e6"
    ).split(",")]
except ValueError:
    sys.exit("gpu_large_check: DFGNN_LARGE_EDGES must be a comma-separated list of numbers")
FAKE_FREE = E.get("DFGNN_LARGE_FAKE_FREE_GIB")
PARTS = E.get("DFGNN_LARGE_PARTS", "ab")
WORK = E.get("DFGNN_LARGE_WORK", "/tmp/dfgnn_large" + ("_tiny" if TINY else ""))
DEVICE = "cpu" if TINY else "cuda"
PY = sys.executable
A_CFG, B_CFG = "configs/powerlaw_gat_sampled.yaml", "configs/powerlaw_gat_full_large.yaml"
A_TIMEOUT, B_TIMEOUT = (120, 90) if TINY else (150, 150)
EVAL_CHUNK = 4096 if TINY else 65536
# tiny: CPU-sized graphs and batches with the same model
A_GEN = (["data.num_nodes=20000", "data.num_edges=200000", "data.max_degree=2000"]
         if TINY else [])
A_RUN = (["batch_size=64", "data.num_workers=2"] if TINY else [])
LOGS = {k: os.path.join(OUT, f"{k}.log") for k in ("build", "gen", "plan", "a_sampled", "b_full")}
for p in LOGS.values():
    open(p, "w").close()
shutil.rmtree(WORK, ignore_errors=True)
for d in ("data", "runs", "logs"):
    os.makedirs(os.path.join(WORK, d), exist_ok=True)

S = {"scale": SCALE, "budget_s": BUDGET, "device": DEVICE, "gpu": None,
     "settings": {"steps_per_epoch_cap": STEPS, "edges": EDGES, "skip_factor": SKIP_FACTOR,
                  "fake_free_gib": FAKE_FREE, "parts": PARTS, "work": WORK},
     "build": None, "plan": None, "a_sampled": {}, "b_full": {"sizes": []}, "notes": []}


def now():
    return time.time() - T0


def left():
    return BUDGET - now()


def say(msg):
    print(f"[{now():6.1f}s] {msg}", flush=True)


def note(msg):
    S["notes"].append(msg)
    say(msg)


def save_summary():
    S["elapsed_s"] = round(now(), 1)
    tmp = os.path.join(OUT, ".summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(S, f, indent=1, default=str)
    os.replace(tmp, os.path.join(OUT, "summary.json"))


def classify(rc, text):
    if rc == 0:
        return "ok"
    if re.search(r"OutOfMemoryError|CUDA out of memory|out of memory", text):
        return "oom"
    if rc in (124, 137):
        return "timeout"
    if "memory_check" in text and "config error" in text:
        return "refused"
    return "error"


assert classify(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == "oom"
assert classify(124, "") == "timeout" and classify(0, "out of memory") == "ok"


def run(label, cmd, timeout, part):
    """Run cmd under `timeout` (its own process group), log into logs/<label>.log
    and append that to OUT/<part>.log; returns (rc, seconds, log text)."""
    log = os.path.join(WORK, "logs", f"{label}.log")
    t = time.time()
    timeout = max(int(timeout), 5)
    with open(log, "w") as f:
        f.write(f"===== {label} | timeout {timeout}s | {' '.join(cmd)}\n")
        f.flush()
        p = subprocess.Popen(["timeout", "-k", "10", str(timeout)] + cmd, stdout=f,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
        f.write(f"===== {label}: exit {rc} after {time.time() - t:.1f}s\n")
    with open(log) as f:
        text = f.read()
    with open(LOGS[part], "a") as f:
        f.write(text + "\n")
    return rc, time.time() - t, text


def last_error(text):
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("=====")]
    err = [ln for ln in lines if re.search(r"Error|error|Killed", ln)]
    return (err or lines or [""])[-1][-300:]


def train_cmd(cfg, overrides, out_dir):
    return [PY, "-m", "pyg_dfgnn", "train", cfg] + overrides + [f"out_dir={out_dir}",
                                                               "--overwrite"]


def read_results(out_dir):
    try:
        with open(os.path.join(out_dir, "results.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def gib(b):
    return None if b is None else round(b / 2 ** 30, 3)


# ---------------------------------------------------------------- data generation
GEN_PY = r"""
import json, os, sys, time
import torch
torch.set_num_threads(int(os.environ.get("DFGNN_GEN_THREADS", "4")))
from pyg_dfgnn.data.datasets import load_data
from pyg_dfgnn.train.config import load_config
for path, cfg_path, overrides in json.loads(sys.argv[1]):
    t = time.time()
    cfg = load_config(cfg_path, overrides)
    b = load_data(cfg.data, seed=cfg.seed, log=lambda m: print(m, flush=True))
    tg = time.time() - t
    torch.save(b.data, path + ".tmp")
    os.replace(path + ".tmp", path)
    info = {"gen_s": round(tg, 2), "save_s": round(time.time() - t - tg, 2),
            "stats": b.stats, "bytes": os.path.getsize(path)}
    with open(path + ".json", "w") as f:
        json.dump(info, f)
    print(f"generated {path}: {json.dumps(info)}", flush=True)
    del b
"""


def b_size(e):
    n = max(e // 32, 2)
    return n, [f"data.num_nodes={n}", f"data.num_edges={e}",
               f"data.max_degree={min(100000, max(n // 2, 1))}"]


A_FILE = os.path.join(WORK, "data", "sampled.pt")
gen_specs = []
if "a" in PARTS:
    gen_specs.append([A_FILE, A_CFG, A_GEN])
if "b" in PARTS:
    for e in EDGES:
        gen_specs.append([os.path.join(WORK, "data", f"full_{e}.pt"), B_CFG, b_size(e)[1]])
gen_log = open(LOGS["gen"], "a")
GEN = subprocess.Popen(["nice", "-n", "10", PY, "-c", GEN_PY, json.dumps(gen_specs)],
                       stdout=gen_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                       start_new_session=True)
say(f"generating {len(gen_specs)} graphs in the background (pid {GEN.pid}) -> {WORK}/data")


def wait_for(path, limit):
    """The generated file's info, waiting up to ``limit`` s; None if not there."""
    t = time.time()
    while time.time() - t < limit:
        if os.path.isfile(path + ".json"):
            with open(path + ".json") as f:
                return json.load(f)
        if GEN.poll() is not None and not os.path.isfile(path + ".json"):
            return None
        time.sleep(0.5)
    return None


def drop(path):
    for p in (path, path + ".json"):
        if os.path.exists(p):
            os.remove(p)


def main():
    # ------------------------------------------------------------ build + GPU
    with open(LOGS["build"], "a") as f:
        if TINY:
            f.write("tiny scale: CPU only, no CUDA build\n")
        else:
            try:
                smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,"
                                      "memory.total,memory.used", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=30)
                S["gpu"] = smi.stdout.strip() or smi.stderr.strip()
            except (OSError, subprocess.SubprocessError) as e:
                S["gpu"] = f"nvidia-smi failed: {e}"
            f.write(f"nvidia-smi: {S['gpu']}\n")
    if not TINY:
        rc, secs, text = run("build", [PY, "-m", "pyg_dfgnn", "build"], 300, "build")
        S["build"] = {"rc": rc, "seconds": round(secs, 1)}
        say(f"build: exit {rc} in {secs:.0f}s")
        if rc != 0:
            note(f"build failed ({last_error(text)}); fused runs will fail")
    save_summary()

    # ------------------------------------------------------------ dry-run estimates
    plan_specs = {}
    if "a" in PARTS:
        for be in ("fused", "pyg"):
            plan_specs[f"a_{be}"] = [A_CFG, A_GEN + A_RUN + [f"backend={be}",
                                                             f"device={DEVICE}"]]
    if "b" in PARTS:
        for e in EDGES:
            for be in ("fused", "pyg"):
                plan_specs[f"b_{be}_{e}"] = [B_CFG, b_size(e)[1] + [f"backend={be}",
                                                                   f"device={DEVICE}"]]
    PLAN_PY = r"""
import json, sys
from pyg_dfgnn.train.config import load_config
from pyg_dfgnn.train.distributed import resolve_device
from pyg_dfgnn.train.memory import device_free_bytes, dry_run
out, dev = {}, None
for key, (cfg_path, overrides) in json.loads(sys.argv[1]).items():
    cfg = load_config(cfg_path, overrides)
    r = dry_run(cfg, log=lambda m: None)
    out[key] = {"estimate_bytes": r["estimate"].total, "estimate": r["estimate"].describe()}
    dev = resolve_device(cfg.device)
free, what = device_free_bytes(dev)
print("PLAN " + json.dumps({"free_bytes": free, "free": what, "estimates": out}))
"""
    rc, secs, text = run("plan", [PY, "-c", PLAN_PY, json.dumps(plan_specs)], 120, "plan")
    m = re.search(r"^PLAN (.*)$", text, re.M)
    plan = json.loads(m.group(1)) if m else {"free_bytes": None, "estimates": {}}
    free = plan["free_bytes"]
    if FAKE_FREE is not None:
        free = float(FAKE_FREE) * 2 ** 30
        plan["free_pretended_bytes"] = free
    S["plan"] = plan
    say(f"dry-run estimates in {secs:.0f}s: free {gib(free)} GiB"
        + (" (pretended: DFGNN_LARGE_FAKE_FREE_GIB)" if FAKE_FREE is not None else "")
        + ("" if m else f"; planner failed: {last_error(text)}"))
    est = {k: v["estimate_bytes"] for k, v in plan["estimates"].items()}
    save_summary()

    # ------------------------------------------------------------ a. sampled training
    if "a" in PARTS:
        info = wait_for(A_FILE, max(left() - 120, 0))
        if info is None:
            note("a: the sampled graph was not generated in time (see gen.log)")
        else:
            S["a_sampled"]["graph"] = info
            say(f"a: graph ready ({info['stats']}, generated in {info['gen_s']}s)")
            for be in ("fused", "pyg"):
                r = S["a_sampled"][be] = {"estimate_gib": gib(est.get(f"a_{be}"))}
                if left() < 45:
                    r["status"] = "skipped (time budget)"
                    note(f"a {be}: skipped, {left():.0f}s of the budget left")
                    continue
                out = os.path.join(WORK, "runs", f"a_{be}")
                over = ["data.name=file", f"data.path={A_FILE}", f"backend={be}",
                        f"device={DEVICE}", "epochs=2", f"max_steps_per_epoch={STEPS}",
                        "data.eval=layerwise", f"data.eval_batch_size={EVAL_CHUNK}",
                        "log.progress=false", "checkpoint.enabled=false"] + A_RUN
                rc, secs, text = run(f"a_{be}", train_cmd(A_CFG, over, out),
                                     min(A_TIMEOUT, left() - 15), "a_sampled")
                r.update(status=classify(rc, text), rc=rc, wall_s=round(secs, 1))
                res = read_results(out)
                if res and res["history"]:
                    h1, h = res["history"][0], res["history"][-1]
                    # steady state: epoch 2 after its first batch (loader start-up)
                    first = h.get("first_batch_s") or 0.0
                    step = (h["train_time_s"] - first) / max(h["steps"], 1)
                    r.update(steps=h["steps"], steps_per_epoch=h["steps_per_epoch"],
                             capped=res["training"]["capped"], epochs=len(res["history"]),
                             step_s=step, step_s_epoch1=h1["train_time_s"] / max(h1["steps"], 1),
                             loader_start_s=first, epoch2_train_s=h["train_time_s"],
                             epoch_extrapolated_s=first + step * h["steps_per_epoch"],
                             eval_layerwise_s=h["epoch_time_s"] - h["train_time_s"],
                             data_s=res["timings"]["data_s"],
                             peak_gib=gib(res["timings"]["peak_gpu_mem_bytes"]),
                             val_metric=h["val_metric"], train_loss=h["train_loss"],
                             batch_size=res["config"]["batch_size"],
                             num_neighbors=res["config"]["data"]["num_neighbors"])
                if r["status"] != "ok":
                    r["error"] = last_error(text)
                say(f"a {be}: {r['status']} in {secs:.0f}s"
                    + (f", {1e3 * r['step_s']:.1f} ms/step, epoch ~{r['epoch_extrapolated_s']:.0f}s"
                       if "step_s" in r else f" ({r.get('error', '')})"))
                save_summary()
            f, p = S["a_sampled"].get("fused", {}), S["a_sampled"].get("pyg", {})
            if f.get("step_s") and p.get("step_s"):
                S["a_sampled"]["pyg_over_fused_step"] = p["step_s"] / f["step_s"]
        drop(A_FILE)

    # ------------------------------------------------------------ b. full batch
    if "b" in PARTS:
        active = {"fused": True, "pyg": True}
        last_secs = {"fused": None, "pyg": None}
        for e in EDGES:
            if not any(active.values()):
                break
            n, _ = b_size(e)
            path = os.path.join(WORK, "data", f"full_{e}.pt")
            row = {"edges": e, "nodes": n}
            S["b_full"]["sizes"].append(row)
            info = None
            for be in ("fused", "pyg"):
                r = row[be] = {"estimate_gib": gib(est.get(f"b_{be}_{e}"))}
                if not active[be]:
                    r["status"] = "not run (stopped at a smaller size)"
                    continue
                if free is not None and est.get(f"b_{be}_{e}", 0) > SKIP_FACTOR * free:
                    r["status"] = (f"skipped (estimate {gib(est[f'b_{be}_{e}'])} GiB > "
                                   f"{SKIP_FACTOR} x {gib(free)} GiB free)")
                    active[be] = False
                    say(f"b {be} {e:,} edges: {r['status']}")
                    continue
                need = (15 if TINY else 60) if last_secs[be] is None else 2.2 * last_secs[be]
                if left() < need + 10:
                    r["status"] = f"skipped (time budget: {left():.0f}s left, ~{need:.0f}s needed)"
                    active[be] = False
                    note(f"b {be} {e:,} edges: {r['status']}")
                    continue
                if info is None:
                    info = wait_for(path, max(left() - need - 10, 0))
                    if info is None:
                        r["status"] = "skipped (graph not generated in time)"
                        note(f"b {e:,} edges: the graph was not ready in time (see gen.log)")
                        active = {k: False for k in active}
                        break
                    row["graph"] = info
                out = os.path.join(WORK, "runs", f"b_{be}_{e}")
                over = ["data.name=file", f"data.path={path}", f"backend={be}",
                        f"device={DEVICE}", "epochs=2", "memory_check=false",
                        "log.progress=false", "checkpoint.enabled=false"]
                rc, secs, text = run(f"b_{be}_{e}", train_cmd(B_CFG, over, out),
                                     min(B_TIMEOUT, left() - 10), "b_full")
                last_secs[be] = secs
                r.update(status=classify(rc, text), rc=rc, wall_s=round(secs, 1))
                res = read_results(out)
                if res and res["history"]:
                    h = res["history"][-1]
                    r.update(epochs=len(res["history"]), epoch_s=h["epoch_time_s"],
                             train_step_s=h["train_time_s"],
                             epoch1_s=res["history"][0]["epoch_time_s"],
                             peak_gib=gib(res["timings"]["peak_gpu_mem_bytes"]),
                             data_s=res["timings"]["data_s"], train_loss=h["train_loss"])
                if r["status"] != "ok":
                    r["error"] = last_error(text)
                    active[be] = False
                say(f"b {be} {e:,} edges: {r['status']} in {secs:.0f}s"
                    + (f", epoch {r['epoch_s']:.2f}s, peak {fmt(r['peak_gib'], '.2f')} GiB"
                       if "epoch_s" in r else f" ({r.get('error', '')})"))
                save_summary()
            drop(path)
        for be in ("fused", "pyg"):
            ok = [row["edges"] for row in S["b_full"]["sizes"]
                  if row.get(be, {}).get("status") == "ok"]
            S["b_full"][f"largest_{be}"] = max(ok) if ok else None


def fmt(v, spec):
    w = re.match(r"\d*", spec).group()
    return "-".rjust(int(w)) if v is None and w else "-" if v is None else format(v, spec)


def report():
    L = [f"== gpu_large_check: scale {SCALE}, device {DEVICE}"
         + (f" ({S['gpu']})" if S["gpu"] else "") + f", {now():.0f}s of a {BUDGET:.0f}s budget"
         + (f", build {S['build']['seconds']}s (exit {S['build']['rc']})" if S["build"] else "")]
    a = S["a_sampled"]
    if "a" in PARTS:
        g = (a.get("graph") or {}).get("stats", {})
        L.append(f"a. sampled training, {g.get('num_nodes', '?'):,} nodes / "
                 f"{g.get('num_edges', '?'):,} edges, 2 epochs capped at {STEPS} steps "
                 "(max_steps_per_epoch), eval layerwise" if g else "a. sampled training: no graph")
        L.append("   ms/step = epoch 2 after its first batch; start = epoch 2's wait for the "
                 "first batch; epoch~ = start + ms/step x steps/ep; e1 = epoch 1 incl. warm-up")
        L.append(f"   {'backend':8s} {'status':8s} {'ms/step':>8s} {'start s':>7s} "
                 f"{'ms/step e1':>10s} {'steps/ep':>8s} {'epoch~s':>8s} {'eval s':>7s} "
                 f"{'peak GiB':>8s} {'est GiB':>7s} {'wall s':>6s}")
        for be in ("fused", "pyg"):
            r = a.get(be)
            if not r:
                continue
            st = r.get("status", "?")
            L.append(f"   {be:8s} {st[:8]:8s} {fmt(r.get('step_s') and 1e3 * r['step_s'], '8.1f')} "
                     f"{fmt(r.get('loader_start_s'), '7.2f')} "
                     f"{fmt(r.get('step_s_epoch1') and 1e3 * r['step_s_epoch1'], '10.1f')} "
                     f"{fmt(r.get('steps_per_epoch'), '8d')} "
                     f"{fmt(r.get('epoch_extrapolated_s'), '8.1f')} "
                     f"{fmt(r.get('eval_layerwise_s'), '7.2f')} {fmt(r.get('peak_gib'), '8.2f')} "
                     f"{fmt(r.get('estimate_gib'), '7.2f')} {fmt(r.get('wall_s'), '6.0f')}"
                     + (f"  {r['error'][:120]}" if r.get("error") else ""))
        if a.get("pyg_over_fused_step"):
            L.append(f"   pyg / fused time per step: {a['pyg_over_fused_step']:.2f}x")
    if "b" in PARTS:
        L.append("b. full-batch 3-layer GAT 4 x 64 (configs/powerlaw_gat_full_large.yaml), "
                 "nodes = edges / 32, 2 epochs; epoch = epoch 2 (train step + full eval)")
        L.append(f"   {'edges':>12s} {'nodes':>10s} | {'fused':8s} {'epoch s':>7s} {'step s':>7s} "
                 f"{'peak':>7s} {'est':>7s} | {'pyg':8s} {'epoch s':>7s} {'step s':>7s} "
                 f"{'peak':>7s} {'est':>7s}  (GiB)")
        for row in S["b_full"]["sizes"]:
            cells = []
            for be in ("fused", "pyg"):
                r = row.get(be, {})
                st = r.get("status", "-").split(" (")[0]
                cells.append(f"{st[:8]:8s} {fmt(r.get('epoch_s'), '7.2f')} "
                             f"{fmt(r.get('train_step_s'), '7.3f')} {fmt(r.get('peak_gib'), '7.2f')} "
                             f"{fmt(r.get('estimate_gib'), '7.1f')}")
            L.append(f"   {row['edges']:12,d} {row['nodes']:10,d} | {cells[0]} | {cells[1]}")
        for be in ("fused", "pyg"):
            big = S["b_full"].get(f"largest_{be}")
            stops = [f"{row['edges']:,}: {row[be]['status']}" for row in S["b_full"]["sizes"]
                     if row.get(be, {}).get("status", "ok") not in ("ok",)
                     and not row[be]["status"].startswith("not run")]
            L.append(f"   largest trained with {be}: "
                     + (f"{big:,} edges" if big else "none")
                     + (f"; stopped at {stops[0]}" if stops else "; no failure up to the "
                        "largest size tried"))
    for n in S["notes"]:
        L.append(f"note: {n}")
    L.append(f"files: {OUT}/summary.json (all numbers), build.log gen.log plan.log "
             "a_sampled.log b_full.log")
    return "\n".join(L)


try:
    main()
except Exception as e:  # keep what was measured
    import traceback
    note(f"orchestrator error: {type(e).__name__}: {e}")
    traceback.print_exc()
finally:
    if GEN.poll() is None:
        os.killpg(GEN.pid, signal.SIGKILL)
        GEN.wait()
        S["notes"].append("background generation stopped at the end (unused sizes)")
    gen_log.close()
    shutil.rmtree(os.path.join(WORK, "data"), ignore_errors=True)
    save_summary()
    text = report()
    with open(os.path.join(OUT, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text, flush=True)
PYEOF
