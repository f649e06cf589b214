"""Generic benchmark case runner: reference, correctness gate, timing, memory.

A :class:`Case` is one (graph, layer-or-op, shape, dtype) problem with fixed inputs
and a fixed upstream gradient; every contender of the case gets exactly these
tensors.  For each contender, :func:`run_case`

1. builds it (``setup_ms``: module copy + weight load, adjacency conversion,
   ``torch.compile`` wrapping),
2. calls it once without autograd (``first_ms``: includes lazy work such as
   the fused layer's CSR conversion or torch.compile's compilation) and once
   with forward+backward (``first_fwdbwd_ms``),
3. compares that forward output -- and the gradients of the inputs and of
   the parameters -- with the case's reference (:func:`compute_reference`);
   a contender whose relative error ``max|y - ref| / max|ref|`` exceeds the
   dtype's tolerance is reported as ``mismatch`` and **not** timed,
4. times forward (under ``torch.no_grad``) and forward+backward (the
   gradients are dropped before every repeat, outside the timed interval),
   in blocks interleaved with the case's other contenders (:func:`run_case`),
5. measures peak extra memory of one forward and one forward+backward.

Any out-of-memory error is reported as ``OOM``; a contender that cannot run
here as ``n/a: <reason>``; any other exception as ``error: <message>``.  The
suite never stops because one contender failed.
"""
from __future__ import annotations

import copy
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from . import timing
from .graphs import BenchGraph, Unavailable


class Skipped(Exception):
    """A contender deliberately not run (``skipped: <reason>``)."""


@dataclass
class Prepared:
    """A ready-to-call contender: ``fn(*inputs) -> out``; ``params`` are its
    named parameters (gradients compared by name and dropped between runs)."""

    fn: Callable[..., Tensor]
    params: Dict[str, Tensor] = field(default_factory=dict)
    note: str = ""
    keep: Any = None  # objects that must stay alive (modules, adjacencies)


Factory = Callable[["Case"], Prepared]


@dataclass
class Case:
    section: str                 # "layer" | "op" (| "train" rows are made elsewhere)
    graph: BenchGraph
    name: str                    # layer or op name
    heads: int
    channels: int
    dtype: torch.dtype
    device: torch.device
    inputs: List[Tensor]         # differentiable inputs, shared by all contenders
    grad_out: Tensor             # upstream gradient of the output
    #: ``reference(device, dtype) -> Prepared``: the baseline implementation
    #: on another device / dtype (float64 reference, CPU fallback)
    reference: Callable[[torch.device, torch.dtype], Prepared]
    elements: int                # E * H * F: decides whether a float64 reference is cheap
    baseline: str                # contender name the speedups are relative to
    num_edges_eff: int = 0       # edges the layer actually attends over (with self-loops)
    extra: Dict[str, Any] = field(default_factory=dict)
    #: the configured shape, ``"HxC"`` (``heads`` / ``channels`` are the
    #: layer's own: AGNN at shape 4x64 is 1 head of 256 channels)
    shape: str = ""


@dataclass
class Settings:
    warmup: int = 3
    repeats: int = 15
    max_measure_s: Optional[float] = 5.0
    min_repeats: int = 3
    #: rounds of interleaved timing blocks per case (:func:`run_case`)
    interleave: int = 1
    #: fast calls are timed for at least this long (up to ``max_repeats`` runs)
    min_measure_s: Optional[float] = None
    max_repeats: int = 200
    tolerance: Dict[str, float] = field(default_factory=lambda: {
        "float64": 1e-6, "float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2})
    fp64_max_elements: int = 250_000_000
    cpu_fallback: bool = True
    check_grads: bool = True
    floor: float = 1e-2          # see :func:`compare`
    verbose: bool = False
    errors: List[str] = field(default_factory=list)  # tracebacks, written to errors.log
    #: ``time.perf_counter()`` after which no new case starts (``time_budget_s``)
    deadline: Optional[float] = None
    budget_s: Optional[float] = None

    def out_of_time(self) -> Optional[str]:
        """The skip reason once the run's time budget is spent, else ``None``."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            return f"time budget of {self.budget_s:g}s (time_budget_s) used up"
        return None

    @classmethod
    def from_config(cls, cfg: Dict[str, Any]) -> "Settings":
        t, c = cfg.get("timing", {}), cfg.get("check", {})
        s = cls()
        s.warmup = int(t.get("warmup", s.warmup))
        s.repeats = int(t.get("repeats", s.repeats))
        s.max_measure_s = t.get("max_measure_s", s.max_measure_s)
        s.min_repeats = int(t.get("min_repeats", s.min_repeats))
        s.min_measure_s = t.get("min_measure_s", s.min_measure_s)
        s.max_repeats = int(t.get("max_repeats", s.max_repeats))
        s.interleave = int(t.get("interleave", s.interleave))
        s.tolerance = {**s.tolerance, **{k: float(v) for k, v in
                                         (c.get("tolerance") or {}).items()}}
        s.fp64_max_elements = int(c.get("fp64_max_elements", s.fp64_max_elements))
        s.cpu_fallback = bool(c.get("cpu_fallback", s.cpu_fallback))
        s.check_grads = bool(c.get("grads", s.check_grads))
        s.floor = float(c.get("floor", s.floor))
        if cfg.get("time_budget_s"):
            s.budget_s = float(cfg["time_budget_s"])
            s.deadline = time.perf_counter() + s.budget_s
        return s

    def tol(self, dtype: torch.dtype) -> float:
        return float(self.tolerance.get(dtype_name(dtype), 1e-3))


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def parse_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, str(name), None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"unknown floating dtype {name!r}")
    return dt


# --------------------------------------------------------------------------- #
# reference
# --------------------------------------------------------------------------- #

@dataclass
class Reference:
    kind: str                                  # fp64 | <baseline> | <baseline>-cpu-fwd | none
    out: Optional[Tensor] = None               # CPU
    grads: Dict[str, Tensor] = field(default_factory=dict)  # CPU
    note: str = ""
    #: the baseline's own forward+backward (working dtype, case device) ran
    #: out of memory: the baseline contender is reported as OOM without
    #: trying again
    baseline_oom: bool = False


def _drop_grads(tensors) -> None:
    for t in tensors:
        t.grad = None


def _reference_once(case: Case, label: str, dev: torch.device, dt: torch.dtype,
                    grads: bool) -> Reference:
    prep = case.reference(dev, dt)
    xs = [t.detach().to(dev, dt).requires_grad_(grads) for t in case.inputs]
    try:
        if grads:
            out = prep.fn(*xs)
            out.backward(case.grad_out.to(dev, dt))
            g = {f"input{i}": x.grad.detach().cpu() for i, x in enumerate(xs)
                 if x.grad is not None}
            g.update({f"param:{n}": p.grad.detach().cpu() for n, p in prep.params.items()
                      if p.grad is not None})
        else:
            with torch.no_grad():
                out = prep.fn(*xs)
            g = {}
        return Reference(kind=label, out=out.detach().cpu(), grads=g)
    finally:
        _drop_grads(prep.params.values())


#: working dtypes whose fallback reference is the baseline in float32 (their
#: own baseline -- e.g. PyG's bf16 scatter-add over a 60k in-degree node --
#: is too coarse to judge an fp32-accumulating kernel against)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_reference(case: Case, settings: Settings) -> Reference:
    """float64 baseline when cheap, else (fp16 / bf16) the baseline in
    float32, else the baseline in the working dtype, else (GPU OOM) the
    baseline's forward on the CPU; ``kind='none'`` when nothing fits
    (contenders are then timed unchecked).

    The reference sees the working-dtype inputs and weights upcast exactly,
    so it computes the same function as the contenders, without their
    round-off."""
    attempts: List[Tuple[str, torch.device, torch.dtype, bool]] = []
    if case.dtype != torch.float64 and case.elements <= settings.fp64_max_elements:
        attempts.append(("fp64", case.device, torch.float64, settings.check_grads))
    if case.dtype in LOW_PRECISION:
        attempts.append((f"{case.baseline}-fp32", case.device, torch.float32,
                         settings.check_grads))
    attempts.append((case.baseline, case.device, case.dtype, settings.check_grads))
    if settings.cpu_fallback and timing.is_cuda(case.device):
        cdt = case.dtype if case.dtype in (torch.float32, torch.float64) else torch.float32
        attempts.append((f"{case.baseline}-cpu-fwd", torch.device("cpu"), cdt, False))
    notes = []
    base_oom = False
    for label, dev, dt, grads in attempts:
        try:
            ref = _reference_once(case, label, dev, dt, grads)
            ref.note = "; ".join(notes)
            ref.baseline_oom = base_oom
            return ref
        except Exception as e:  # OOM (or a baseline that cannot run at all)
            oom = timing.is_oom(e)
            timing.free_memory(case.device, collect=True)
            notes.append(f"{label} reference: {'OOM' if oom else _short(e)}")
            if oom and label == case.baseline and grads:
                base_oom = True
    return Reference(kind="none", note="; ".join(notes), baseline_oom=base_oom)


def rel_err(y: Tensor, ref: Tensor) -> float:
    y = y.detach().to("cpu", torch.float64)
    r = ref.to(torch.float64)
    if y.shape != r.shape:
        return float("inf")
    if r.numel() == 0:
        return 0.0
    d = (y - r).abs().max()
    den = r.abs().max().clamp_min(1e-30)
    v = float(d / den)
    return float("inf") if v != v else v  # NaN -> inf


def _group(key: str) -> str:
    return key.split(":", 1)[0] if ":" in key else key.rstrip("0123456789")


def compare(out: Tensor, grads: Dict[str, Tensor], ref: Reference,
            floor: float = 1e-2) -> Tuple[float, str]:
    """Largest relative error over the output and the gradients, and where.

    Each tensor's error is ``max|y - ref| / max(max|ref|, floor * G)`` where
    ``G`` is the largest ``max|ref|`` of its group (inputs' gradients,
    parameters' gradients): a gradient that is mathematically zero (e.g. the
    key bias of dot-product attention, softmax being shift-invariant) is
    judged against the scale of its siblings, not against its own round-off.
    """
    worst, where = rel_err(out, ref.out), "out"
    scale: Dict[str, float] = {}
    for k, r in ref.grads.items():
        g = _group(k)
        scale[g] = max(scale.get(g, 0.0), float(r.abs().max()) if r.numel() else 0.0)
    for k, r in ref.grads.items():
        y = grads.get(k)
        if y is None:
            e = float("inf") if (r.numel() and float(r.abs().max()) > 0) else 0.0
        elif tuple(y.shape) != tuple(r.shape):
            e = float("inf")
        elif r.numel() == 0:
            e = 0.0
        else:
            d = float((y.detach().to("cpu", torch.float64) - r.to(torch.float64)).abs().max())
            den = max(float(r.abs().max()), floor * scale[_group(k)], 1e-30)
            e = d / den
            e = float("inf") if e != e else e
        if e > worst:
            worst, where = e, k
    return worst, where


# --------------------------------------------------------------------------- #
# one contender
# --------------------------------------------------------------------------- #

def _short(e: BaseException, n: int = 160) -> str:
    msg = f"{type(e).__name__}: {e}".replace("\n", " ")
    return msg if len(msg) <= n else msg[:n - 3] + "..."


def base_row(case: Case, contender: str) -> Dict[str, Any]:
    g = case.graph
    return {"section": case.section, "graph": g.name, "graph_kind": g.kind,
            "num_nodes": g.num_nodes, "num_edges": g.num_edges,
            "num_edges_eff": case.num_edges_eff or g.num_edges,
            "max_in_degree": case.extra.get("max_in_degree"),
            "case": case.name, "shape": case.shape or f"{case.heads}x{case.channels}",
            "heads": case.heads, "channels": case.channels, "dtype": dtype_name(case.dtype),
            "device": str(case.device),
            "contender": contender, "baseline": case.baseline, "status": "",
            "check": "", "max_err": None, "note": ""}


class _Contender:
    """One contender of a case through its stages (:func:`run_case`): setup,
    first calls and correctness check (:meth:`prepare`), timing blocks
    (:meth:`time_block`, interleaved with the case's other contenders),
    memory (:meth:`memory`) and cleanup (:meth:`close`).  A failure at any
    stage ends it with the status the module docstring lists."""

    def __init__(self, case: Case, name: str, factory: Factory, ref: Reference,
                 settings: Settings):
        self.case, self.name, self.factory, self.ref = case, name, factory, ref
        self.settings = settings
        self.row = base_row(case, name)
        self.stage = "setup"
        self.prep: Optional[Prepared] = None
        self.xs = list(case.inputs)
        self.xr = [t.detach().requires_grad_(True) for t in case.inputs]
        self.failed = False
        self.times: Dict[str, List[float]] = {"fwd_ms": [], "fwdbwd_ms": []}

    def zero(self) -> None:
        _drop_grads(self.xr)
        if self.prep is not None:
            _drop_grads(self.prep.params.values())

    def fwd(self):
        with torch.no_grad():
            return self.prep.fn(*self.xs)

    def step(self) -> None:
        out = self.prep.fn(*self.xr)
        out.backward(self.case.grad_out)

    def guarded(self, stage: Callable[[], Any]) -> bool:
        """``stage()``; ``False`` (the row's status set) where it failed."""
        try:
            stage()
            return True
        except Unavailable as e:
            self.row["status"] = f"n/a: {e}"
        except Skipped as e:
            self.row["status"] = f"skipped: {e}"
        except Exception as e:
            row, case = self.row, self.case
            if timing.is_oom(e):
                row["status"] = "OOM"
                row["note"] = _join(row["note"], f"out of memory during {self.stage}")
            else:
                row["status"] = f"error: {_short(e)}"
                row["note"] = _join(row["note"], f"during {self.stage}")
                self.settings.errors.append(
                    f"[{case.section} {case.graph.name} {case.name} {case.shape} "
                    f"{dtype_name(case.dtype)} {self.name}] during {self.stage}\n"
                    f"{traceback.format_exc()}")
        self.failed = True
        self.close()
        return False

    def prepare(self, base_err: Optional[float]) -> bool:
        """Setup, first calls and the check; ``True`` where timing follows.
        Its check passes within ``max(tol, 2 * base_err)``: the baseline's own
        error against the float64 reference (fp32 round-off of PyG itself)
        widens the tolerance; the baseline is judged by ``tol`` only for
        non-finite results, its error being the yardstick."""
        ok = [False]

        def run():
            row, dev, case = self.row, self.case.device, self.case
            self.mem0 = timing.allocated_mb(dev)
            t0 = time.perf_counter()
            self.prep = self.factory(case)
            timing.sync(dev)
            row["setup_ms"] = (time.perf_counter() - t0) * 1e3
            if self.prep.note:
                row["note"] = self.prep.note
            self.stage = "first call"
            row["first_ms"] = timing.wall_once(self.fwd, dev)
            self.stage = "check"
            self.zero()
            timing.sync(dev)
            t0 = time.perf_counter()
            out = self.prep.fn(*self.xr)
            out.backward(case.grad_out)
            timing.sync(dev)
            row["first_fwdbwd_ms"] = (time.perf_counter() - t0) * 1e3
            row["check"] = self.ref.kind
            if self.ref.kind != "none":
                grads = {f"input{i}": x.grad for i, x in enumerate(self.xr)
                         if x.grad is not None}
                grads.update({f"param:{n}": p.grad for n, p in self.prep.params.items()
                              if p.grad is not None})
                err, where = compare(out, grads, self.ref, self.settings.floor)
                row["max_err"] = err
                row["max_err_at"] = where  # out, input<i> or param:<name>
                tol = self.settings.tol(case.dtype)
                if self.name == case.baseline and err == err and err != float("inf"):
                    tol = max(tol, err)
                elif base_err is not None:
                    tol = max(tol, 2.0 * base_err)
                if not err <= tol:
                    row["status"] = "mismatch"
                    row["note"] = _join(row["note"], f"worst: {where} rel err {err:.3g} > "
                                                     f"tol {tol:g} vs {self.ref.kind}")
                    return
            else:
                row["note"] = _join(row["note"], "unchecked: no reference fits")
            del out
            self.zero()
            mem1 = timing.allocated_mb(dev)
            if self.mem0 is not None and mem1 is not None:
                # memory the contender keeps between calls (caches, converted adjacency)
                row["resident_mb"] = max(mem1 - self.mem0, 0.0)
            ok[0] = True

        if not self.guarded(run):
            return False
        if not ok[0]:
            self.close()
        return ok[0]

    def time_block(self, key: str, first: bool, share: int) -> bool:
        """One block of timed calls (``key``: ``fwd_ms`` or ``fwdbwd_ms``), a
        ``1 / share`` part of the configured repeats and times, after the
        configured warm-up (``first``) or one call."""
        st, dev = self.settings, self.case.device
        fwd = key == "fwd_ms"
        self.stage = "forward timing" if fwd else "forward+backward timing"

        def part(v, lo=1):
            return None if v is None else max(-(-v // share) if isinstance(v, int) else v / share,
                                              lo)

        def run():
            self.times[key] += timing.measure_times(
                self.fwd if fwd else self.step, dev, st.warmup if first else 1,
                part(st.repeats), pre=None if fwd else self.zero,
                max_time_s=part(st.max_measure_s, 0.0), min_repeats=part(st.min_repeats),
                min_time_s=part(st.min_measure_s, 0.0), max_repeats=part(st.max_repeats))
        return self.guarded(run)

    def memory(self) -> None:
        """The timings' summaries, peak memory, and the ``ok`` status."""
        def run():
            for key, ts in self.times.items():
                self.row.update(timing.summarize(ts).as_dict(key))
            self.stage = "memory"
            self.zero()
            dev = self.case.device
            self.row["fwd_peak_mb"] = timing.peak_memory_mb(self.fwd, dev)
            self.row["fwdbwd_peak_mb"] = timing.peak_memory_mb(self.step, dev, pre=self.zero)
            self.row["status"] = "ok"
        if self.guarded(run):
            self.close()

    def close(self) -> None:
        self.zero()
        self.prep = None
        self.xr = []
        st = self.row["status"]
        timing.free_memory(self.case.device, collect=st == "OOM" or st.startswith("error"))


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def run_case(case: Case, contenders: Dict[str, Factory], settings: Settings,
             on_row: Optional[Callable[[Dict[str, Any]], None]] = None,
             before: Optional[Callable[[str], Optional[str]]] = None,
             after: Optional[Callable[[str, Dict[str, Any]], None]] = None
             ) -> List[Dict[str, Any]]:
    """Reference once, then every contender's setup and check in order, then
    their timing, interleaved: ``settings.interleave`` rounds of one block of
    forward calls per contender, then as many of forward+backward calls (a
    contender's repeats split across its blocks), so that a drift of the
    machine's speed during the case (the host of a host-bound call) falls on
    every contender alike and the speedups are ratios from the same minutes.
    Then each contender's memory.  ``before(name)`` may return a skip reason;
    ``after(name, row)`` sees each finished row."""
    try:
        ref = compute_reference(case, settings)
    finally:
        timing.free_memory(case.device)
    rows: List[Dict[str, Any]] = []
    live: List[_Contender] = []
    base_err: Optional[float] = None
    # the baseline first: its own error against the reference sets the yardstick
    order = sorted(contenders.items(), key=lambda kv: kv[0] != case.baseline)
    for name, factory in order:
        reason = before(name) if before is not None else None
        if reason:
            row = base_row(case, name)
            row["status"] = f"skipped: {reason}"
        elif name == case.baseline and ref.baseline_oom:
            row = base_row(case, name)
            row["status"] = "OOM"
            row["note"] = "out of memory in forward+backward (while computing the reference)"
        else:
            c = _Contender(case, name, factory, ref, settings)
            if c.prepare(base_err):
                live.append(c)
            row = c.row
        if name == case.baseline and isinstance(row.get("max_err"), float):
            base_err = row["max_err"]
        rows.append(row)
    rounds = max(int(settings.interleave), 1)
    for key in ("fwd_ms", "fwdbwd_ms"):
        for k in range(rounds):
            for c in live:
                if not c.failed:
                    c.time_block(key, k == 0, rounds)
    for c in live:
        if not c.failed:
            c.memory()
    for row in rows:
        if ref.note:
            row["note"] = _join(row["note"], ref.note)
        if after is not None:
            after(row["contender"], row)
        if on_row is not None:
            on_row(row)
    return rows


def run_cases(section: str, graph: BenchGraph, names, build: Callable[[str], Case],
              baseline: str, contenders: Dict[str, Factory], dtype: torch.dtype, device,
              settings: Settings, on_row: Optional[Callable[[Dict[str, Any]], None]] = None,
              before: Optional[Callable[[str], Optional[str]]] = None,
              after: Optional[Callable[[str, Dict[str, Any]], None]] = None,
              shape: str = "") -> List[Dict[str, Any]]:
    """Every named case of one section on one graph (at one ``shape`` label):
    skipped once the time budget is spent, reported per contender when its
    inputs cannot be built, otherwise :func:`run_case`."""
    rows: List[Dict[str, Any]] = []

    def emit(new: List[Dict[str, Any]]) -> None:
        for r in new:
            if on_row is not None:
                on_row(r)
        rows.extend(new)

    for name in names:
        late = settings.out_of_time()
        if late:
            emit(failed_case_rows(section, graph, name, dtype, device, baseline, contenders,
                                  None, settings, status=f"skipped: {late}", shape=shape))
            continue
        try:
            case = build(name)
        except Exception as e:
            emit(failed_case_rows(section, graph, name, dtype, device, baseline, contenders, e,
                                  settings, shape=shape))
            continue
        rows += run_case(case, contenders, settings, on_row=on_row, before=before, after=after)
        del case
    return rows


def failed_case_rows(section: str, graph: BenchGraph, name: str, dtype: torch.dtype,
                     device, baseline: str, contenders, exc: Optional[BaseException],
                     settings: Settings, status: Optional[str] = None, shape: str = ""
                     ) -> List[Dict[str, Any]]:
    """Rows for every contender of a case that did not run: its inputs could
    not be built (``exc``), or it was skipped (``status``)."""
    note = ""
    if exc is not None:
        oom = timing.is_oom(exc)
        if not oom:
            settings.errors.append(f"[{section} {graph.name} {name} {shape} "
                                   f"{dtype_name(dtype)}] building the case\n"
                                   f"{traceback.format_exc()}")
        timing.free_memory(device, collect=True)
        status = "OOM" if oom else f"error: {_short(exc)}"
        note = "while building the inputs"
    rows = []
    for c in contenders:
        r = {"section": section, "graph": graph.name, "graph_kind": graph.kind,
             "num_nodes": graph.num_nodes, "num_edges": graph.num_edges, "case": name,
             "shape": shape or None, "dtype": dtype_name(dtype), "device": str(device),
             "contender": c,
             "baseline": baseline, "status": status, "check": "", "max_err": None,
             "note": note}
        rows.append(r)
    return rows


def deepcopy_to(module: torch.nn.Module, device, dtype) -> torch.nn.Module:
    return copy.deepcopy(module).to(device=device, dtype=dtype)
