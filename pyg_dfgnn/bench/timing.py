"""Timing and memory primitives of the benchmark suite.

* GPU: every repeat is bracketed by a pair of CUDA events on the current
  stream and synchronised before the next repeat (so no two repeats overlap
  and the host cannot queue ahead); the elapsed time is the GPU time between
  the events, which includes any launch gaps inside the measured call.
* CPU: ``time.perf_counter`` around the call (no synchronisation needed).
* Peak memory: on GPU ``torch.cuda.reset_peak_memory_stats`` then
  ``max_memory_allocated() - memory_allocated()`` measured just before the
  call, i.e. the *extra* memory one call needs on top of what is resident
  (inputs, weights, cached graph conversions).  On CPU the same quantity from
  the allocation events of ``torch.profiler`` (``profile_memory=True``): the
  peak of the running sum of the bytes allocated (+) and freed (-) during
  the call by torch's CPU allocator (every tensor, also those a C++ op
  allocates and frees inside; not plain ``malloc`` scratch of C++ code).
* Out-of-memory: :func:`is_oom` recognises ``torch.cuda.OutOfMemoryError``
  (and the plain ``RuntimeError`` spelling older builds raise);
  :func:`free_memory` releases what an aborted call left behind.
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, asdict
from typing import Callable, List, Optional

import torch


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def sync(device) -> None:
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def is_oom(exc: BaseException) -> bool:
    """``torch.cuda.OutOfMemoryError`` anywhere in the exception's cause chain
    (torch.compile wraps errors raised while compiling), or a RuntimeError
    with CUDA's out-of-memory message."""
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return True
        msg = str(e)
        if isinstance(e, RuntimeError) and "out of memory" in msg.lower() and "CUDA" in msg:
            return True
        e = e.__cause__ or e.__context__
    return False


def free_memory(device=None, collect: bool = False) -> None:
    """Return cached GPU blocks to the driver; ``collect=True`` also runs the
    garbage collector (after an exception, whose traceback keeps tensors alive
    in reference cycles) -- it costs ~0.1-0.3 s with torch and PyG loaded."""
    if collect:
        gc.collect()
    if torch.cuda.is_available() and (device is None or is_cuda(device)):
        torch.cuda.empty_cache()


@dataclass
class Stats:
    """Summary of ``n`` repeats, in milliseconds."""

    median: float
    q25: float
    q75: float
    min: float
    max: float
    mean: float
    n: int

    def as_dict(self, prefix: str) -> dict:
        return {f"{prefix}_{k}" if k != "median" else prefix: v for k, v in asdict(self).items()}

    @property
    def iqr_pct(self) -> float:
        return 100.0 * (self.q75 - self.q25) / self.median if self.median > 0 else math.nan


def _quantile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(times_ms: List[float]) -> Stats:
    return Stats(median=_quantile(times_ms, 0.5), q25=_quantile(times_ms, 0.25),
                 q75=_quantile(times_ms, 0.75), min=min(times_ms), max=max(times_ms),
                 mean=sum(times_ms) / len(times_ms), n=len(times_ms))


def wall_once(fn: Callable[[], object], device) -> float:
    """Wall-clock milliseconds of one call, synchronised on both ends (used for
    first calls that include compilation / graph conversion)."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return (time.perf_counter() - t) * 1e3


def measure(fn: Callable[[], object], device, warmup: int = 3, repeats: int = 10,
            pre: Optional[Callable[[], None]] = None, max_time_s: Optional[float] = None,
            min_repeats: int = 3, min_time_s: Optional[float] = None,
            max_repeats: Optional[int] = None) -> Stats:
    """:func:`measure_times`' summary (median & spread)."""
    return summarize(measure_times(fn, device, warmup, repeats, pre, max_time_s, min_repeats,
                                   min_time_s, max_repeats))


def measure_times(fn: Callable[[], object], device, warmup: int = 3, repeats: int = 10,
                  pre: Optional[Callable[[], None]] = None, max_time_s: Optional[float] = None,
                  min_repeats: int = 3, min_time_s: Optional[float] = None,
                  max_repeats: Optional[int] = None) -> List[float]:
    """Milliseconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    ``pre()`` runs before every call, outside the measured interval (e.g. to
    drop gradients).  With ``max_time_s`` the number of repeats is reduced
    (never below ``min_repeats``) when one call is so slow that the repeats
    would take longer than that.  With ``min_time_s`` fast calls get more:
    the warm-up goes on until it took a quarter of that time, and the timed
    runs until they took that time, each up to ``max_repeats`` runs (a
    sub-millisecond, host-bound call's median of 10 moved by 1.5x between
    runs of the same code: docs/BENCHMARKS.md, session 31).
    """
    pre = pre or (lambda: None)
    cuda = is_cuda(device)
    cap = max(int(max_repeats or 0), int(repeats), 1)
    start = time.perf_counter()
    w = 0
    while w < max(warmup, 0) or (min_time_s and w < cap and
                                   time.perf_counter() - start < min_time_s / 4):
        pre()
        fn()
        if min_time_s:
            sync(device)
        w += 1
    sync(device)
    times: List[float] = []
    start_all = time.perf_counter()
    target = max(int(repeats), 1)
    i = 0
    while i < target or (min_time_s and i < cap and
                         time.perf_counter() - start_all < min_time_s):
        pre()
        if cuda:
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(float(s.elapsed_time(e)))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        i += 1
        if max_time_s is not None and i == 1:
            per = max(time.perf_counter() - start_all, 1e-9)
            target = max(min(target, int(max_time_s / per)), min(min_repeats, target))
    return times


def peak_memory_mb(fn: Callable[[], object], device,
                   pre: Optional[Callable[[], None]] = None) -> Optional[float]:
    """Extra memory (MiB) one call of ``fn`` needs above what is allocated
    before it (GPU: CUDA allocator statistics; CPU: :func:`cpu_peak_memory_mb`)."""
    if not is_cuda(device):
        if torch.device(device).type != "cpu":
            return None
        if pre is not None:
            pre()
        return cpu_peak_memory_mb(fn)
    if pre is not None:
        pre()
    dev = torch.device(device)
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    fn()
    torch.cuda.synchronize(dev)
    return (torch.cuda.max_memory_allocated(dev) - base) / 2**20


class _quiet_stderr:
    """Silences file descriptor 2 (C++ logging) inside the block."""

    def __enter__(self):
        import os
        import sys
        try:
            sys.stderr.flush()
            self.saved = os.dup(2)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        except OSError:  # pragma: no cover
            self.saved = None
        return self

    def __exit__(self, *exc):
        import os
        if self.saved is not None:
            os.dup2(self.saved, 2)
            os.close(self.saved)
        return False


def cpu_peak_memory_mb(fn: Callable[[], object]) -> Optional[float]:
    """Peak extra CPU tensor memory (MiB) of one call of ``fn``, from the
    profiler's allocation events (``None`` if the profiler is unavailable)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:  # pragma: no cover
        return None
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    # C++ logging on stderr silenced: some builds log profiler start / stop, and
    # c10 warns that frees of tensors allocated before the profiler started are
    # not seen (as intended: only the call's own allocations count).  The
    # timing runs before this one have already shown any real warning of fn.
    with _quiet_stderr():
        prof.start()
        try:
            fn()
        finally:
            prof.stop()
    try:
        events = prof.profiler.kineto_results.events()
    except Exception:  # pragma: no cover - profiler internals changed
        return None
    mem = sorted((e.start_ns(), e.nbytes()) for e in events
                 if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"))
    cur = peak = 0
    for _, nbytes in mem:
        cur += nbytes
        peak = max(peak, cur)
    return peak / 2**20


def allocated_mb(device) -> Optional[float]:
    if not is_cuda(device):
        return None
    return torch.cuda.memory_allocated(torch.device(device)) / 2**20
