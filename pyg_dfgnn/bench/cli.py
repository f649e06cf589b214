"""``dfgnn bench [CONFIG] [--quick] [--ops] [--out DIR] ...``

Runs the benchmark sections of a config (see ``configs/bench_default.yaml``)
and writes the console table, ``results.csv``, ``results.json`` (with the
environment), ``table.txt``, ``summary.txt`` and PNG plots (with matplotlib,
``pip install "pyg_dfgnn[bench]"``; memory plots on CUDA only) under ``--out``.
Without a config and without a CUDA GPU it runs the quick CPU suite.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from typing import Any, Dict, List, Optional

USAGE_EPILOG = """\
examples:
  dfgnn bench --quick --out runs/bench_quick           # CPU smoke run, < 1 min
  dfgnn bench configs/bench_default.yaml --out runs/b  # full GPU suite
  dfgnn bench --ops --out runs/ops                     # kernel-level ops only
  dfgnn bench configs/bench_default.yaml --plan        # list the case matrix, run nothing
  dfgnn bench configs/bench_default.yaml --shapes 8x19 --dtypes bfloat16 --out runs/s
  dfgnn bench --summary runs/b                         # re-print a finished run's summary
"""


def _csv(s: Optional[str]) -> Optional[List[str]]:
    return None if s is None else [x.strip() for x in s.split(",") if x.strip()]


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dfgnn bench", description="Fused attention layers/ops vs native PyG.",
        epilog=USAGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="benchmark YAML (default: "
                   "configs/bench_default.yaml on a CUDA GPU; configs/bench_quick.yaml "
                   "with --quick or without a GPU)")
    p.add_argument("--quick", action="store_true",
                   help="small CPU run (bench_quick.yaml); with a config: few repeats, "
                        "no torch.compile")
    p.add_argument("--out", help="output directory (default: runs/bench/<name>_<time>)")
    p.add_argument("--ops", action="store_true",
                   help="only the kernel-level benchmark of the raw ops")
    p.add_argument("--device", help="cuda, cuda:N or cpu (overrides the config)")
    p.add_argument("--graphs", help="comma-separated graph names to run")
    p.add_argument("--layers", help="comma-separated layers (gat,gatv2,transformer,agnn)")
    p.add_argument("--contenders", help="comma-separated layer contenders")
    p.add_argument("--dtypes", help="comma-separated dtypes (float32,float16,bfloat16); "
                   "replaces the top-level and the sections' dtypes")
    p.add_argument("--shapes", help="comma-separated heads x channels per head, e.g. "
                   "4x64,8x10 (replaces layers.shapes and ops.shapes)")
    p.add_argument("--warmup", type=int)
    p.add_argument("--repeats", type=int)
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile contender")
    p.add_argument("--no-train", action="store_true", help="skip end-to-end training epochs")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--summary", metavar="DIR", help="print the summary of a finished run")
    p.add_argument("--plan", action="store_true",
                   help="print the (section, graph, shape, dtype) matrix the config expands "
                        "to and exit without running anything")
    return p.parse_args(argv)


def resolve_device(name: str):
    import torch
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("dfgnn bench: CUDA requested but not available (use --device cpu "
                         "or --quick)")
    return dev


def build_config(a: argparse.Namespace) -> Dict[str, Any]:
    from .config import load_config
    cfg = load_config(a.config, quick=a.quick)
    if a.device:
        cfg["device"] = a.device
    if a.graphs:
        names = _csv(a.graphs)
        known = [g.get("name") or g.get("kind") for g in cfg["graphs"]]
        bad = [n for n in names if n not in known]
        if bad:
            raise SystemExit(f"dfgnn bench: unknown graph(s) {bad}; the config has {known}")
        cfg["graphs"] = [g for g in cfg["graphs"] if (g.get("name") or g.get("kind")) in names]
    if a.layers:
        cfg["layers"]["names"] = _csv(a.layers)
    if a.contenders:
        cfg["layers"]["contenders"] = _csv(a.contenders)
    if a.dtypes:
        cfg["dtypes"] = _csv(a.dtypes)
        for key in ("layers", "ops"):
            cfg[key]["dtypes"] = None
    if a.shapes:
        from .config import parse_shape
        shapes = [list(parse_shape(v, "--shapes")) for v in _csv(a.shapes)]
        for key in ("layers", "ops"):
            cfg[key].update(shapes=shapes, heads=None, channels=None)
    if a.warmup is not None:
        cfg["timing"]["warmup"] = a.warmup
    if a.repeats is not None:
        cfg["timing"]["repeats"] = a.repeats
    if a.no_compile:
        cfg["compile"]["enabled"] = False
        for g in cfg["graphs"]:
            g.pop("compile", None)
    if a.no_train:
        cfg["train"]["enabled"] = False
    if a.no_plots:
        cfg["plots"] = False
    if a.ops:
        cfg["ops"]["enabled"] = True
        cfg["layers"]["enabled"] = False
        cfg["train"]["enabled"] = False
    from .config import expand
    expand(cfg)  # every malformed shape / dtype / limit is an error now, naming its key
    return cfg


def format_plan(cfg: Dict[str, Any]) -> str:
    """What ``cfg`` runs: per (section, graph) the shapes x dtypes, the cases
    and the contenders of each, and the totals (``--plan``)."""
    from .config import expand, section_plan, shape_label
    from .graphs import graph_name
    lines = [f"plan of {cfg.get('_source')}:"]
    entries = expand(cfg)
    for key, section in (("layers", "layer"), ("ops", "op")):
        names = cfg.get(key, {}).get("names") or []
        for i, spec in enumerate(cfg.get("graphs", [])):
            plan = section_plan(cfg, key, spec, i)
            if not plan:
                continue
            lines.append(f"  {section:<5} {graph_name(spec)}: {', '.join(names)}")
            for shape, dt, conts in plan:
                lines.append(f"    {shape_label(shape):<6} {dt:<9} {', '.join(conts)}")
    cases = {(e["section"], e["graph"], e["shape"], e["dtype"], e["case"]) for e in entries}
    lines.append(f"total: {len(cases)} cases, {len(entries)} contender runs"
                 + (f"; + {len(cfg['train'].get('runs') or [])} training runs x "
                    f"{len(cfg['train'].get('backends') or [])} backends"
                    if cfg.get("train", {}).get("enabled") else ""))
    if cfg.get("time_budget_s"):
        lines.append(f"time budget: {cfg['time_budget_s']} s (time_budget_s)")
    return "\n".join(lines)


def _progress(row: Dict[str, Any]) -> None:
    def ms(k):
        v = row.get(k)
        return "-" if v is None else f"{v:.3f}"
    extra = f" err={row['max_err']:.1e}" if row.get("max_err") is not None else ""
    print(f"  {row['section']:<5} {row['graph']:<16} {row['case']:<12} "
          f"{row.get('shape') or '-':<5} {row['dtype']:<8} "
          f"{row['contender']:<12} {row['status'][:70]:<12} fwd {ms('fwd_ms')} ms  "
          f"f+b {ms('fwdbwd_ms')} ms{extra}", flush=True)


def run(cfg: Dict[str, Any], out_dir: str,
        written: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """Run every enabled section of ``cfg``; writes reports to ``out_dir``
    after each graph (so an interrupted run keeps what it measured).

    ``written``, when given, receives ``paths`` (``{kind: path}`` of the files
    of the last report) and ``notes`` (what was not written, and why)."""
    import torch

    device = resolve_device(cfg.get("device", "auto"))
    threads = cfg.get("cpu_threads")
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        return _run(cfg, out_dir, device, {} if written is None else written)
    finally:
        torch.set_num_threads(old_threads)


def _run(cfg: Dict[str, Any], out_dir: str, device,
         written: Dict[str, Any]) -> List[Dict[str, Any]]:
    from . import report
    from .graphs import Unavailable, graph_name, load_graph
    from .layers import CompileGate, run_layers
    from .ops_bench import run_ops
    from .runner import Settings, parse_dtype, timing
    from .train_bench import run_train

    from .config import section_plan
    settings = Settings.from_config(cfg)
    env = report.environment(device)
    gate = CompileGate(cfg.get("compile", {}))
    rows: List[Dict[str, Any]] = []
    t_start = time.perf_counter()
    plots = bool(cfg.get("plots", True))
    public_cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    public_cfg["source"] = cfg.get("_source")

    def dump(final: bool = False):
        notes: List[str] = []
        written["paths"] = report.write_all(
            rows, env, public_cfg, out_dir, time.perf_counter() - t_start,
            plots=plots and final, errors=settings.errors, notes=notes)
        written["notes"] = notes

    print(f"dfgnn bench: {cfg.get('_source')} on {env.get('gpu') or device} "
          f"(torch {env['torch']}, PyG {env['torch_geometric']}), out: {out_dir}", flush=True)
    for gi, spec in enumerate(cfg.get("graphs", [])):
        gname = graph_name(spec)
        # [(shape, dtype, contenders), ...] of each section on this graph
        layer_plan = section_plan(cfg, "layers", spec, gi)
        op_plan = section_plan(cfg, "ops", spec, gi)
        if not (layer_plan or op_plan):
            continue
        try:
            g = load_graph(spec)
        except Unavailable as e:
            print(f"graph {gname}: skipped ({e})", flush=True)
            rows.append(_graph_row(spec, f"skipped: {e}"))
            continue
        st = g.stats()
        print(f"graph {g.name}: {st['num_nodes']} nodes, {st['num_edges']} edges, max "
              f"in-degree {st['max_in_degree']} (built in {g.build_s:.1f}s)", flush=True)
        for shape, dt, conts in layer_plan:
            rows += run_layers(g, cfg, settings, parse_dtype(dt), device, gate,
                               on_row=_progress, shape=shape, contender_names=conts)
        for shape, dt, conts in op_plan:
            rows += run_ops(g, cfg, settings, parse_dtype(dt), device, on_row=_progress,
                            shape=shape, contender_names=conts)
        del g
        timing.free_memory(device, collect=True)
        dump()
    if cfg.get("train", {}).get("enabled", False):
        rows += run_train(cfg, settings, device, out_dir, on_row=_progress)
    dump(final=True)
    return rows


def _graph_row(spec: Dict[str, Any], status: str) -> Dict[str, Any]:
    from .graphs import graph_name
    return {"section": "layer", "graph": graph_name(spec), "graph_kind": spec.get("kind"),
            "case": "-", "shape": None, "dtype": "-", "contender": "-", "baseline": "pyg",
            "status": status,
            "note": ""}


def _default_config_note(a: argparse.Namespace) -> Optional[str]:
    """Plain ``dfgnn bench`` without a CUDA GPU runs the quick CPU suite: the
    default suite is sized for a GPU (100k-500k node graphs)."""
    if a.config is not None or a.quick or a.summary:
        return None
    if a.device not in (None, "auto", "cpu"):
        return None
    import torch
    if a.device is None or a.device == "auto":
        if torch.cuda.is_available():
            return None
        why = "no CUDA GPU found"
    else:
        why = "--device cpu"
    a.quick = True
    return (f"note: {why}: running the quick CPU suite (configs/bench_quick.yaml, < 1 min); "
            f"the default suite is sized for a GPU (100k-500k node graphs). To run it on "
            f"the CPU anyway: dfgnn bench configs/bench_default.yaml --device cpu")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if a.summary:
        from .report import print_summary
        return print_summary(a.summary)
    try:
        return _main(a)
    except KeyboardInterrupt:
        out = getattr(a, "out_dir_used", None)
        done = out is not None and os.path.isfile(os.path.join(out, "results.json"))
        print("\ndfgnn bench: interrupted" + (
            f"; the results of the graphs finished so far are in {out}/ (results.json, "
            f"table.txt, ...)" if done else "; no graph was finished, nothing written"),
            file=sys.stderr)
        return 130


def _main(a: argparse.Namespace) -> int:
    os.environ.setdefault("MPLBACKEND", "Agg")
    note = _default_config_note(a)
    if note:
        print(note, flush=True)
    try:
        cfg = build_config(a)
        if a.plan:
            print(format_plan(cfg))
            return 0
    except (FileNotFoundError, ValueError) as e:
        print(f"dfgnn bench: {e}", file=sys.stderr)
        return 2
    out = a.out or os.path.join(
        "runs", "bench", f"{cfg.get('name', 'bench')}_"
        f"{datetime.datetime.now().strftime('%Y%m%d_%H%M%S')}")
    os.makedirs(out, exist_ok=True)
    a.out_dir_used = out
    t = time.perf_counter()
    written: Dict[str, Any] = {}
    try:
        rows = run(cfg, out, written)
    except ValueError as e:  # config errors surfacing while running
        print(f"dfgnn bench: {e}", file=sys.stderr)
        return 2
    from .report import format_summary, format_table, load_results
    env = load_results(out).get("environment")
    print()
    print(format_table(rows))
    print()
    print(format_summary(rows, env))
    names = [os.path.basename(p) for p in written.get("paths", {}).values()]
    print(f"\nwrote {out}/: {', '.join(names)} in {time.perf_counter() - t:.1f}s")
    for n in written.get("notes", []):
        print(f"  {n}")
    if not cfg.get("plots", True):
        print("  plots: off (--no-plots)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
