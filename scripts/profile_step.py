"""Where the time of one *training step* goes: wall time per step (forward,
backward, Adam) against GPU kernel time per step (torch.profiler), and the
host's hottest Python functions (cProfile), for a shipped model config on one
PATTERN-like batch that stays on the GPU (no loader).  GPU only:

    PYTHONPATH=. python scripts/profile_step.py --config configs/pattern_gt.yaml \
        [--backend fused] [--graphs 26] [--steps 30] [--host 15]

``--ab MOD:FLAG[,MOD:FLAG...] [--rounds 4]`` times the step with module-level
``[bool]`` flags (e.g. ``pyg_dfgnn.nn.transformer_conv:LAYER_OP``) on and off,
alternated in one process, and prints the medians and their ratio.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_layer import wall_and_kernels  # noqa: E402
from pyg_dfgnn.data import pattern_like_batch  # noqa: E402
from pyg_dfgnn.train.config import load_config  # noqa: E402
from pyg_dfgnn.train.models import build_model  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/pattern_gt.yaml")
    ap.add_argument("--backend", default="fused")
    ap.add_argument("--graphs", type=int, default=26)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--host", type=int, default=0, help="print the N hottest host functions")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile(model, dynamic=True) (compiled before the timing)")
    ap.add_argument("--stacks", action="store_true",
                    help="print the Python stacks of the synchronising calls of one step")
    ap.add_argument("--ops", type=int, default=0,
                    help="print the N ops with the most host (self CPU) time per step")
    ap.add_argument("--ab", default="",
                    help="comma-separated MOD:FLAG [bool] flags timed on and off in one process")
    ap.add_argument("--rounds", type=int, default=4, help="--ab: alternated rounds")
    ap.add_argument("--store", action="store_true",
                    help="a fresh batch every step from pyg_dfgnn.data.GraphBatcher (as the "
                         "trainer's data.batcher=store), instead of one cached batch")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    cfg = load_config(a.config, ["model.lap_pe=false"] if "gt" in a.config else [])
    b = pattern_like_batch(a.graphs, seed=0).to(dev)
    torch.manual_seed(0)
    net = build_model(cfg.model, b.x.size(-1), 2, True, a.backend).to(dev)
    # as the trainer's optimizer.implementation=auto: torch's fused Adam on CUDA
    opt = torch.optim.Adam(net.parameters(), 1e-4, fused=True)
    fwd_net = net
    if a.compile:
        fwd_net = torch.compile(net, dynamic=True)
    batches = None
    if a.store:
        from pyg_dfgnn.data import GraphBatcher, PrepareGraphs, generate_split
        prep = PrepareGraphs.for_model(net) if a.backend == "fused" else None
        store = GraphBatcher(generate_split("PATTERN", "train", a.graphs * 8, seed=0),
                             prep.views if prep is not None else (), build_device=dev)
        order = torch.randperm(len(store)).numpy()
        batches = [order[i:i + a.graphs] for i in range(0, len(order), a.graphs)]
    it = [0]

    def step():
        bb = b
        if batches is not None:
            bb = store.batch(batches[it[0] % len(batches)], dev)
            it[0] += 1
        out = fwd_net(bb.x, bb.edge_index)
        loss = torch.nn.functional.cross_entropy(out.float(), bb.y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if a.ab:
        import importlib
        import statistics
        flags = [getattr(importlib.import_module(m), f)
                 for m, f in (spec.split(":") for spec in a.ab.split(","))]
        res = {True: [], False: []}
        for r in range(a.rounds):
            for v in ((True, False) if r % 2 == 0 else (False, True)):
                for fl in flags:
                    fl[0] = v
                res[v].append(wall_and_kernels(step, a.steps, warmup=3)[:2])
        for fl in flags:
            fl[0] = True
        med = {v: [statistics.median(t[i] for t in res[v]) for i in (0, 1)] for v in res}
        for v in (True, False):
            print(f"{Path(a.config).stem} {a.backend} {a.ab} {'on ' if v else 'off'}: "
                  f"{med[v][0]:.2f} ms/step wall, {med[v][1]:.2f} ms GPU kernels "
                  f"({100 * med[v][1] / med[v][0]:.0f}% busy; rounds: "
                  + " ".join(f"{t[0]:.2f}" for t in res[v]) + ")", flush=True)
        print(f"   on / off: wall {med[True][0] / med[False][0]:.3f}, GPU "
              f"{med[True][1] / med[False][1]:.3f}", flush=True)
        return
    from pyg_dfgnn import graph as _g
    h0, m0 = _g._cache.hits, _g._cache.misses
    wall, gpu, _ = wall_and_kernels(step, a.steps, warmup=5)
    n = a.steps * 2 + 5
    print(f"   graph cache per step: {(_g._cache.hits - h0) / n:.1f} hits, "
          f"{(_g._cache.misses - m0) / n:.1f} misses", flush=True)
    mode = (" store" if a.store else "") + (" compiled" if a.compile else "")
    print(f"{Path(a.config).stem} {a.backend}{mode}: {wall:.2f} ms/step "
          f"wall, {gpu:.2f} ms/step GPU kernels ({100 * gpu / wall:.0f}% busy), batch of "
          f"{a.graphs} graphs ({b.num_nodes} nodes, {b.edge_index.size(1)} edges)", flush=True)
    # host-device synchronisations per step (CUDA runtime calls that wait)
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    waits = {e.key: e.count / 5 for e in prof.key_averages()
             if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                          "cudaEventSynchronize", "cudaMemcpy", "aten::item",
                          "aten::_local_scalar_dense", "aten::nonzero")}
    print(f"   per step: {waits or 'no synchronising CUDA calls'}", flush=True)
    if a.stacks:
        with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof2:
            step()
            torch.cuda.synchronize()
        for e in prof2.key_averages(group_by_stack_n=12):
            if e.key in ("aten::item", "aten::nonzero", "cudaStreamSynchronize"):
                print(f"   {e.key} x{e.count} from:\n      " + "\n      ".join(e.stack))
    if a.ops:
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:a.ops]
        total = sum(e.self_cpu_time_total for e in prof.key_averages()) / 5
        print(f"   host (self CPU) time per step in profiled ops: {total / 1e3:.2f} ms; top:")
        for e in rows:
            print(f"   {e.self_cpu_time_total / 5:9.1f} us  x{e.count / 5:6.1f}  {e.key}")
    if a.host:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.host)
        print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
