"""Neighbour-sampled mini-batch training for ``dfgnn train`` (``data.loader: neighbor``).

Node classification on one large graph (Planetoid, the synthetic uniform /
power-law graphs) with PyG's :class:`~torch_geometric.loader.NeighborLoader`:
every mini-batch is the ``len(num_neighbors)``-hop sampled subgraph around
``batch_size`` seed nodes, returned as a *homogeneous* ``Data`` whose first
``batch_size`` nodes are the seeds, with ``edge_index`` sorted by target
(destination-major, what the fused layers convert to CSR).  The loss and the
metrics use only the seed nodes.

* **Sampler.** PyG's :class:`~torch_geometric.sampler.NeighborSampler` needs
  ``pyg-lib`` or ``torch-sparse`` for homogeneous graphs (PyG 2.8 warns that
  sampling without ``pyg-lib`` is deprecated, then raises ``ImportError``).
  :class:`TorchNeighborSampler` is a drop-in subclass that, when neither is
  installed, samples with vectorised PyTorch (uniform, without replacement,
  same output layout as ``pyg-lib``); with ``pyg-lib`` / ``torch-sparse`` it
  uses PyG's own routines unchanged.
* **Where** (``data.sample_on``).  ``cpu``: the sampler above inside PyG's
  NeighborLoader with ``data.num_workers`` worker processes, each batch then
  copied to the device.  ``cuda``: :class:`DeviceNeighborSampler` -- the
  graph's CSC, features, labels and masks are moved to the device once and
  every batch is sampled there (:func:`sample_neighbors_device`: the same
  uniform sampling in fixed-size tensors, one host sync per batch), its
  features gathered there, without worker processes or host copies; the
  batches have the NeighborLoader's layout.  Its generator lives on the device,
  seeded from ``(seed, epoch, rank)`` (evaluation: the same subgraphs every
  time), so runs are reproducible and resume exactly.  ``auto``: ``cuda`` when
  the run is on CUDA and the graph takes at most 25 % of the free device
  memory, else ``cpu``; the log says which and why.
* **Training seeds.** Every epoch the training nodes are shuffled with a
  generator seeded from ``(seed, epoch)`` -- the same permutation on every
  rank -- and, under DDP, rank ``r`` takes the ``r``-th of ``world_size``
  equal contiguous shards (PyG's multi-GPU recipe, which splits the seed index
  by rank; the ``< world_size`` remainder is dropped that epoch, so every rank
  runs the same number of steps).
* **Evaluation** (``data.eval``): ``sampled`` (the default) is sampled
  inference with the training fan-out over the val / test nodes (sharded by
  rank, counts all-reduced); ``layerwise`` is exact full-graph inference, one
  layer at a time over all nodes (:func:`layerwise_inference`: every chunk of
  ``eval_batch_size`` target nodes with *all* its in-edges, PyG's
  ``examples/reddit.py`` scheme, reusing the model's own layers), equal to a
  full-batch forward of the same model; ``full`` is one forward over the whole
  graph on the device.
"""
from __future__ import annotations

import functools

import math
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from . import distributed as D
from .metrics import ConfusionCounter, pass_summary

__all__ = ["TorchNeighborSampler", "sample_neighbors", "seed_shard", "make_loader",
           "DeviceNeighborSampler", "DeviceNeighborLoader", "sample_neighbors_device",
           "SampledNodeTraining", "expected_subgraph_size", "model_stages",
           "layerwise_inference", "to_csc"]

_PYG_LIB_WARNING = r".*without a 'pyg-lib' installation is deprecated.*"


def _native_sampling() -> bool:
    """True when PyG can sample homogeneous graphs itself (pyg-lib or torch-sparse)."""
    import torch_geometric.typing as t
    return bool(t.WITH_PYG_LIB or t.WITH_TORCH_SPARSE)


# ----------------------------------------------------------------------------
# vectorised uniform neighbour sampling on a CSC graph
# ----------------------------------------------------------------------------
def _all_in_edges(start: Tensor, deg: Tensor, total: Optional[int] = None):
    """``(pos, dst)`` of every in-edge of every frontier node (``total`` = the
    number of them, if known: no sync), sorted by ``dst``."""
    dev = deg.device
    dst = torch.repeat_interleave(torch.arange(deg.numel(), device=dev), deg,
                                  output_size=total)
    seg = torch.cumsum(deg, 0) - deg
    return start[dst] + (torch.arange(dst.numel(), device=dev) - seg[dst]), dst


def _check_seeds(seed: Tensor, num_nodes: int) -> None:
    """``ValueError`` for seed ids out of range or repeated (two host syncs)."""
    if seed.numel() and (int(seed.min()) < 0 or int(seed.max()) >= num_nodes):
        raise ValueError(f"'seed' holds node ids outside [0, {num_nodes})")
    if torch.unique(seed).numel() != seed.numel():
        raise ValueError("'seed' holds duplicate node ids; pass every seed node once")


def _choose(start: Tensor, deg: Tensor, k: int, replace: bool,
            generator: Optional[torch.Generator]):
    """For frontier node ``i`` (in-edges ``start[i] .. start[i] + deg[i]``), pick
    ``min(k, deg[i])`` distinct edges uniformly (all when ``k < 0``; ``k`` with
    replacement when ``replace``).  Returns ``(pos, dst)`` sorted by ``dst``:
    edge positions in the CSC arrays and the frontier index of each edge.
    Runs on the device of ``deg`` (``generator`` must be on that device); it
    has data-dependent sizes (several host syncs per call): the device sampler
    uses :func:`_choose_padded` instead."""
    dev = deg.device
    nf = deg.numel()
    ar = torch.arange(nf, device=dev)
    if k < 0 or (not replace and bool((deg <= k).all())):
        return _all_in_edges(start, deg)
    if replace:
        cnt = torch.where(deg > 0, torch.full_like(deg, k), torch.zeros_like(deg))
        dst = torch.repeat_interleave(ar, cnt)
        off = (torch.rand(dst.numel(), generator=generator, dtype=torch.float64, device=dev)
               * deg[dst]).long()
        return start[dst] + off, dst
    parts = []  # (dst, offset in the row, rank among the row's chosen edges)
    # rows with deg <= k: every in-edge
    small = ar[deg <= k]
    if small.numel():
        d = deg[small]
        dst = torch.repeat_interleave(small, d)
        seg = torch.cumsum(d, 0) - d
        off = torch.arange(dst.numel(), device=dev) - torch.repeat_interleave(seg, d)
        parts.append((dst, off, off))
    # k < deg <= 4k: a random order of the row's edges (random keys), first k kept
    mid = ar[(deg > k) & (deg <= 4 * k)]
    if mid.numel():
        d = deg[mid]
        dst = torch.repeat_interleave(mid, d)
        seg = torch.cumsum(d, 0) - d
        off = torch.arange(dst.numel(), device=dev) - torch.repeat_interleave(seg, d)
        key = dst.double() + torch.rand(dst.numel(), generator=generator,
                                        dtype=torch.float64, device=dev) * 0.5
        order = torch.argsort(key)          # grouped by dst, random order inside
        rank = torch.arange(dst.numel(), device=dev) - torch.repeat_interleave(seg, d)
        sel = rank < k
        keep = order[sel]
        parts.append((dst[keep], off[keep], rank[sel]))
    # deg > 4k: k distinct offsets by rejection (a draw is new with prob. > 3/4)
    big = ar[deg > 4 * k]
    if big.numel():
        M = int(deg.max()) + 1
        need = torch.full((big.numel(),), k, dtype=torch.long, device=dev)
        keys = torch.empty(0, dtype=torch.long, device=dev)
        rows = torch.arange(big.numel(), device=dev)
        while True:
            r = torch.repeat_interleave(rows, need)
            off = (torch.rand(r.numel(), generator=generator, dtype=torch.float64, device=dev)
                   * deg[big[r]]).long()
            keys = torch.unique(torch.cat([keys, r * M + off]))
            need = k - torch.bincount(keys // M, minlength=big.numel())
            if not bool((need > 0).any()):
                break
            need = need.clamp_min(0)
        r = keys // M  # sorted: k consecutive entries per row
        parts.append((big[r], keys % M, torch.arange(r.numel(), device=dev) - r * k))
    # place every part's entries at (row offset + rank in row): sorted by dst, no sort
    cnt = torch.minimum(deg, torch.full_like(deg, k))
    base = torch.cumsum(cnt, 0) - cnt
    total = int(cnt.sum())
    pos = torch.empty(total, dtype=torch.long, device=dev)
    dst_out = torch.repeat_interleave(ar, cnt)
    for dst, off, rank in parts:
        pos[base[dst] + rank] = start[dst] + off
    return pos, dst_out


def sample_neighbors(colptr: Tensor, row: Tensor, seed: Tensor, num_neighbors: Sequence[int],
                     replace: bool = False, generator: Optional[torch.Generator] = None,
                     assoc: Optional[Tensor] = None):
    """Multi-hop uniform neighbour sampling on a CSC graph (``colptr``, ``row``:
    the sources of the in-edges of each node), the homogeneous output of
    ``pyg-lib``'s ``neighbor_sample``: a
    :class:`~torch_geometric.sampler.SamplerOutput` with ``node`` (global ids,
    the seeds first), ``row`` / ``col`` (local source / target of each sampled
    edge, sorted by target), ``edge`` (positions in the CSC arrays) and the
    per-hop node / edge counts.

    ``assoc`` is an optional ``[N]`` int64 buffer filled with ``-1`` (reused
    between calls, left filled with ``-1``).
    """
    from torch_geometric.sampler import SamplerOutput
    dev = colptr.device
    seed = seed.long().to(dev)
    N = colptr.numel() - 1
    _check_seeds(seed, N)
    if assoc is None:
        assoc = torch.full((N,), -1, dtype=torch.long, device=dev)
    colptr = colptr.long()
    n_total = seed.numel()
    assoc[seed] = torch.arange(n_total, device=dev)
    nodes: List[Tensor] = [seed]
    rows: List[Tensor] = []
    cols: List[Tensor] = []
    edges: List[Tensor] = []
    num_nodes, num_edges = [n_total], []
    frontier, frontier_local = seed, torch.arange(n_total, device=dev)
    try:
        for k in num_neighbors:
            k = int(k)
            if frontier.numel() == 0 or k == 0:
                num_nodes.append(0)
                num_edges.append(0)
                frontier = frontier[:0]
                continue
            start = colptr[frontier]
            deg = colptr[frontier + 1] - start
            pos, dst = _choose(start, deg, k, replace, generator)
            src = row[pos].long()
            new = torch.unique(src[assoc[src] < 0])
            assoc[new] = torch.arange(n_total, n_total + new.numel(), device=dev)
            n_total += new.numel()
            rows.append(assoc[src])
            cols.append(frontier_local[dst])
            edges.append(pos)
            nodes.append(new)
            num_nodes.append(new.numel())
            num_edges.append(pos.numel())
            frontier, frontier_local = new, assoc[new]
        node = torch.cat(nodes)
    finally:
        for t in nodes:
            assoc[t] = -1
    empty = torch.empty(0, dtype=torch.long, device=dev)
    return SamplerOutput(node=node, row=torch.cat(rows) if rows else empty,
                         col=torch.cat(cols) if cols else empty,
                         edge=torch.cat(edges) if edges else empty, batch=None,
                         num_sampled_nodes=num_nodes, num_sampled_edges=num_edges)


def _sampler_base():
    from torch_geometric.sampler import NeighborSampler
    return NeighborSampler


class TorchNeighborSampler(_sampler_base()):
    """PyG's :class:`~torch_geometric.sampler.NeighborSampler` that also works
    without ``pyg-lib`` / ``torch-sparse``: homogeneous, non-temporal,
    non-disjoint, directional sampling then runs :func:`sample_neighbors`
    (vectorised PyTorch); everything else is PyG's.  ``native=True`` forces
    PyG's routines (which need one of those packages)."""

    def __init__(self, data, num_neighbors, *args, native: Optional[bool] = None, **kwargs):
        with warnings.catch_warnings():  # we do not use the deprecated path it warns about
            warnings.filterwarnings("ignore", message=_PYG_LIB_WARNING)
            super().__init__(data, num_neighbors, *args, **kwargs)
        self.native = _native_sampling() if native is None else bool(native)
        self._assoc: Optional[Tensor] = None

    @property
    def backend(self) -> str:
        """Which routine samples: ``pyg-lib``, ``torch-sparse`` or ``torch``."""
        if not self.native:
            return "torch"
        import torch_geometric.typing as t
        return "pyg-lib" if t.WITH_PYG_LIB else "torch-sparse"

    def _sample(self, seed, seed_time=None, **kwargs):
        from torch_geometric.sampler.base import DataType, SubgraphType
        if self.native or self.data_type != DataType.homogeneous:
            return super()._sample(seed, seed_time, **kwargs)
        if seed_time is not None or self.node_time is not None or self.edge_time is not None:
            raise ValueError("TorchNeighborSampler: temporal sampling needs 'pyg-lib'")
        if self.disjoint:
            raise ValueError("TorchNeighborSampler: 'disjoint' sampling needs 'pyg-lib'")
        if self.subgraph_type != SubgraphType.directional:
            raise ValueError(f"TorchNeighborSampler: subgraph_type="
                             f"'{self.subgraph_type.value}' needs 'pyg-lib'")
        if getattr(self, "edge_weight", None) is not None:
            raise ValueError("TorchNeighborSampler: weighted sampling needs 'pyg-lib'")
        if self._assoc is None or self._assoc.numel() != self.num_nodes:
            self._assoc = torch.full((self.num_nodes,), -1, dtype=torch.long)
        out = sample_neighbors(self.colptr, self.row, seed,
                               self.num_neighbors.get_mapped_values(), self.replace,
                               assoc=self._assoc)
        if self.sample_direction == "backward":
            out.row, out.col = out.col, out.row
        return out


# ----------------------------------------------------------------------------
# sampling on the device (data.sample_on: cuda)
# ----------------------------------------------------------------------------
def _choose_padded(start: Tensor, deg: Tensor, k: int, replace: bool,
                   generator: Optional[torch.Generator]):
    """:func:`_choose` in fixed-size tensors, without a host sync: ``k`` slots
    per frontier node.  Returns ``(pos, valid)``, both ``[nf, k]``: slot ``j``
    of row ``i`` holds the CSC position of a chosen in-edge where
    ``valid[i, j]`` (``pos`` is 0 elsewhere).

    Without replacement a row with ``deg <= k`` takes every in-edge, in CSC
    order (slots ``0 .. deg - 1``); a row with ``deg > k`` takes a uniformly
    random ``k``-subset of its edges by Floyd's algorithm (for ``J = deg - k ..
    deg - 1``: draw ``t`` uniform in ``[0, J]``, take ``J`` if ``t`` was taken
    already, else ``t``), vectorised over the rows: ``k`` rounds of ``[nf, j]``
    comparisons.  With replacement every slot of a row with ``deg > 0`` is
    uniform in ``[0, deg)``."""
    dev = deg.device
    nf = deg.numel()
    j = torch.arange(k, device=dev)
    r = torch.rand((nf, k), generator=generator, dtype=torch.float64, device=dev)
    if replace:
        off = torch.minimum((r * deg[:, None]).long(), (deg - 1).clamp_min(0)[:, None])
        valid = (deg > 0)[:, None].expand(nf, k)
    else:
        valid = j[None, :] < deg[:, None]
        J = deg[:, None] - k + j[None, :]                       # [nf, k]
        t = torch.minimum((r * (J + 1)).long(), J)              # uniform in [0, J]
        chosen = torch.empty((nf, k), dtype=torch.long, device=dev)
        for i in range(k):
            ti = t[:, i]
            if i:
                taken = (chosen[:, :i] == ti[:, None]).any(1)
                ti = torch.where(taken, J[:, i], ti)
            chosen[:, i] = ti
        off = torch.where((deg > k)[:, None], chosen, j[None, :])
    pos = torch.where(valid, start[:, None] + off, torch.zeros_like(off))
    return pos, valid


def sample_neighbors_device(colptr: Tensor, row: Tensor, seed: Tensor,
                            num_neighbors: Sequence[int], replace: bool = False,
                            generator: Optional[torch.Generator] = None,
                            assoc: Optional[Tensor] = None, check: bool = True,
                            max_degree: Optional[int] = None):
    """:func:`sample_neighbors` for a graph on the device (any device; CPU
    tensors work too): the same output (a
    :class:`~torch_geometric.sampler.SamplerOutput`, nodes seeds first and new
    nodes of each hop in increasing global id, edges sorted by target, ``edge``
    = CSC positions), the same distribution (``min(k, deg)`` distinct in-edges
    per node, uniform), computed in fixed-size tensors: every hop works on
    ``k`` padded slots per frontier entry (:func:`_choose_padded`) and a padded
    frontier (the sorted candidate sources, duplicates and already-seen nodes
    replaced by the sentinel ``N``, whose degree is 0); new nodes get their
    local ids from a cumulative sum over the sorted candidates.  Where every
    node's in-edges are all taken (``-1`` or ``k >= deg``) the subgraph equals
    :func:`sample_neighbors`'s exactly.

    Host-device syncs: **one per call** (the per-hop node / edge counts, read
    together at the end to compact the padded results), plus one per
    all-neighbours hop (``-1`` or ``k >= max_degree``: its edge count sizes
    the hop; a fan-out that large would only pad every slot list to the
    largest degree).

    Args:
        colptr, row: the graph in CSC form, on the sampling device.
        seed: distinct node ids (moved to ``colptr``'s device).
        num_neighbors: fan-out per hop (``-1`` = all).
        generator: a :class:`torch.Generator` on the device (None: the
            device's default generator).
        assoc: optional ``[N + 1]`` int64 buffer on the device filled with
            ``-1`` (reused between calls, left filled with ``-1``).
        check: validate ``seed`` (range, duplicates: two syncs); the trainer's
            seeds are valid by construction and skip it.
        max_degree: the graph's largest in-degree (None: computed, one sync).
    """
    from torch_geometric.sampler import SamplerOutput
    dev = colptr.device
    seed = seed.long().to(dev)
    N = colptr.numel() - 1
    B = seed.numel()
    if check:
        _check_seeds(seed, N)
    if assoc is None:
        assoc = torch.full((N + 1,), -1, dtype=torch.long, device=dev)
    elif assoc.numel() != N + 1:
        raise ValueError(f"'assoc' must have num_nodes + 1 = {N + 1} entries, "
                         f"got {assoc.numel()}")
    colptr = colptr.long()
    if max_degree is None:
        max_degree = int((colptr[1:] - colptr[:-1]).max()) if N else 0
    empty = torch.empty(0, dtype=torch.long, device=dev)
    zero = torch.zeros((), dtype=torch.long, device=dev)
    assoc[seed] = torch.arange(B, device=dev)
    n_total = torch.full((), B, dtype=torch.long, device=dev)   # on the device: no sync
    frontier, frontier_local = seed, torch.arange(B, device=dev)
    hop_edges = []   # per hop: (src_local, dst_local, pos, valid), flat
    hop_nodes = []   # per hop: (sorted candidates, first occurrence, local id)
    counts = []      # per hop: (#edges, #new nodes), device scalars
    try:
        for k in num_neighbors:
            k = int(k)
            nf = frontier.numel()
            if nf == 0 or k == 0 or row.numel() == 0:
                counts.append((zero, zero))
                frontier, frontier_local = empty, empty
                continue
            live = frontier < N
            fs = torch.where(live, frontier, torch.zeros_like(frontier))
            start = colptr[fs]
            deg = torch.where(live, colptr[fs + 1] - start, torch.zeros_like(start))
            if k < 0 or (k >= max_degree and not replace):   # all in-edges (one sync)
                total = int(deg.sum())
                pos, dst = _all_in_edges(start, deg, total)
                valid = torch.ones(total, dtype=torch.bool, device=dev)
                dst_local = frontier_local[dst]
            else:
                pos, valid = _choose_padded(start, deg, k, replace, generator)
                dst_local = frontier_local[:, None].expand(nf, k).reshape(-1)
                pos, valid = pos.reshape(-1), valid.reshape(-1)
            if pos.numel() == 0:
                counts.append((zero, zero))
                frontier, frontier_local = empty, empty
                continue
            src = torch.where(valid, row[pos].long(), torch.full_like(pos, N))
            # candidates: sources not seen before (assoc[N] stays -1: the sentinel)
            cand = torch.where(assoc[src] < 0, src, torch.full_like(src, N))
            s = torch.sort(cand).values
            first = s < N
            first[1:] &= s[1:] != s[:-1]
            csum = torch.cumsum(first, 0)
            ids = csum + (n_total - 1)    # equal for the duplicates of one node
            hop_nodes.append((s, first, ids))    # (before assoc changes: reset in finally)
            assoc.index_put_((s,), torch.where(s < N, ids, torch.full_like(ids, -1)))
            hop_edges.append((assoc[src], dst_local, pos, valid))
            counts.append((valid.sum(), csum[-1]))
            n_total = n_total + csum[-1]
            frontier = torch.where(first, s, torch.full_like(s, N))
            frontier_local = ids
        # the one sync: every hop's edge and node counts
        c = torch.stack([torch.stack(p) for p in counts]).tolist() if counts else []
        num_edges = [int(e) for e, _ in c]
        num_nodes = [B] + [int(n) for _, n in c]
        E, Nn = sum(num_edges), sum(num_nodes)
        # compact: every valid slot / first occurrence to its place (scatter, no sync);
        # the padding goes to one extra slot at the end, dropped
        node = torch.empty(Nn + 1, dtype=torch.long, device=dev)
        node[:B] = seed
        if hop_nodes:
            s = torch.cat([h[0] for h in hop_nodes])
            first = torch.cat([h[1] for h in hop_nodes])
            ids = torch.cat([h[2] for h in hop_nodes])
            node[torch.where(first, ids, torch.full_like(ids, Nn))] = s
        node = node[:Nn]
        out = torch.empty((3, E + 1), dtype=torch.long, device=dev)
        if hop_edges:
            valid = torch.cat([h[3] for h in hop_edges])
            at = torch.cumsum(valid, 0) - 1
            at = torch.where(valid, at, torch.full_like(at, E))
            out[:, at] = torch.stack([torch.cat([h[i] for h in hop_edges]) for i in range(3)])
        out = out[:, :E]
    finally:   # (index_fill_: ``assoc[i] = -1`` would copy the scalar over, a sync)
        assoc.index_fill_(0, seed, -1)
        for s, first, _ in hop_nodes:
            assoc.index_fill_(0, s, -1)   # every node touched (and the sentinel N)
    return SamplerOutput(node=node, row=out[0], col=out[1], edge=out[2], batch=None,
                         num_sampled_nodes=num_nodes, num_sampled_edges=num_edges)


def _stream_seed(seed: int, epoch: int, rank: int, salt: int) -> int:
    """A 63-bit seed for the device sampler's generator (distinct from the
    trainer's per-epoch torch seed, which drives dropout)."""
    h = (int(seed) * 1_000_003 + int(epoch) * 7919 + int(rank) * 104_729) % (2 ** 61 - 1)
    return (h * 6_364_136_223_846_793_005 + int(salt) * 1_442_695_040_888_963_407) \
        % (2 ** 63 - 1)


class DeviceNeighborSampler:
    """Neighbour sampling of one graph held on ``device``: the batches of
    :func:`make_loader` (PyG's :class:`~torch_geometric.loader.NeighborLoader`
    with :class:`TorchNeighborSampler`) built on the device, without worker
    processes or host copies.

    The graph's CSC (``colptr``, ``row``, and the edge permutation of
    ``e_id``), its node attributes (``x``, ``y``, the masks) and edge
    attributes are moved to ``device`` once; every batch is sampled with
    :func:`sample_neighbors_device` (one host sync) and its attributes are
    gathered there (``x[n_id]``).  A batch has the NeighborLoader's layout:
    the first ``batch_size`` nodes are the seeds (in order), ``edge_index`` is
    sorted by target, with ``n_id``, ``e_id``, ``input_id``, ``batch_size``,
    ``num_sampled_nodes`` / ``num_sampled_edges``.

    Args:
        data: the graph (a :class:`~torch_geometric.data.Data`).
        num_neighbors: fan-out per hop (``-1`` = all).
        device: where to sample.
        csc: optional ``(colptr, row, perm)`` of ``data`` (e.g. a
            :class:`TorchNeighborSampler`'s, so that both samplers list the
            in-edges in the same order); computed otherwise.
    """

    def __init__(self, data, num_neighbors: Sequence[int], device, csc=None,
                 replace: bool = False):
        from torch_geometric.sampler.utils import to_csc as pyg_to_csc
        self.device = torch.device(device)
        self.num_neighbors = [int(k) for k in num_neighbors]
        self.replace = bool(replace)
        N = int(data.num_nodes)
        if csc is None:
            csc = pyg_to_csc(data, device=torch.device("cpu"))
        colptr, row, perm = csc
        dev = self.device
        self.num_nodes = N
        self.colptr = colptr.to(dev, torch.long)
        self.row = row.to(dev)
        self.perm = perm.to(dev) if perm is not None else None
        self.node_attrs: Dict[str, Tensor] = {}
        self.edge_attrs: Dict[str, Tensor] = {}
        for key, value in data.items():
            if key == "edge_index" or not isinstance(value, Tensor):
                continue
            if data.is_node_attr(key):
                self.node_attrs[key] = value.to(dev)
            elif data.is_edge_attr(key):
                self.edge_attrs[key] = value.to(dev)
        self._has_num_nodes = "num_nodes" in data._store
        self.assoc = torch.full((N + 1,), -1, dtype=torch.long, device=dev)
        self.max_degree = int((self.colptr[1:] - self.colptr[:-1]).max()) if N else 0

    @staticmethod
    def index_bytes(num_nodes: int, num_edges: int) -> int:
        """Bytes of the int64 index arrays kept on the device: ``colptr``, the
        ``[N + 1]`` id buffer, ``row`` and the edge permutation."""
        return 8 * (2 * (num_nodes + 2) + 2 * num_edges)

    @staticmethod
    def graph_bytes(data) -> int:
        """Bytes this sampler keeps on the device for ``data``: ``colptr``, the
        ``[N + 1]`` id buffer, ``row`` and the edge permutation (int64) and every
        node / edge attribute."""
        n = DeviceNeighborSampler.index_bytes(int(data.num_nodes), int(data.num_edges))
        for key, value in data.items():
            if key != "edge_index" and isinstance(value, Tensor):
                n += value.numel() * value.element_size()
        return n

    def generator(self, seed: int) -> torch.Generator:
        """A generator on the sampling device seeded with ``seed``."""
        return torch.Generator(device=self.device).manual_seed(int(seed))

    def sample(self, seed: Tensor, generator: Optional[torch.Generator] = None):
        """The :class:`~torch_geometric.sampler.SamplerOutput` around ``seed``
        (trusted: distinct ids of this graph)."""
        return sample_neighbors_device(self.colptr, self.row, seed, self.num_neighbors,
                                       self.replace, generator, assoc=self.assoc,
                                       check=False, max_degree=self.max_degree)

    def batch(self, seed: Tensor, generator: Optional[torch.Generator] = None,
              input_id: Optional[Tensor] = None):
        """The sampled subgraph around ``seed`` as a NeighborLoader batch."""
        from torch_geometric.data import Data
        seed = seed.to(self.device)
        out = self.sample(seed, generator)
        data = Data()
        for key, value in self.node_attrs.items():
            data[key] = value.index_select(0, out.node)
        data.edge_index = torch.stack([out.row, out.col])
        e_id = self.perm[out.edge] if self.perm is not None else out.edge
        for key, value in self.edge_attrs.items():
            data[key] = value.index_select(0, e_id)
        if self._has_num_nodes:
            data.num_nodes = out.node.numel()
        data.n_id = out.node
        data.e_id = e_id
        data.num_sampled_nodes = out.num_sampled_nodes   # host lists (read in the sync)
        data.num_sampled_edges = out.num_sampled_edges
        data.input_id = (input_id if input_id is not None
                         else torch.arange(seed.numel(), device=self.device))
        data.batch_size = seed.numel()
        return data

    def loader(self, input_nodes: Tensor, batch_size: int,
               generator: Optional[torch.Generator] = None,
               transform: Optional[Callable] = None) -> "DeviceNeighborLoader":
        """Batches of ``batch_size`` consecutive ``input_nodes`` (the last one
        smaller), sampled when iterated."""
        return DeviceNeighborLoader(self, input_nodes, batch_size, generator, transform)


class DeviceNeighborLoader:
    """Iterable of :meth:`DeviceNeighborSampler.batch` over consecutive slices of
    ``input_nodes`` (make_loader's batches: same seeds, same ``input_id``);
    each batch is sampled when it is asked for (a capped epoch samples no more)."""

    def __init__(self, sampler: DeviceNeighborSampler, input_nodes: Tensor, batch_size: int,
                 generator: Optional[torch.Generator] = None,
                 transform: Optional[Callable] = None):
        if batch_size <= 0:
            raise ValueError(f"'batch_size' must be > 0, got {batch_size}")
        self.sampler = sampler
        self.input_nodes = input_nodes.long().to(sampler.device, non_blocking=True)
        self.batch_size = int(batch_size)
        self.generator = generator
        self.transform = transform

    def __len__(self) -> int:
        return math.ceil(self.input_nodes.numel() / self.batch_size)

    def __iter__(self):
        n, bs, dev = self.input_nodes.numel(), self.batch_size, self.sampler.device
        for a in range(0, n, bs):
            b = min(a + bs, n)
            batch = self.sampler.batch(self.input_nodes[a:b], self.generator,
                                       torch.arange(a, b, device=dev))
            yield batch if self.transform is None else self.transform(batch)


# ----------------------------------------------------------------------------
# loaders
# ----------------------------------------------------------------------------
def seed_shard(index: Tensor, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
               shuffle: bool = True) -> Tensor:
    """The training seeds of ``rank`` in ``epoch``: ``index`` permuted by a
    generator seeded from ``(seed, epoch)`` (identical on every rank), cut into
    ``world_size`` equal contiguous shards (the remainder is dropped)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"'rank' must be in [0, world_size={world_size}), got {rank}")
    if shuffle:
        g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(epoch) * 7919)
                                          % (2 ** 63 - 1))
        index = index[torch.randperm(index.numel(), generator=g)]
    per = index.numel() // world_size
    return index[rank * per:(rank + 1) * per]


def make_loader(data, sampler, input_nodes: Tensor, batch_size: int, num_workers: int = 0,
                transform: Optional[Callable] = None):
    """A :class:`~torch_geometric.loader.NeighborLoader` over ``input_nodes`` (in
    this order) that samples with ``sampler``."""
    from torch_geometric.loader import NeighborLoader
    return NeighborLoader(data, num_neighbors=sampler.num_neighbors.values,
                          input_nodes=input_nodes, batch_size=batch_size, shuffle=False,
                          neighbor_sampler=sampler, num_workers=num_workers,
                          persistent_workers=False, transform=transform)


def expected_subgraph_size(batch_size: int, num_neighbors: Sequence[int], num_nodes: int,
                           num_edges: int) -> Dict[str, int]:
    """Upper bounds of one sampled subgraph: nodes ``B (1 + f1 + f1 f2 + ...)`` and
    edges ``B (f1 + f1 f2 + ...)``, each capped by the graph (``-1`` = all
    neighbours: the graph's size)."""
    nodes, edges, frontier = batch_size, 0, batch_size
    for k in num_neighbors:
        if k < 0:
            return {"nodes": int(num_nodes), "edges": int(num_edges)}
        frontier = frontier * int(k)
        edges += frontier
        nodes += frontier
    return {"nodes": int(min(nodes, num_nodes)), "edges": int(min(edges, num_edges))}


# ----------------------------------------------------------------------------
# full-graph layer-wise inference
# ----------------------------------------------------------------------------
def model_stages(model):
    """``(pre, stages, post)`` of a trainer model in eval mode: ``pre(x)`` and
    ``post(h)`` are node-wise, every ``stage(h, edge_index)`` is one attention
    layer with the node-wise operations around it (norm, activation,
    residual), so that ``post(stage_L(... stage_1(pre(x), ei) ..., ei))``
    is ``model(x, ei)``.  The output row of a node of a stage depends only on
    its in-edges (and its own row): a stage can run on any subgraph that holds
    all in-edges of the nodes whose rows are kept.

    Built from the modules of :class:`~pyg_dfgnn.train.models.GATNet`,
    :class:`~pyg_dfgnn.train.models.GraphTransformerNet` and
    :class:`~pyg_dfgnn.train.models.AGNNNet` (tested against their forward).
    """
    import torch.nn.functional as F
    from .models import AGNNNet, GATNet, GraphTransformerNet
    if model.training:
        raise ValueError("model_stages: the model must be in eval mode (dropout and "
                         "BatchNorm statistics are not node-wise in training)")
    if isinstance(model, GATNet):
        stages = [functools.partial(model.block, i) for i in range(len(model.convs))]
        if model.readout_kind == "conv":
            return (lambda x: x.float()), stages, (lambda h: h)
        return model.encoder, stages, model.head
    if isinstance(model, GraphTransformerNet):
        if model.lap_pe:
            raise ValueError("layer-wise inference: the Graph Transformer with Laplacian "
                             "PE is for graph data sets")
        return model.encoder, list(model.layers), model.head
    if isinstance(model, AGNNNet):
        return ((lambda x: F.relu(model.encoder(x))),
                [functools.partial(model.propagate_block, i) for i in range(len(model.convs))],
                model.head)
    raise TypeError(f"layer-wise inference: no layer decomposition for "
                    f"{type(model).__name__}; use data.eval=full or sampled")


def to_csc(edge_index: Tensor, num_nodes: int):
    """``(colptr, row)``: the sources of the in-edges of each node, by target."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    order = torch.argsort(dst * num_nodes + src)
    colptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=edge_index.device)
    colptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return colptr, src[order]


@torch.no_grad()
def layerwise_inference(model, x: Tensor, colptr: Tensor, row: Tensor, batch_size: int,
                        device=None) -> Tensor:
    """``model(x, edge_index)`` of a trainer model in eval mode, computed layer by
    layer over all nodes: every layer runs on chunks of ``batch_size`` target
    nodes, each with *all* its in-edges (the subgraph of the targets, listed
    first, and their in-neighbours; edges sorted by target); the kept rows are
    the targets'.  PyG's ``examples/reddit.py`` inference with a one-hop
    ``num_neighbors=[-1]`` loader, done on the device by slicing the CSC graph.

    Peak memory: two ``[N, D]`` activations (input and output of a layer) on
    ``device`` plus one chunk's subgraph, instead of a whole-graph forward.

    Args:
        model: a :func:`~pyg_dfgnn.train.models.build_model` model in eval mode.
        x: node features ``[N, F]`` (any device; moved chunk by chunk).
        colptr, row: the graph in CSC form (:func:`to_csc`: ``row[colptr[v] :
            colptr[v + 1]]`` are the sources of ``v``'s in-edges), e.g. the
            sampler's.
        batch_size: target nodes per chunk (``>= num_nodes``: one whole-graph
            pass per layer).
        device: where the layers run (default: ``x``'s device).
    """
    if batch_size <= 0:
        raise ValueError(f"'batch_size' must be > 0, got {batch_size}")
    N = colptr.numel() - 1
    if x.size(0) != N:
        raise ValueError(f"'x' has {x.size(0)} rows but the graph has {N} nodes")
    device = torch.device(device) if device is not None else x.device
    pre, stages, post = model_stages(model)
    ptr = colptr.cpu()
    row = row.to(device)
    assoc = torch.full((N,), -1, dtype=torch.long, device=device)
    chunks = [(a, min(a + batch_size, N)) for a in range(0, N, batch_size)]

    def nodewise(fn, h):
        out = None
        for a, b in chunks:
            o = fn(h[a:b].to(device))
            if out is None:
                out = o.new_empty((N,) + tuple(o.shape[1:]))
            out[a:b] = o
        return out

    h = nodewise(pre, x)
    for stage in stages:
        out = None
        for a, b in chunks:
            s, e = int(ptr[a]), int(ptr[b])
            src = row[s:e]
            n_t = b - a
            deg = (ptr[a + 1:b + 1] - ptr[a:b]).to(device)
            dst = torch.repeat_interleave(torch.arange(n_t, device=device), deg)
            tgt = torch.arange(a, b, device=device)
            assoc[tgt] = torch.arange(n_t, device=device)
            extra = torch.unique(src[assoc[src] < 0])
            assoc[extra] = torch.arange(n_t, n_t + extra.numel(), device=device)
            src_local = assoc[src]
            assoc[tgt] = -1
            assoc[extra] = -1
            o = stage(h[torch.cat([tgt, extra])], torch.stack([src_local, dst]))[:n_t]
            if out is None:
                out = o.new_empty((N,) + tuple(o.shape[1:]))
            out[a:b] = o
        h = out
    return nodewise(post, h)


# ----------------------------------------------------------------------------
# the trainer's sampled epochs
# ----------------------------------------------------------------------------
class SampledNodeTraining:
    """Sampled train / eval epochs of a ``_Run`` whose data is one graph
    (``bundle.kind == "full"``) and ``data.loader == "neighbor"``.

    ``run`` provides ``cfg``, ``dist``, ``device``, ``model``, ``opt``,
    ``bundle``, ``metric_name``, ``_loss``, ``log`` and ``progress``.
    ``transform`` (optional) is applied to every sampled batch inside the
    loader, e.g. per-batch graph preparation.
    """

    def __init__(self, run, transform: Optional[Callable] = None):
        self.run = run
        cfg = run.cfg
        self.data = run.bundle.data  # stays on the CPU (sample_on=cuda: a copy on the device)
        self.fanout = list(cfg.data.num_neighbors)
        self.batch_size = cfg.batch_size
        self.transform = transform
        on_device, why = self._sample_on_device()
        self.sampler = TorchNeighborSampler(self.data, self.fanout,
                                            share_memory=cfg.data.num_workers > 0
                                            and not on_device)
        #: data.sample_on=cuda: the graph on the device, batches sampled there
        self.device_sampler: Optional[DeviceNeighborSampler] = None
        if on_device:   # the CPU sampler's CSC: both list the in-edges in the same order
            self.device_sampler = DeviceNeighborSampler(
                self.data, self.fanout, run.device,
                csc=(self.sampler.colptr, self.sampler.row, self.sampler.perm))
        self.index = {s: torch.nonzero(self.data[f"{s}_mask"]).flatten()
                      for s in ("train", "val", "test")}
        self.eval_mode = "sampled" if cfg.data.eval == "auto" else cfg.data.eval
        self.eval_batch_size = cfg.data.eval_batch_size or cfg.batch_size
        self._device_graph = None    # data.eval=full: (x, edge_index) on the device
        self._device_labels = None   # data.eval=full / layerwise: y and the masks
        n_tr = self.index["train"].numel()
        w = run.dist.world_size
        if n_tr < w:
            raise ValueError(f"data.loader=neighbor: {n_tr} training nodes cannot be split "
                             f"over {w} ranks")
        run.log(f"sampling: on {run.device if on_device else 'the CPU'} "
                f"(data.sample_on={cfg.data.sample_on}: {why})")
        if on_device:
            head = (f"sampling: on the device ({run.device}), num_neighbors={self.fanout}, "
                    f"batch_size={self.batch_size} seed nodes per rank, vectorised PyTorch "
                    "sampler (1 host sync per batch, no worker processes)")
        else:
            head = (f"sampling: NeighborLoader, num_neighbors={self.fanout}, batch_size="
                    f"{self.batch_size} seed nodes per rank, sampler {self.sampler.backend}"
                    + (" (pyg-lib / torch-sparse not installed: vectorised PyTorch sampler)"
                       if self.sampler.backend == "torch" else ""))
        run.log(head
                + f"; train seeds {n_tr // w} per rank x {w}, eval = "
                + {"sampled": f"sampled inference on val/test seeds ({self.eval_batch_size} "
                              "per batch)",
                   "layerwise": f"layer-wise full-graph inference ({self.eval_batch_size} "
                                "target nodes per chunk)",
                   "full": "one full-graph forward on the device"}[self.eval_mode])

    #: ``data.sample_on=auto``: sample on the device when the graph takes at most
    #: this fraction of the device's free memory
    AUTO_FRACTION = 0.25

    @classmethod
    def auto_fits(cls, nbytes: int, free: Optional[int]) -> bool:
        """``data.sample_on=auto``'s rule: the graph takes at most
        :attr:`AUTO_FRACTION` of the free device memory (``None``: unknown)."""
        return free is None or nbytes <= cls.AUTO_FRACTION * free

    def _sample_on_device(self):
        """``(on_device, why)`` for ``data.sample_on`` (auto: CUDA and the graph
        fits :attr:`AUTO_FRACTION` of the free memory, agreed by every rank)."""
        run = self.run
        mode, dev = run.cfg.data.sample_on, run.device
        if mode == "cpu":
            return False, "as configured"
        if dev.type != "cuda":
            if mode == "cuda":   # check_environment refuses this before anything is loaded
                from .config import ConfigError
                raise ConfigError(f"data.sample_on: 'cuda' but the run's device is {dev}; "
                                  "use data.sample_on=auto or cpu")
            return False, f"the run's device is {dev}"
        need = DeviceNeighborSampler.graph_bytes(self.data)
        free = torch.cuda.mem_get_info(dev)[0]
        size = (f"the graph's CSC, features and labels take {need / 2 ** 30:.2f} GiB, "
                f"{100 * need / max(free, 1):.1f}% of the {free / 2 ** 30:.1f} GiB free")
        if mode == "cuda":
            return True, size
        fits = self.auto_fits(need, free)
        if D.any_flag(not fits, dev):
            return False, (size + f" > {100 * self.AUTO_FRACTION:.0f}%" if not fits else
                           "another rank's device has too little free memory for the graph")
        return True, size + f" <= {100 * self.AUTO_FRACTION:.0f}%"

    def _loader(self, idx: Tensor, batch_size: int, stream: int):
        """Batches around the seeds ``idx``: on the device (``stream`` seeds its
        generator) or PyG's NeighborLoader."""
        run = self.run
        if self.device_sampler is not None:
            g = self.device_sampler.generator(_stream_seed(run.cfg.seed, stream,
                                                           run.dist.rank, 0x5A4D))
            return self.device_sampler.loader(idx, batch_size, g, self.transform)
        return make_loader(self.data, self.sampler, idx, batch_size,
                           run.cfg.data.num_workers, self.transform)

    def _batches(self, loader, desc: Optional[str]):
        if desc is not None and self.run.progress:
            import sys
            from tqdm import tqdm
            return tqdm(loader, desc=desc, leave=False, dynamic_ncols=True, file=sys.stderr)
        return loader

    def _forward(self, model, batch):
        return model(batch.x, batch.edge_index)[:batch.batch_size]

    def train_epoch(self, epoch: int) -> Dict[str, float]:
        run = self.run
        d = run.dist
        run.model.train()
        seeds = seed_shard(self.index["train"], run.cfg.seed, epoch, d.rank, d.world_size)
        loader = self._loader(seeds, self.batch_size, epoch)
        counter = ConfusionCounter(run.bundle.num_classes, run.device)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=run.device)
        steps_full = math.ceil(seeds.numel() / self.batch_size)
        cap = run.cfg.max_steps_per_epoch
        steps = steps_full if cap is None else min(cap, steps_full)
        bar = self._batches(loader, f"epoch {epoch}/{run.cfg.epochs}")
        t0, first_batch_s = time.perf_counter(), None
        for i, batch in enumerate(bar):
            if i >= steps:   # max_steps_per_epoch (the same on every rank)
                break
            if i == 0:       # loader start-up: worker processes, the first sample
                first_batch_s = time.perf_counter() - t0
            batch = batch.to(run.device, non_blocking=True)
            y = batch.y[:batch.batch_size]
            out, loss = run.optimize(lambda: self._forward(run.model, batch), y)
            loss_sum[0] += loss.detach().double() * y.numel()
            loss_sum[1] += y.numel()
            counter.update(out.detach(), y)
            if bar is not loader and i % 10 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
        if bar is not loader:
            bar.close()
        return pass_summary(loss_sum, counter, run.metric_name, steps=steps,
                            steps_full=steps_full, first_batch_s=first_batch_s)

    @torch.no_grad()
    def evaluate(self, split: str) -> Dict[str, float]:
        """Sampled inference over the ``split`` nodes, sharded by rank."""
        run = self.run
        d = run.dist
        model = run.model.module if hasattr(run.model, "module") else run.model
        model.eval()
        idx = self.index[split][d.rank::d.world_size]
        # on the device: the same subgraphs at every evaluation (epoch -1 / -2)
        loader = self._loader(idx, self.eval_batch_size, -1 if split == "val" else -2)
        counter = ConfusionCounter(run.bundle.num_classes, run.device)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=run.device)
        for batch in loader:
            batch = batch.to(run.device, non_blocking=True)
            y = batch.y[:batch.batch_size]
            with run._autocast():
                out = self._forward(model, batch)
                loss = run._loss(out, y)
            loss_sum[0] += loss.double() * y.numel()
            loss_sum[1] += y.numel()
            counter.update(out, y)
        D.all_reduce_sum(loss_sum)
        counter.all_reduce()
        return {"loss": float(loss_sum[0] / loss_sum[1].clamp(min=1)) if loss_sum[1] > 0
                else math.nan, "metric": counter.metric(run.metric_name)}

    @torch.no_grad()
    def full_output(self) -> Tensor:
        """The model's output for every node (``data.eval=layerwise`` / ``full``).
        Every rank computes all of it (the metrics need no all-reduce)."""
        run = self.run
        model = run.net
        model.eval()
        with run._autocast():
            ds = self.device_sampler
            if self.eval_mode == "layerwise":
                if ds is not None:   # the graph is on the device already
                    return layerwise_inference(model, ds.node_attrs["x"], ds.colptr, ds.row,
                                               self.eval_batch_size, device=run.device)
                return layerwise_inference(model, self.data.x, self.sampler.colptr,
                                           self.sampler.row, self.eval_batch_size,
                                           device=run.device)
            if self._device_graph is None:
                self._device_graph = (ds.node_attrs["x"] if ds is not None
                                      else self.data.x.to(run.device),
                                      self.data.edge_index.to(run.device))
            return run.eval_model(*self._device_graph)

    def _split_metrics(self, out: Tensor, split: str) -> Dict[str, float]:
        run = self.run
        if self._device_labels is None:
            ds = self.device_sampler
            self._device_labels = {k: ds.node_attrs[k] if ds is not None
                                   else self.data[k].to(run.device)
                                   for k in ("y", "train_mask", "val_mask", "test_mask")}
        mask = self._device_labels[f"{split}_mask"]
        o, y = out[mask].float(), self._device_labels["y"][mask]
        counter = ConfusionCounter(run.bundle.num_classes, run.device)
        counter.update(o, y)
        return {"loss": float(run._loss(o, y)) if y.numel() else math.nan,
                "metric": counter.metric(run.metric_name)}

    def evaluate_all(self, test: bool = True) -> Dict[str, Any]:
        """Val (and test) metrics, as ``data.eval`` says."""
        if self.eval_mode == "sampled":
            return {"val": self.evaluate("val"),
                    "test": self.evaluate("test") if test else None}
        out = self.full_output()
        return {"val": self._split_metrics(out, "val"),
                "test": self._split_metrics(out, "test") if test else None}
