"""GPU-busy share of CUDA-graph training steps (``cuda_graphs: true``) against
the eager fused step, on the trainer's own model, data and optimiser.

    python scripts/profile_graphed.py configs/pattern_gt.yaml data.num_train=2000 ...

Prints, per mode, wall ms/step (host clock over STEPS steps, synchronised),
the GPU kernel time per step from torch.profiler (sum of kernel durations)
and the host time per step (the median step's host clock without a sync: what
the host spends issuing it, unless the step itself waits on the GPU).
"""
import sys
import time

import numpy as np
import torch

sys.path.insert(0, ".")
from pyg_dfgnn.train import distributed as D  # noqa: E402
from pyg_dfgnn.train.config import load_config  # noqa: E402
from pyg_dfgnn.train.trainer import _Run  # noqa: E402

STEPS = 30


def kernel_ms(prof) -> float:
    tot = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            tot += e.device_time if hasattr(e, "device_time") else e.cuda_time
    return tot / 1000.0


def device_split(prof):
    """``(copy ms, kernel count)`` of the profiled CUDA activity: the time of
    its memory copies and sets, and how many other (kernel) events it has."""
    copy, n = 0.0, 0
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if "Memcpy" in e.name or "Memset" in e.name:
            copy += e.device_time if hasattr(e, "device_time") else e.cuda_time
        else:
            n += 1
    return copy / 1000.0, n


class _LoadClock:
    """Host time of ``StaticBatch.load`` per call, and of its wait for the
    previous copy (a ``torch.cuda.Event.synchronize`` inside it)."""

    def __init__(self, static):
        self.total, self.wait = [], []
        load = static.load
        clock = self

        def timed_load(*a, **k):
            t0 = time.perf_counter()
            ev = static._copied
            if ev is not None:
                ev.synchronize()
            t1 = time.perf_counter()
            r = load(*a, **k)
            clock.wait.append(t1 - t0)
            clock.total.append(time.perf_counter() - t0)
            return r
        static.load = timed_load


def main(argv):
    cfg_path, overrides = argv[0], argv[1:]
    for graphed in (False, True):
        cfg = load_config(cfg_path, overrides + [f"cuda_graphs={str(graphed).lower()}",
                                                  "out_dir=/tmp/profile_graphed",
                                                  "log.progress=false"])
        run = _Run(cfg, D.DistInfo(device=torch.device("cuda")))
        run.load_data()
        run.build()
        store = run.stores[id(run.bundle.train)]
        from pyg_dfgnn.data.batching import GraphBatchLoader
        loader = GraphBatchLoader(store, cfg.batch_size, shuffle=True, device=run.device,
                                  generator=torch.Generator().manual_seed(0))
        ids = list(loader.id_batches())
        run.model.train()
        clock = _LoadClock(run.graphed.static) if graphed else None

        def step(i):
            b = ids[i % len(ids)]
            if graphed:
                return run.graphed.train_step(store, b)[1]
            batch = store.batch(b, run.device)
            return run.optimize(lambda: run._forward(run.model, batch), batch.y)[1]
        for i in range(8):          # warm-up (and the capture)
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host = []
        for i in range(STEPS):
            h0 = time.perf_counter()
            step(i)
            host.append(time.perf_counter() - h0)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / STEPS
        host_ms = float(np.median(host)) * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(STEPS):
                step(i)
            torch.cuda.synchronize()
        k = kernel_ms(prof) / STEPS
        copy, nk = device_split(prof)
        print(f"{cfg.model.name} {'graphed' if graphed else 'eager  '} {cfg.precision}: "
              f"{wall:6.2f} ms/step wall, {k:6.2f} ms/step GPU kernels, busy {100 * k / wall:5.1f}%, "
              f"host {host_ms:6.3f} ms/step (median of the steps' host time, unsynchronised)",
              flush=True)
        extra = ""
        if clock is not None and clock.total:
            extra = (f"; batch load {1e3 * float(np.median(clock.total)):.3f} ms/step, of which "
                     f"waiting for the previous copy {1e3 * float(np.median(clock.wait)):.3f}")
        print(f"    copies and sets {copy / STEPS:.3f} ms/step (in the GPU time above), "
              f"{nk / STEPS:.0f} kernels/step{extra}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
