"""Reports of a benchmark run: console tables, CSV, JSON, PNG plots.

Files written under the output directory:

* ``results.csv``   -- one row per (section, graph, case, shape, dtype,
  contender), columns :data:`CSV_COLUMNS`;
* ``results.json``  -- ``{"environment": ..., "config": ..., "results": [...],
  "summary": {"by_shape_dtype": [...], "dtype_ratios": [...]}, "elapsed_s": ...}``;
* ``table.txt``     -- the console table;
* ``summary.txt``   -- the compact summary: one line per (graph, case, shape,
  dtype), then per (section, shape, dtype) the median fused speedups
  (:func:`shape_dtype_summary`) and per (case, shape) the bf16 / fp32 ratio
  of the fused forward+backward time (:func:`dtype_ratios`);
* ``summary.md``    -- the same tables in Markdown;
* ``speedup_<section>.png`` / ``memory_<section>.png`` -- speedup vs the
  section's baseline (native PyG for layers, naive for ops) and peak memory
  (needs matplotlib: ``pip install "pyg_dfgnn[bench]"``; memory plots only
  when memory was measured, i.e. on CUDA);
* ``errors.log``    -- tracebacks of contenders that raised (if any).

``python -m pyg_dfgnn.bench.report DIR`` prints the summary of a finished run.
"""
from __future__ import annotations

import csv
import datetime
import json
import math
import os
import platform
import subprocess
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence

CSV_COLUMNS = [
    "section", "graph", "graph_kind", "num_nodes", "num_edges", "num_edges_eff",
    "max_in_degree", "case", "shape", "heads", "channels", "dtype", "device", "contender",
    "baseline",
    "status", "check", "max_err", "max_err_at",
    "fwd_ms", "fwd_ms_q25", "fwd_ms_q75", "fwd_ms_min", "fwd_ms_max", "fwd_ms_mean",
    "fwd_ms_n",
    "fwdbwd_ms", "fwdbwd_ms_q25", "fwdbwd_ms_q75", "fwdbwd_ms_min", "fwdbwd_ms_max",
    "fwdbwd_ms_mean", "fwdbwd_ms_n",
    "speedup_fwd", "speedup_fwdbwd", "fwd_peak_mb", "fwdbwd_peak_mb", "mem_ratio",
    "resident_mb", "setup_ms", "first_ms", "first_fwdbwd_ms", "note",
]

SECTION_TITLES = {"layer": "conv layers (baseline: native PyG)",
                  "op": "raw attention ops (baseline: naive gather+softmax+scatter)",
                  "train": "end-to-end training epochs (baseline: backend pyg)"}


# --------------------------------------------------------------------------- #
# environment
# --------------------------------------------------------------------------- #

def _cmd(args: Sequence[str]) -> Optional[str]:
    try:
        r = subprocess.run(list(args), capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except Exception:
        return None


def _version(mod: str) -> Optional[str]:
    try:
        m = __import__(mod)
        return str(getattr(m, "__version__", "?"))
    except Exception:
        return None


def environment(device: Any = None) -> Dict[str, Any]:
    import torch
    env: Dict[str, Any] = {
        "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": (torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
                  else None),
        "torch_geometric": _version("torch_geometric"),
        "torch_sparse": _version("torch_sparse"),
        "torch_scatter": _version("torch_scatter"),
        "pyg_dfgnn": _version("pyg_dfgnn"),
        "git_commit": _cmd(["git", "-C", os.path.dirname(os.path.abspath(__file__)),
                            "rev-parse", "--short", "HEAD"]),
        "device": str(device) if device is not None else None,
        "gpu": None, "gpu_capability": None, "gpu_memory_gb": None, "driver": None,
        # the package's switches set for this run (PYG_DFGNN_FACTORIZE,
        # _BACKWARD, _ALPHA_MODE, _ORDER, ...): what the fused contender ran
        "pyg_dfgnn_env": {k: v for k, v in sorted(os.environ.items())
                          if k.startswith("PYG_DFGNN_")},
    }
    if torch.cuda.is_available() and (device is None or str(device).startswith("cuda")):
        dev = torch.device(device if device is not None else "cuda")
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        env["gpu"] = p.name
        env["gpu_capability"] = f"{p.major}.{p.minor}"
        env["gpu_memory_gb"] = round(p.total_memory / 2**30, 1)
        drv = _cmd(["nvidia-smi", f"--id={idx}", "--query-gpu=driver_version",
                    "--format=csv,noheader"])
        env["driver"] = drv.splitlines()[0].strip() if drv else _nvml_driver()
        env["cuda_driver_api"] = _cuda_driver_api()
        env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return env


def _nvml_driver() -> Optional[str]:
    try:
        import pynvml  # type: ignore
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


def _cuda_driver_api() -> Optional[str]:
    """CUDA version the installed driver supports (``cuDriverGetVersion``)."""
    try:
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except Exception:
        pass
    return None


def _cpu_name() -> Optional[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except Exception:
        pass
    return platform.processor() or None


# --------------------------------------------------------------------------- #
# derived columns
# --------------------------------------------------------------------------- #

def _ok(r: Dict[str, Any]) -> bool:
    return r.get("status") == "ok"


def _case_key(r: Dict[str, Any]) -> tuple:
    """One case: (section, graph, case, shape, dtype); its contenders share it."""
    return (r.get("section"), r.get("graph"), r.get("case"), r.get("shape"), r.get("dtype"))


def add_speedups(rows: List[Dict[str, Any]]) -> None:
    """``speedup_* = baseline time / contender time`` and ``mem_ratio =
    contender peak / baseline peak`` within (section, graph, case, shape,
    dtype); empty when either side did not run."""
    base: Dict[tuple, Dict[str, Any]] = {}
    for r in rows:
        if r.get("contender") == r.get("baseline") and _ok(r):
            base[_case_key(r)] = r
    for r in rows:
        b = base.get(_case_key(r))
        for k, col in (("fwd_ms", "speedup_fwd"), ("fwdbwd_ms", "speedup_fwdbwd")):
            r[col] = (b[k] / r[k]) if (b is not None and _ok(r) and r.get(k) and b.get(k))\
                else None
        bm, m = (b or {}).get("fwdbwd_peak_mb"), r.get("fwdbwd_peak_mb")
        r["mem_ratio"] = (m / bm) if (_ok(r) and b is not None and m is not None and bm)\
            else None


# --------------------------------------------------------------------------- #
# text
# --------------------------------------------------------------------------- #

def _f(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return fmt.format(v)
    return str(v)


def _ms(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def _iqr(r: Dict[str, Any], k: str) -> str:
    m, a, b = r.get(k), r.get(f"{k}_q25"), r.get(f"{k}_q75")
    if not m or a is None or b is None:
        return "-"
    return f"{100.0 * (b - a) / m:.0f}%"


def _render(header: List[str], body: List[List[str]], nleft: int = 4,
            last_left: bool = True) -> str:
    """Aligned text table: the first ``nleft`` columns (and the last one when
    ``last_left``) left-aligned, the numbers right-aligned."""
    w = [max(len(h), *(len(row[i]) for row in body)) if body else len(h)
         for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(header)).rstrip(),
           "  ".join("-" * w[i] for i in range(len(header)))]
    for row in body:
        out.append("  ".join(c.ljust(w[i]) if i < nleft else c
                             if (last_left and i == len(row) - 1) else c.rjust(w[i])
                             for i, c in enumerate(row)).rstrip())
    return "\n".join(out)


def _markdown(header: List[str], body: List[List[str]]) -> str:
    def cell(c: str) -> str:   # (literal | and * : the targets' marks are stars)
        return c.replace("|", "\\|").replace("*", "\\*")
    out = ["| " + " | ".join(cell(h) for h in header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in body]
    return "\n".join(out)


def format_table(rows: List[Dict[str, Any]]) -> str:
    """Full console table, one block per section."""
    blocks = []
    for section in _sections(rows):
        rs = [r for r in rows if r["section"] == section]
        header = ["graph", "case", "shape", "dtype", "contender", "fwd ms", "iqr", "f+b ms",
                  "iqr", "x fwd", "x f+b", "peak MB", "err", "status"]
        body = []
        for r in rs:
            body.append([r["graph"], r["case"], r.get("shape") or "-", r["dtype"],
                         r["contender"], _ms(r.get("fwd_ms")),
                         _iqr(r, "fwd_ms"), _ms(r.get("fwdbwd_ms")), _iqr(r, "fwdbwd_ms"),
                         _f(r.get("speedup_fwd"), "{:.2f}"),
                         _f(r.get("speedup_fwdbwd"), "{:.2f}"),
                         _f(r.get("fwdbwd_peak_mb"), "{:.0f}"),
                         _f(r.get("max_err"), "{:.1e}"), _status(r)])
        blocks.append(f"== {SECTION_TITLES.get(section, section)} ==\n"
                      + _render(header, body, nleft=5))
    return "\n\n".join(blocks)


def _status(r: Dict[str, Any]) -> str:
    s = r.get("status") or ""
    return s if len(s) <= 60 else s[:57] + "..."


def _sections(rows: Iterable[Dict[str, Any]]) -> List[str]:
    seen: List[str] = []
    for r in rows:
        if r["section"] not in seen:
            seen.append(r["section"])
    return seen


#: issue 11's target for the fused forward+backward time, bf16 / fp32
DTYPE_RATIO_TARGET = 0.7
LOW_PRECISION = ("bfloat16", "float16")


def _median(v: List[float]) -> Optional[float]:
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    m = len(v) // 2
    return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])


def _ordered_keys(rows: Iterable[Dict[str, Any]], fn) -> List[tuple]:
    out: List[tuple] = []
    seen = set()
    for r in rows:
        k = fn(r)
        if k not in seen:
            seen.add(k)
            out.append(k)
    return out


def shape_dtype_summary(rows: List[Dict[str, Any]],
                        contender: str = "fused") -> List[Dict[str, Any]]:
    """Per (section, shape, dtype): the median over its (graph, case) pairs of
    ``contender``'s speedups vs the baseline, forward and forward+backward,
    the smallest forward+backward speedup and where, and how many of its
    cases ran (``ok``) / did not (``failed``: mismatch, OOM, error; a
    regression hides there too).  Call :func:`add_speedups` first."""
    out = []
    mine = [r for r in rows if r.get("contender") == contender
            and r.get("case") not in (None, "-")]
    for sec, shape, dt in _ordered_keys(mine, lambda r: (r["section"], r.get("shape"),
                                                         r.get("dtype"))):
        rs = [r for r in mine if (r["section"], r.get("shape"), r.get("dtype"))
              == (sec, shape, dt)]
        ok = [r for r in rs if _ok(r) and r.get("speedup_fwdbwd") is not None]
        worst = min(ok, key=lambda r: r["speedup_fwdbwd"]) if ok else None
        failed = [r for r in rs if not _ok(r) and not str(r.get("status", "")).startswith(
            ("skipped", "n/a"))]
        out.append({
            "section": sec, "shape": shape, "dtype": dt, "cases": len(rs), "ok": len(ok),
            "failed": len(failed),
            "median_speedup_fwd": _median([r.get("speedup_fwd") for r in ok]),
            "median_speedup_fwdbwd": _median([r["speedup_fwdbwd"] for r in ok]),
            "min_speedup_fwdbwd": worst["speedup_fwdbwd"] if worst else None,
            "min_at": f"{worst['graph']} {worst['case']}" if worst else None,
        })
    return out


def dtype_ratios(rows: List[Dict[str, Any]], contender: str = "fused",
                 ref_dtype: str = "float32",
                 target: float = DTYPE_RATIO_TARGET) -> List[Dict[str, Any]]:
    """Per (section, case, shape) and low-precision dtype: ``contender``'s
    forward+backward median time in that dtype / in ``ref_dtype`` on each
    graph where both ran, their median and largest value, and whether every
    graph meets ``target`` (issue 11: bf16 <= 0.7 x fp32)."""
    t: Dict[tuple, float] = {}
    for r in rows:
        if r.get("contender") == contender and _ok(r) and r.get("fwdbwd_ms"):
            t[(r["section"], r["case"], r.get("shape"), r["dtype"], r["graph"])] = \
                r["fwdbwd_ms"]
    graphs = _ordered_keys(rows, lambda r: r.get("graph"))
    out = []
    keys = _ordered_keys([r for r in rows if r.get("contender") == contender
                          and r.get("dtype") in LOW_PRECISION],
                         lambda r: (r["section"], r["case"], r.get("shape"), r["dtype"]))
    for sec, case, shape, dt in keys:
        per = {}
        for g in graphs:
            lo, hi = t.get((sec, case, shape, dt, g)), t.get((sec, case, shape, ref_dtype, g))
            if lo is not None and hi:
                per[g] = lo / hi
        vals = list(per.values())
        out.append({"section": sec, "case": case, "shape": shape, "dtype": dt,
                    "ref_dtype": ref_dtype, "per_graph": per, "median": _median(vals),
                    "max": max(vals) if vals else None, "target": target,
                    "met": (max(vals) <= target) if vals else None})
    return out


#: issue 11's layer targets per (shape, dtype): the fused layer's forward and
#: forward+backward speed-up over PyG's layer with the same weights
SPEED_TARGETS = {("4x64", "float32"): (12.0, 7.0), ("8x10", "float32"): (10.0, 6.0),
                 ("8x19", "float32"): (10.0, 6.0), ("4x64", "bfloat16"): (10.0, 6.0),
                 ("8x10", "bfloat16"): (10.0, 6.0), ("8x19", "bfloat16"): (10.0, 6.0)}
#: ... and at every one of those shapes, PyG's peak memory of forward+backward
#: over the fused layer's
MEMORY_TARGET = 12.0
#: the graphs issue 11 measures on (configs/bench_default.yaml's names)
TARGET_GRAPHS = ("uniform_100k", "powerlaw_100k", "pattern_128")


def issue_targets(rows: List[Dict[str, Any]], contender: str = "fused",
                  graphs: Sequence[str] = TARGET_GRAPHS) -> Dict[str, Any]:
    """Issue 11's layer cells: per (case, shape, dtype) of :data:`SPEED_TARGETS`
    and graph of ``graphs`` where ``contender`` and its baseline ran, the
    forward and forward+backward speed-ups and the baseline's peak memory over
    ours, each against its target.  ``{"cells": [...], "count": n, "met":
    {"fwd": n, "fwdbwd": n, "memory": n}}``; a cell that did not run (OOM,
    mismatch, ...) counts as not met.  Call :func:`add_speedups` first."""
    cells = []
    for r in rows:
        key = (r.get("shape"), r.get("dtype"))
        if (r.get("section") != "layer" or r.get("contender") != contender
                or key not in SPEED_TARGETS or r.get("graph") not in graphs):
            continue
        t_fwd, t_fb = SPEED_TARGETS[key]
        mem = 1.0 / r["mem_ratio"] if r.get("mem_ratio") else None
        x = {"fwd": r.get("speedup_fwd"), "fwdbwd": r.get("speedup_fwdbwd"), "memory": mem}
        targets = {"fwd": t_fwd, "fwdbwd": t_fb, "memory": MEMORY_TARGET}
        cells.append({"case": r.get("case"), "shape": key[0], "dtype": key[1],
                      "graph": r.get("graph"), "x": x, "target": targets,
                      "met": {k: x[k] is not None and x[k] >= targets[k] for k in x}})
    met = {k: sum(c["met"][k] for c in cells) for k in ("fwd", "fwdbwd", "memory")}
    return {"cells": cells, "count": len(cells), "met": met}


def summary_data(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The aggregates of the summary, for ``results.json``."""
    return {"by_shape_dtype": shape_dtype_summary(rows), "dtype_ratios": dtype_ratios(rows),
            "dtype_ratio_target": DTYPE_RATIO_TARGET, "issue_targets": issue_targets(rows)}


def _short_dtype(dt: Any) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16",
            "float64": "fp64"}.get(dt, str(dt))


def summary_blocks(rows: List[Dict[str, Any]]) -> List[tuple]:
    """``[(title, header, body, nleft), ...]``: the compact per-case table,
    the per (section, shape, dtype) medians and the bf16 / fp32 ratios."""
    blocks = []
    header = ["section", "graph", "case", "shape", "dtype", "base f+b ms", "fused f+b ms",
              "x fwd", "x f+b", "base MB", "fused MB", "others"]
    body = []
    for k in _ordered_keys(rows, _case_key):
        rs = [r for r in rows if _case_key(r) == k]
        base = next((r for r in rs if r["contender"] == r["baseline"]), None)
        fused = next((r for r in rs if r["contender"] == "fused"), None)
        others = []
        for r in rs:
            if r is base or r is fused:
                continue
            if _ok(r):
                others.append(f"{r['contender']} x{_f(r.get('speedup_fwdbwd'), '{:.2f}')}")
            else:
                others.append(f"{r['contender']}: {_short_status(r)}")
        body.append([str(k[0]), str(k[1]), str(k[2]), str(k[3] or "-"), str(k[4]),
                     _cell(base, "fwdbwd_ms"), _cell(fused, "fwdbwd_ms"),
                     _f((fused or {}).get("speedup_fwd"), "{:.2f}"),
                     _f((fused or {}).get("speedup_fwdbwd"), "{:.2f}"),
                     _f((base or {}).get("fwdbwd_peak_mb"), "{:.0f}"),
                     _f((fused or {}).get("fwdbwd_peak_mb"), "{:.0f}"),
                     ", ".join(others)])
    blocks.append((None, header, body, 5))
    agg = shape_dtype_summary(rows)
    if agg:
        body = [[a["section"], a["shape"] or "-", a["dtype"], f"{a['ok']}/{a['cases']}",
                 _f(a["median_speedup_fwd"], "{:.2f}"), _f(a["median_speedup_fwdbwd"], "{:.2f}"),
                 _f(a["min_speedup_fwdbwd"], "{:.2f}"), a["min_at"] or "-",
                 str(a["failed"]) if a["failed"] else ""]
                for a in agg]
        blocks.append(("fused vs baseline per shape and dtype: medians over the graphs x "
                       "cases that ran",
                       ["section", "shape", "dtype", "ran", "median x fwd", "median x f+b",
                        "min x f+b", "min at", "failed"], body, 3))
    ratios = dtype_ratios(rows)
    if ratios:
        graphs = [g for g in _ordered_keys(rows, lambda r: r.get("graph"))
                  if any(g in x["per_graph"] for x in ratios)]
        body = []
        for x in ratios:
            body.append([x["section"], x["case"], x["shape"] or "-",
                         f"{_short_dtype(x['dtype'])}/{_short_dtype(x['ref_dtype'])}"]
                        + [_f(x["per_graph"].get(g), "{:.2f}") for g in graphs]
                        + [_f(x["median"], "{:.2f}"), _f(x["max"], "{:.2f}"),
                           "-" if x["met"] is None else ("yes" if x["met"] else "no")])
        blocks.append((f"fused forward+backward time, low precision / fp32 (issue 11 "
                       f"target: <= {DTYPE_RATIO_TARGET:g} on every graph)",
                       ["section", "case", "shape", "ratio"] + graphs
                       + ["median", "max", f"<= {DTYPE_RATIO_TARGET:g}"], body, 4))
    tg = issue_targets(rows)
    if tg["count"]:
        graphs = [g for g in TARGET_GRAPHS if any(c["graph"] == g for c in tg["cells"])]
        by = {(c["case"], c["shape"], c["dtype"], c["graph"]): c for c in tg["cells"]}

        def cell(c):
            if c is None:
                return "-"
            return " / ".join(_f(c["x"][k], "{:.1f}") + ("" if c["met"][k] else "*")
                              for k in ("fwd", "fwdbwd", "memory"))
        body = [[case, shape, _short_dtype(dt)] + [cell(by.get((case, shape, dt, g)))
                                                   for g in graphs]
                for case, shape, dt in _ordered_keys(tg["cells"], lambda c: (
                    c["case"], c["shape"], c["dtype"]))]
        n, m = tg["count"], tg["met"]
        blocks.append((f"issue 11 targets per cell: x forward / x forward+backward / "
                       f"baseline's peak memory over ours (* = below: 12x / 7x at 4x64 "
                       f"fp32, else 10x / 6x; memory {MEMORY_TARGET:g}x); met: forward "
                       f"{m['fwd']}/{n}, forward+backward {m['fwdbwd']}/{n}, memory "
                       f"{m['memory']}/{n}",
                       ["case", "shape", "dtype"] + graphs, body, 3))
    return blocks


def _env_line(env: Dict[str, Any]) -> str:
    return (f"device: {env.get('gpu') or env.get('device')}  torch {env.get('torch')}"
            f"  cuda {env.get('cuda_runtime')}  PyG {env.get('torch_geometric')}"
            f"  driver {env.get('driver')}"
            + "".join(f"  {k}={v}" for k, v in (env.get("pyg_dfgnn_env") or {}).items()))


def format_summary(rows: List[Dict[str, Any]], env: Optional[Dict[str, Any]] = None,
                   markdown: bool = False) -> str:
    """Compact tables: per (section, graph, case, shape, dtype) the fused
    contender against the baseline, plus the others; per (section, shape,
    dtype) the median speedups; per (case, shape) the bf16 / fp32 time ratio.
    ``markdown``: Markdown tables (``summary.md``)."""
    add_speedups(rows)
    lines = []
    if env:
        lines.append(_env_line(env) if not markdown else f"*{_env_line(env)}*")
    for title, header, body, nleft in summary_blocks(rows):
        if title:
            lines.append("")
            lines.append(f"### {title}" if markdown else f"== {title} ==")
        if markdown:
            lines.append("")
            lines.append(_markdown(header, body))
        else:
            lines.append(_render(header, body, nleft=nleft,
                                 last_left=header[-1] in ("others", "failed")))
    return "\n".join(lines)


def _short_status(r: Dict[str, Any]) -> str:
    s = r.get("status") or "?"
    if s.startswith("n/a"):
        return "n/a"
    if s.startswith("skipped"):
        return "skipped"
    if s.startswith("error"):
        return "error"
    return s


def _cell(r: Optional[Dict[str, Any]], k: str) -> str:
    if r is None:
        return "-"
    if not _ok(r):
        return _short_status(r)
    return _ms(r.get(k))


# --------------------------------------------------------------------------- #
# files
# --------------------------------------------------------------------------- #

def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def write_csv(rows: List[Dict[str, Any]], path: str) -> None:
    cols = list(CSV_COLUMNS) + sorted({k for r in rows for k in r} - set(CSV_COLUMNS))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})


def write_json(rows: List[Dict[str, Any]], env: Dict[str, Any], cfg: Dict[str, Any],
               path: str, elapsed_s: Optional[float] = None) -> None:
    with open(path, "w") as f:
        json.dump(_jsonable({"environment": env, "config": cfg, "elapsed_s": elapsed_s,
                             "summary": summary_data(rows), "results": rows}), f, indent=1)


def write_all(rows: List[Dict[str, Any]], env: Dict[str, Any], cfg: Dict[str, Any],
              out_dir: str, elapsed_s: Optional[float] = None, plots: bool = True,
              errors: Optional[List[str]] = None,
              notes: Optional[List[str]] = None) -> Dict[str, str]:
    """Write every report file; returns ``{kind: path}`` of the files written.

    Plots that were not drawn (matplotlib missing, memory not measured) have
    no entry; the reason is appended to ``notes`` when given."""
    os.makedirs(out_dir, exist_ok=True)
    add_speedups(rows)
    paths = {"csv": os.path.join(out_dir, "results.csv"),
             "json": os.path.join(out_dir, "results.json"),
             "table": os.path.join(out_dir, "table.txt"),
             "summary": os.path.join(out_dir, "summary.txt"),
             "summary_md": os.path.join(out_dir, "summary.md")}
    write_csv(rows, paths["csv"])
    write_json(rows, env, cfg, paths["json"], elapsed_s)
    with open(paths["table"], "w") as f:
        f.write(format_table(rows) + "\n")
    with open(paths["summary"], "w") as f:
        f.write(format_summary(rows, env) + "\n")
    with open(paths["summary_md"], "w") as f:
        f.write(format_summary(rows, env, markdown=True) + "\n")
    if errors:
        paths["errors"] = os.path.join(out_dir, "errors.log")
        with open(paths["errors"], "w") as f:
            f.write("\n".join(errors))
    if plots:
        if not matplotlib_available():
            if notes is not None:
                notes.append('plots skipped: matplotlib is not installed '
                             '(pip install "pyg_dfgnn[bench]")')
        else:
            try:
                paths.update(plot_all(rows, env, out_dir, notes=notes))
            except Exception as e:  # a broken matplotlib must not lose the numbers
                msg = f"plotting failed: {type(e).__name__}: {e}"
                print(f"dfgnn bench: {msg}", file=sys.stderr)
                if notes is not None:
                    notes.append(msg)
    return paths


def matplotlib_available() -> bool:
    """Whether matplotlib can be imported (the ``[bench]`` extra)."""
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


# --------------------------------------------------------------------------- #
# plots
# --------------------------------------------------------------------------- #

def plot_all(rows: List[Dict[str, Any]], env: Dict[str, Any], out_dir: str,
             notes: Optional[List[str]] = None) -> Dict[str, str]:
    """Draw the speedup plot of every section, and its memory plot when peak
    memory was measured (CUDA; CPU layers and ops); returns ``{kind: path}`` of the plots drawn and
    appends what was skipped, and why, to ``notes``."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    paths = {}
    no_memory = []
    for section in _sections(rows):
        rs = [r for r in rows if r["section"] == section]
        p = os.path.join(out_dir, f"speedup_{section}.png")
        _plot_speedup(rs, env, p, section)
        paths[f"speedup_{section}"] = p
        if not any(r.get("fwdbwd_peak_mb") is not None for r in rs):
            no_memory.append(f"memory_{section}.png")
            continue
        p = os.path.join(out_dir, f"memory_{section}.png")
        _plot_memory(rs, env, p, section)
        paths[f"memory_{section}"] = p
    if no_memory and notes is not None:
        notes.append(f"not drawn: {', '.join(no_memory)} (no peak memory was measured for "
                     f"that section on this device)")
    return paths


def _ordered(rs: List[Dict[str, Any]], key: str) -> List[Any]:
    out: List[Any] = []
    for r in rs:
        if r.get(key) not in out:
            out.append(r.get(key))
    return out


def _contenders(rs: List[Dict[str, Any]], with_base: bool) -> List[str]:
    out: List[str] = []
    for r in rs:
        c = r["contender"]
        if (with_base or c != r["baseline"]) and c not in out:
            out.append(c)
    return out


def _title(env: Dict[str, Any], what: str) -> str:
    dev = env.get("gpu") or (f"CPU ({env.get('cpu')})" if env.get("cpu") else "CPU")
    return f"{what}\n{dev}, torch {env.get('torch')}, PyG {env.get('torch_geometric')}"


def _find(rs, graph, panel, contender):
    case, shape, dtype = panel
    return next((r for r in rs if r["graph"] == graph and r["case"] == case
                 and r.get("shape") == shape and r["dtype"] == dtype
                 and r["contender"] == contender), None)


def _grid(rs: List[Dict[str, Any]]) -> tuple:
    """Panel grid of a section: one column per case (layer / op / run), one
    row per variant (shape, dtype) in run order; x axis of a panel = the
    graphs of its variant."""
    rs = [r for r in rs if r.get("case") not in (None, "-")]
    cases = _ordered(rs, "case")
    variants = _ordered_keys(rs, lambda r: (r.get("shape"), r.get("dtype")))
    graphs = {v: [g for g in _ordered(rs, "graph")
                  if any(r["graph"] == g and (r.get("shape"), r.get("dtype")) == v
                         for r in rs)] for v in variants}
    return cases, variants, graphs


def _fig(plt, nrows: int, ncols: int, ngraphs: int, nconts: int, height: float):
    w = max(3.2, 0.45 * ngraphs * max(nconts, 1) + 1.2)
    ncols = max(ncols, 1)
    if nrows > 4:  # the shape x dtype matrix: many rows, smaller panels
        height = max(2.6, height * 0.75)
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(w * ncols, 32.0),
                                                    min(height * nrows, 40.0)),
                             squeeze=False)
    return fig, axes


def _panel_title(panel: tuple) -> str:
    case, shape, dtype = panel
    parts = [str(case)] + ([shape] if shape else []) + ([_short_dtype(dtype)]
                                                        if dtype else [])
    return " ".join(parts)


def _variant_contenders(rs, conts, variant) -> List[str]:
    """The contenders of ``conts`` with a row in ``variant`` (shape, dtype)."""
    return [c for c in conts if any(r["contender"] == c and (r.get("shape"), r.get("dtype"))
                                    == variant for r in rs)]


def _bars(ax, rs, panel, graphs, conts, value, fmt, base_name=None, mark_missing=True,
          colors=None):
    width = 0.8 / max(len(conts), 1)
    for j, c in enumerate(conts):
        color = f"C{(colors or {}).get(c, j)}"
        for i, g in enumerate(graphs):
            r = _find(rs, g, panel, c)
            if r is None:
                continue
            x = i + (j - (len(conts) - 1) / 2) * width
            v = value(r)
            ax.bar(x, v or 0, width, color=color, label=c)
            if v:
                ax.text(x, v, fmt.format(v), ha="center", va="bottom", fontsize=6)
            else:
                if not _ok(r):
                    txt = _short_status(r)
                elif base_name is not None:
                    b = _find(rs, g, panel, base_name)
                    txt = "base " + (_short_status(b) if b is not None else "missing")
                elif mark_missing:
                    txt = "n/m"
                else:
                    continue
                ax.text(x, 0.02, txt, ha="center", va="bottom", fontsize=6, rotation=90,
                        transform=ax.get_xaxis_transform())
    ax.set_xticks(range(len(graphs)))
    ax.set_xticklabels(graphs, fontsize=7, rotation=20)
    ax.set_title(_panel_title(panel), fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    if uniq:
        ax.legend(uniq.values(), uniq.keys(), fontsize=6, loc="upper right")


def _plot_speedup(rs: List[Dict[str, Any]], env: Dict[str, Any], path: str,
                  section: str) -> None:
    """Rows: forward for every (shape, dtype), then forward+backward for every
    (shape, dtype); columns: cases."""
    import matplotlib.pyplot as plt
    cases, variants, graphs = _grid(rs)
    variants = variants or [(None, None)]
    cases = cases or ["-"]
    conts = _contenders(rs, with_base=False)
    colors = {c: j for j, c in enumerate(conts)}
    base = rs[0]["baseline"] if rs else "baseline"
    ng = max((len(g) for g in graphs.values()), default=1)
    fig, axes = _fig(plt, 2 * len(variants), len(cases), ng, len(conts), 3.6)
    for m_i, (col, what) in enumerate((("speedup_fwd", "forward"),
                                       ("speedup_fwdbwd", "forward+backward"))):
        for v_i, (shape, dtype) in enumerate(variants):
            row_i = m_i * len(variants) + v_i
            for c_i, case in enumerate(cases):
                ax = axes[row_i, c_i]
                _bars(ax, rs, (case, shape, dtype), graphs.get((shape, dtype), []),
                      _variant_contenders(rs, conts, (shape, dtype)),
                      lambda r: r.get(col), "{:.2f}", base, colors=colors)
                ax.axhline(1.0, color="k", lw=0.8, ls="--")
                if c_i == 0:
                    label = f"{what}" + (f" {shape}" if shape else "") + (
                        f" {_short_dtype(dtype)}" if dtype else "")
                    ax.set_ylabel(f"{label}\nspeedup vs {base} (x)", fontsize=8)
    fig.suptitle(_title(env, f"{SECTION_TITLES.get(section, section)}: speedup = median "
                             "time of baseline / contender (higher is better)"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110 if len(variants) <= 2 else 80)
    plt.close(fig)


def _plot_memory(rs: List[Dict[str, Any]], env: Dict[str, Any], path: str,
                 section: str) -> None:
    import matplotlib.pyplot as plt
    cases, variants, graphs = _grid(rs)
    variants = variants or [(None, None)]
    cases = cases or ["-"]
    conts = _contenders(rs, with_base=True)
    colors = {c: j for j, c in enumerate(conts)}
    measured = any(r.get("fwdbwd_peak_mb") is not None for r in rs)
    ng = max((len(g) for g in graphs.values()), default=1)
    fig, axes = _fig(plt, len(variants), len(cases), ng, len(conts), 4.0)
    for v_i, (shape, dtype) in enumerate(variants):
        for c_i, case in enumerate(cases):
            ax = axes[v_i, c_i]
            _bars(ax, rs, (case, shape, dtype), graphs.get((shape, dtype), []),
                  _variant_contenders(rs, conts, (shape, dtype)),
                  lambda r: r.get("fwdbwd_peak_mb"), "{:.0f}", mark_missing=measured,
                  colors=colors)
            if measured:
                ax.set_yscale("log")
            else:
                ax.set_ylim(0, 1)
                ax.text(0.5, 0.5, "peak memory is measured\non CUDA devices only",
                        ha="center", va="center", transform=ax.transAxes, fontsize=8)
            if c_i == 0:
                what = ("peak memory per epoch (MiB)" if section == "train" else
                        "peak extra memory,\nforward+backward (MiB)")
                if shape or dtype:
                    what = " ".join(x for x in (shape, _short_dtype(dtype) if dtype else None)
                                    if x) + "\n" + what
                ax.set_ylabel(what, fontsize=8)
    fig.suptitle(_title(env, f"{SECTION_TITLES.get(section, section)}: peak memory "
                             "(lower is better)"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110 if len(variants) <= 2 else 80)
    plt.close(fig)


# --------------------------------------------------------------------------- #
# summary of a finished run
# --------------------------------------------------------------------------- #

def load_results(out_dir: str) -> Dict[str, Any]:
    with open(os.path.join(out_dir, "results.json")) as f:
        return json.load(f)


def print_summary(out_dir: str) -> int:
    data = load_results(out_dir)
    rows = data.get("results", [])
    print(format_summary(rows, data.get("environment")))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(print_summary(sys.argv[1] if len(sys.argv) > 1 else "."))
