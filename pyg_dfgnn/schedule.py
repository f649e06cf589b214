"""Dynamic bi-level schedule: how the fused kernels map threads to a graph.

Level 1 (graph): the rows of the destination-major CSR (and the columns of its
transpose, for backward) become *work items* once per graph.  Ordinary rows
are one item each; a *super row* whose degree exceeds ``split`` edges is cut
into segments of ``split`` edges that many groups process in parallel, each
writing a partial (max, sum, accumulator) that a light second pass merges
(DF-GNN's parallelism-maximisation fusion, split-K style).  Segments are
placed first so that the longest items start first.  On the GPU the ordinary
rows follow in *descending degree* (rows of the same degree in CSR order), so
the rows that share a warp and a thread block have about the same length and
the longest start first: a block retires with its longest row, so in CSR
order a power-law graph's blocks idle most of their lanes (its row passes ran
about 2x longer than in degree order), and even a uniform graph's (in-degrees
8-37) 10-19 % longer (docs/KERNELS.md, session 16).
Small graphs that are not skewed keep the CSR order and get no work list
(the kernel walks ``rowptr`` directly): there the host time of ordering a
new batch's rows would cost more than it saves.

Level 2 (row): inside an item, a *group* of ``group`` lanes (1..32) owns one
(row, head): a small feature size packs several rows into one warp (DF-GNN's
packed fusion for batches of small graphs: each score and exp computed once by
one lane, kept in registers), a large one gives a whole warp to a row and
tiles the features.

The split threshold follows the GPU's width: a row is "super" when it holds
more than ``split_factor`` times the edges one group would process if the
edges were spread evenly over every group the GPU runs at once.  The factor
was measured with ``python -m pyg_dfgnn.bench.tune_schedule`` (see
docs/BENCHMARKS.md).  Plans are cached on the :class:`~pyg_dfgnn.graph.CSRGraph`;
:func:`explain_schedule` prints them and :func:`override` forces a schedule.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from .graph import CSRGraph

#: measured default (docs/BENCHMARKS.md, "schedule thresholds")
SPLIT_FACTOR = 2
#: feature vectors per lane (cuda/attention_kernels.cuh: chunks_for): two
#: for scalars and float4, one for 8-element (fp16/bf16) vectors
CHUNKS = 2
#: chunks per lane of the *wide tiles* of dot-like kinds and GATv2 (cuda/attention_kernels.cuh:
#: kWideChunks), float4 and 8-element vectors: a head runs on them where they
#: take fewer lanes than the default tile (152 fp32: 16 lanes, not a warp)
WIDE_CHUNKS = (3, 2)
#: chunks per lane of the wide tiles on 8-byte vectors (kWide8Chunks): a dot-like
#: head that is a multiple of 8 bytes but not of 16 (bf16 heads of 20 or 12)
WIDE8_CHUNKS = 3
#: ... and five of them for fp32 where that takes fewer lanes (kWide8Chunks5:
#: heads of 10, one lane instead of two)
WIDE8_CHUNKS_FP32 = 5
#: AGNN's widest heads (kAgnnWideChunks), float4 and 8-element vectors: where the
#: wide tile still takes 16 lanes or more (fp16 / bf16: the forward's group)
AGNN_WIDE_CHUNKS = (4, 3)
#: fp16 / bf16 heads of the dot-like kinds (2 dot, 3 AGNN) that are 2 mod 4
#: elements wide, up to this many, run unpadded on one lane of five 4-byte
#: vectors (cuda/attention_api.h: half_x5_width)
HALF_X5_MAX = 10


def half_x5(feat: int, dtype: torch.dtype, kind: int) -> bool:
    """Whether the kernels run a ``feat``-wide head of model ``kind`` in
    ``dtype`` unpadded on the five-chunk tile of 4-byte vectors (one lane per
    head): fp16 / bf16 dot attention and AGNN at widths 2, 6 and 10."""
    return (kind in (2, 3) and dtype in (torch.float16, torch.bfloat16)
            and feat % 4 == 2 and feat <= HALF_X5_MAX)


def chunks_for(vec: int) -> int:
    return 1 if vec >= 8 else CHUNKS


MIN_SPLIT = 256
MAX_SPLIT = 8192
#: automatic work-item order (:func:`auto_order`): descending degree for a CSR
#: on the GPU with at least this many edges, or a *skewed* one (its longest row
#: over :data:`MIN_SPLIT` edges and over :data:`SKEW_FACTOR` x the mean
#: degree).  Measured on an H100 (docs/KERNELS.md, session 16): forward kernel
#: 0.54x and row pass 0.47x on a power-law graph, 0.88-0.91x and 0.84-0.87x on
#: the uniform 100k (1.6M edges) and PATTERN-like x128 (0.76M) graphs.  Below
#: the threshold a new batch's ordering (about a dozen small device ops and
#: their host time per plan) costs about what it saves: PATTERN GT batches of
#: 26 graphs (0.16M edges) validated 11-22 % slower in degree order, while the
#: 128-graph GAT / AGNN batches trained 1-20 % faster.  The order is built with
#: device ops only (no sync), so the CUDA-graph steps capture it with their
#: graph views.
ORDER_MIN_EDGES = 1 << 18
SKEW_FACTOR = 8
#: work-item orders (:func:`override`): ``"row"`` = CSR order, ``"degree"`` =
#: descending degree
ORDERS = ("row", "degree")


@dataclass
class Plan:
    group: int = 0                  # lanes per (row, head); 0 = kernel decides
    work: Optional[Tensor] = None   # [W, 4] (row, begin, end, slot) or None = all rows
    merge: Optional[Tensor] = None  # [R, 3] (row, slot_begin, slot_end)
    t_work: Optional[Tensor] = None
    t_merge: Optional[Tensor] = None
    slots: int = 0                  # partial slots of split rows
    t_slots: int = 0
    split: int = 0                  # segment length of super rows (0 = none)
    t_split: int = 0
    reason: str = ""

    @property
    def sched(self):
        return [self.group, self.slots, self.t_slots]


_local = threading.local()


def _forced():
    return getattr(_local, "forced", None)


@contextlib.contextmanager
def override(group: Optional[int] = None, split: Optional[int] = None,
             order: Optional[str] = None):
    """Force a schedule inside the ``with`` block (for benchmarking).

    ``group``: lanes per (row, head), one of 1, 2, 4, 8, 16, 32 (``None``: automatic).
    ``split``: segment length for super rows/columns; ``0`` disables
    splitting (a fixed node-parallel mapping), ``None``: automatic.
    ``order``: ``"row"`` (CSR order) or ``"degree"`` (descending degree) for
    the work items; ``None``: automatic (:func:`auto_order`: degree order for
    large or skewed CSRs on the GPU).
    """
    if group not in (None, 1, 2, 4, 8, 16, 32):
        raise ValueError(f"'group' must be None, 1, 2, 4, 8, 16 or 32, got {group}")
    if split is not None and split < 0:
        raise ValueError(f"'split' must be >= 0, got {split}")
    if order is not None and order not in ORDERS:
        raise ValueError(f"'order' must be None, 'row' or 'degree', got {order!r}")
    old = _forced()
    _local.forced = (group, split, order)
    try:
        yield
    finally:
        _local.forced = old


def _lanes_in_flight(device: torch.device) -> int:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.multi_processor_count * props.max_threads_per_multi_processor
    return 132 * 2048


def _vectors(dtype: torch.dtype) -> Tuple[int, int]:
    """Elements per 16-byte and per 8-byte vector of ``dtype``."""
    vmax = 16 // (torch.finfo(dtype).bits // 8) if dtype != torch.float64 else 2
    return vmax, max(vmax // 2, 1)


def padded_width(feat: int, dtype: torch.dtype) -> int:
    """The vector-friendly head width a layer projects to on GPU-bound calls
    (:mod:`pyg_dfgnn.nn._padded`): ``feat`` rounded up to a 16-byte vector, or
    to an 8-byte one where the 16-byte multiple would pad by more than a
    quarter."""
    vmax, half = _vectors(dtype)
    fp = -(-feat // vmax) * vmax
    if (fp - feat) * 4 > feat:
        fp = -(-feat // half) * half
    return fp


def _vmin(dtype: torch.dtype, kind: int = -1) -> int:
    """Elements of the narrowest vector the CUDA kernels are built for: 8
    bytes, 4 for GAT (kind 0) in fp16 / bf16 (cuda/attention_launch.cuh:
    dispatch)."""
    _, half = _vectors(dtype)
    return max(half // 2, 1) if kind == 0 and dtype in (torch.float16, torch.bfloat16) else half


def op_width(feat: int, dtype: torch.dtype, kind: int = -1) -> int:
    """Feature width the CUDA op runs a ``feat``-wide head of model ``kind`` at
    (cuda/dfgnn_ops.cpp: padded_width): ``feat`` itself when it is a multiple
    of the narrowest vector or a :func:`half_x5` width (no copy), else
    :func:`padded_width` (the op pads)."""
    if feat % _vmin(dtype, kind) == 0 or half_x5(feat, dtype, kind):
        return feat
    return padded_width(feat, dtype)


def auto_group(feat: int, dtype: torch.dtype, kind: int = -1) -> int:
    """Lanes per (row, head) the kernel picks (cuda/attention_launch.cuh:
    choose_group) for the width it runs at."""
    vmax, half = _vectors(dtype)
    if half_x5(feat, dtype, kind):
        return 1
    fp = op_width(feat, dtype, kind)
    vec = vmax if fp % vmax == 0 else (half if fp % half == 0 else _vmin(dtype, kind))

    def lanes(per_lane):
        need = -(-fp // per_lane)
        g = 4 if kind == 0 else 1   # GAT (kind 0) keeps >= 4 lanes
        while g < 32 and g < need:
            g *= 2
        return g
    g = lanes(vec * chunks_for(vec))
    # a wide tile where it takes fewer lanes (cuda/attention_launch.cuh: dispatch;
    # GATv2's fp16 / bf16 backward on 16-byte vectors keeps the default tile: the
    # forward's group is mirrored)
    if kind in (1, 2, 3):
        if fp % vmax == 0:
            g = min(g, lanes(vmax * WIDE_CHUNKS[vmax == 8]))
            if kind == 3 and g >= 16:
                g = min(g, lanes(vmax * AGNN_WIDE_CHUNKS[vmax == 8]))
        elif fp % half == 0:
            w8 = lanes(half * WIDE8_CHUNKS)
            if w8 < g and dtype == torch.float32:   # (five chunks where three pay)
                w8 = min(w8, lanes(half * WIDE8_CHUNKS_FP32))
            g = min(g, w8)
    return g


def auto_split(num_edges: int, heads: int, group: int, device: torch.device) -> int:
    """Segment length above which a row is split (0 when no split is useful)."""
    groups = max(_lanes_in_flight(device) // group, 1)
    per_group = num_edges * heads / groups
    split = 1
    while split < SPLIT_FACTOR * per_group:
        split *= 2
    return int(min(max(split, MIN_SPLIT), MAX_SPLIT))


def is_skewed(max_degree: int, num_edges: int, num_rows: int) -> bool:
    """Whether a CSR's longest row exceeds :data:`MIN_SPLIT` edges and
    :data:`SKEW_FACTOR` times the mean degree; host values only (no sync)."""
    return max_degree > MIN_SPLIT and max_degree > SKEW_FACTOR * num_edges / max(num_rows, 1)


def _env_order() -> str:
    """``PYG_DFGNN_ORDER``: ``auto`` (default), ``row`` or ``degree`` for every
    automatic plan of the process (an A/B switch for whole training runs;
    :func:`override` takes precedence)."""
    env = os.environ.get("PYG_DFGNN_ORDER", "") or "auto"
    if env not in ("auto",) + ORDERS:
        raise ValueError(f"PYG_DFGNN_ORDER: must be 'auto', 'row' or 'degree', got {env!r}")
    return env


def auto_order(max_degree: int, num_edges: int, num_rows: int, device: torch.device) -> str:
    """The automatic work-item order of a CSR (:data:`ORDER_MIN_EDGES`):
    ``"degree"`` for a large or skewed CSR on the GPU, else ``"row"`` (the CPU
    kernels take no work list)."""
    if torch.device(device).type != "cuda":
        return "row"
    if num_edges >= ORDER_MIN_EDGES or is_skewed(max_degree, num_edges, num_rows):
        return "degree"
    return "row"


def work_items(rowptr: Tensor, split: int, order: str = "row"):
    """Work items of a CSR: ``(work [W, 4], merge [R, 3], slots)``, or Nones
    when no row is longer than ``split`` and ``order`` is ``"row"``.  Segments
    of split rows come first; with ``order="degree"`` the other rows follow in
    descending degree (ties in row order), else in row order.  ``split <= 0``
    splits nothing.  Pure torch ops, on rowptr's device."""
    if order not in ORDERS:
        raise ValueError(f"'order' must be 'row' or 'degree', got {order!r}")
    n = rowptr.numel() - 1
    if n <= 0 or (split <= 0 and order == "row"):
        return None, None, 0
    rp = rowptr.long()
    deg = rp[1:] - rp[:-1]
    dev = rp.device
    rows = torch.arange(n, device=dev)
    heavy = deg > split if split > 0 else None
    if heavy is None or not bool(heavy.any()):   # (no sync without a split length)
        if order == "row":
            return None, None, 0
        work = _light_items(rp, rows, deg, order)
        empty = torch.zeros(0, 3, dtype=rowptr.dtype, device=dev)
        return work.to(rowptr.dtype).contiguous(), empty, 0
    h_rows = rows[heavy]
    h_nseg = (deg[heavy] + split - 1) // split
    slots = int(h_nseg.sum())
    seg_row = torch.repeat_interleave(h_rows, h_nseg, output_size=slots)
    first = torch.cumsum(h_nseg, 0) - h_nseg
    seg_k = torch.arange(slots, device=dev) - torch.repeat_interleave(first, h_nseg,
                                                                       output_size=slots)
    seg_b = rp[seg_row] + seg_k * split
    seg_e = torch.minimum(seg_b + split, rp[seg_row + 1])
    heavy_items = torch.stack([seg_row, seg_b, seg_e, torch.arange(slots, device=dev)], 1)
    light = ~heavy
    work = torch.cat([heavy_items, _light_items(rp, rows[light], deg[light], order)], 0)
    merge = torch.stack([h_rows, first, first + h_nseg], 1)
    dt = rowptr.dtype
    return work.to(dt).contiguous(), merge.to(dt).contiguous(), slots


def _light_items(rp: Tensor, rows: Tensor, deg: Tensor, order: str) -> Tensor:
    """``[len(rows), 4]`` work items of unsplit rows (slot -1), in row order or
    by descending degree."""
    if order == "degree":
        rows = rows[torch.sort(deg, descending=True, stable=True).indices]
    return torch.stack([rows, rp[rows], rp[rows + 1], torch.full_like(rows, -1)], 1)


def plan_for(graph: CSRGraph, kind: int, feat: int, heads: int, dtype: torch.dtype) -> Plan:
    """The (cached) plan for this graph and problem shape."""
    forced = _forced()
    key = ("plan", kind, feat, heads, dtype, forced)
    plan = graph.plans.get(key)
    if plan is not None:
        return plan
    f_group, f_split, f_order = forced if forced is not None else (None, None, None)
    group = f_group or auto_group(feat, dtype, kind)  # mirrors the kernel's choose_group
    if f_split is None:
        split = auto_split(graph.num_edges, heads, group, graph.device)
    else:
        split = f_split
    split_rows = split if graph.max_in_degree > split else 0
    split_cols = split if graph.max_out_degree > split else 0
    E = graph.num_edges
    if f_order is not None:
        order_rows = order_cols = f_order
    elif f_split == 0:   # the fixed node-parallel mapping
        order_rows = order_cols = "row"
    elif _env_order() != "auto":
        order_rows = order_cols = _env_order()
    else:
        order_rows = auto_order(graph.max_in_degree, E, graph.num_dst, graph.device)
        order_cols = auto_order(graph.max_out_degree, E, graph.num_src, graph.device)
    work, merge, slots = work_items(graph.rowptr, split_rows, order_rows)
    t_work, t_merge, t_slots = work_items(graph.t_rowptr, split_cols, order_cols)
    why = []
    why.append(f"group={group} lanes per (row, head)"
               + (" (forced)" if f_group else " (automatic from F)"))
    if split_rows:
        why.append(f"{merge.size(0)} super rows (in-degree > {split}) cut into {slots} "
                   f"segments of {split} edges")
    else:
        why.append(f"no super rows (max in-degree {graph.max_in_degree} <= split {split})"
                   if split else "row splitting disabled")
    if split_cols:
        why.append(f"{t_merge.size(0)} super columns (out-degree > {split}) cut into "
                   f"{t_slots} segments")
    if work is not None or t_work is not None:
        why.append(f"work items by {order_rows} (rows) / {order_cols} (columns)"
                   + (" (forced)" if f_order else ""))
    plan = Plan(group=group if f_group else 0, work=work, merge=merge, t_work=t_work,
                t_merge=t_merge, slots=slots, t_slots=t_slots, split=split_rows,
                t_split=split_cols, reason="; ".join(why))
    graph.plans[key] = plan
    return plan


def explain_schedule(graph: CSRGraph, kind: int = 0, feat: int = 64, heads: int = 4,
                     dtype: torch.dtype = torch.float32) -> str:
    """Human-readable description of the schedule chosen for ``graph``."""
    from .ops.reference import KIND_NAMES
    plan = plan_for(graph, kind, feat, heads, dtype)
    deg = graph.in_degree().float()
    stats = (f"rows={graph.num_dst} edges={graph.num_edges} mean in-degree="
             f"{graph.mean_in_degree:.1f} max in-degree={graph.max_in_degree} "
             f"max out-degree={graph.max_out_degree}")
    if deg.numel():
        q = torch.quantile(deg.cpu(), torch.tensor([0.5, 0.99])).tolist()
        stats += f" median={q[0]:.0f} p99={q[1]:.0f}"
    return (f"{KIND_NAMES.get(kind, kind)} F={feat} H={heads} {dtype}: {stats}\n"
            f"  schedule: {plan.reason}\n"
            f"  CUDA backward: {backward_path(kind, heads, feat, dtype)}")


#: the head width in bytes under which dot attention's stored backward keeps
#: alpha alone per edge (cuda/attention_api.h: kWideHeadBytes; GATv2 and bf16
#: too with ``PYG_DFGNN_ALPHA_MODE=1``)
WIDE_HEAD_BYTES = 128


def backward_path(kind: int, heads: int, feat: Optional[int] = None,
                  dtype: Optional[torch.dtype] = None) -> str:
    """The CUDA backward's passes for ``kind`` and ``heads`` (and the head
    width ``feat`` in ``dtype``, where given) (cuda/attention_launch.cuh:
    bwd_impl), in stored mode and in recompute mode
    (:data:`pyg_dfgnn.ops.fused.BACKWARD_MODES`)."""
    from .ops.reference import DOT, GAT
    packed = (dtype == torch.bfloat16)   # (bf16: per-edge values in bf16, kPackedEdges)
    if kind == GAT and heads <= 32:   # cuda/attention_launch.cuh: bwd_gat_single_gather
        stored = ("one feature gather per edge (column pass emitting alpha~ dP, then scalar "
                  "row and source passes; stored mode keeps E x H x 4 bytes)")
    elif (kind == DOT and feat is not None and dtype in (torch.float32, torch.float16)
          and feat * torch.finfo(dtype).bits // 8 < WIDE_HEAD_BYTES):   # kColAlpha
        stored = ("row pass + column pass forming dP; stored mode keeps fp32 alpha per edge "
                  "(E x H x 4 bytes; without edge features, else g and alpha~: E x H x 8)")
    elif packed:
        stored = ("row pass + column pass; stored mode keeps bf16 g and alpha~ per edge "
                  "(E x H x 4 bytes)")
    else:
        stored = ("row pass + column pass; stored mode keeps fp32 g and alpha~ per edge "
                  "(E x H x 8 bytes)")
    lean = ("" if kind == GAT else "; PYG_DFGNN_ALPHA_MODE=1: alpha alone at heads under "
            f"{WIDE_HEAD_BYTES} bytes without edge features (bf16: E x H x 2 bytes)")
    auto = ("" if kind == GAT else "; auto mode recomputes where memory is short, and on "
            "graphs of at most 32 edges per source column where the stored arrays would "
            "outweigh twice the source rows (dot attention in fp16 / bf16: once; wide "
            "tiles: e.g. heads of 10-12 at average degree 16, dot attention's half "
            "heads of 20 above 10)")
    return (f"{stored}; recompute mode: row pass + recomputing column pass (nothing per "
            f"edge){auto}{lean}")
