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
* **Training seeds.** Every epoch the training nodes are shuffled with a
  generator seeded from ``(seed, epoch)`` -- the same permutation on every
  rank -- and, under DDP, rank ``r`` takes the ``r``-th of ``world_size``
  equal contiguous shards (PyG's multi-GPU recipe, which splits the seed index
  by rank; the ``< world_size`` remainder is dropped that epoch, so every rank
  runs the same number of steps).
* **Evaluation** is sampled inference with the training fan-out over the
  val / test nodes (sharded by rank, counts all-reduced): it works for every
  model and graph size, while full-graph layer-wise inference would need a
  per-model layer loop and the whole graph on the device.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor

from . import distributed as D
from .metrics import ConfusionCounter

__all__ = ["TorchNeighborSampler", "sample_neighbors", "seed_shard", "make_loader",
           "SampledNodeTraining", "expected_subgraph_size"]

_PYG_LIB_WARNING = r".*without a 'pyg-lib' installation is deprecated.*"


def _native_sampling() -> bool:
    """True when PyG can sample homogeneous graphs itself (pyg-lib or torch-sparse)."""
    import torch_geometric.typing as t
    return bool(t.WITH_PYG_LIB or t.WITH_TORCH_SPARSE)


# ----------------------------------------------------------------------------
# vectorised uniform neighbour sampling on a CSC graph
# ----------------------------------------------------------------------------
def _choose(start: Tensor, deg: Tensor, k: int, replace: bool,
            generator: Optional[torch.Generator]):
    """For frontier node ``i`` (in-edges ``start[i] .. start[i] + deg[i]``), pick
    ``min(k, deg[i])`` distinct edges uniformly (all when ``k < 0``; ``k`` with
    replacement when ``replace``).  Returns ``(pos, dst)`` sorted by ``dst``:
    edge positions in the CSC arrays and the frontier index of each edge."""
    nf = deg.numel()
    ar = torch.arange(nf)
    if k < 0 or (not replace and bool((deg <= k).all())):
        dst = torch.repeat_interleave(ar, deg)
        seg = torch.cumsum(deg, 0) - deg
        return start[dst] + (torch.arange(dst.numel()) - seg[dst]), dst
    if replace:
        cnt = torch.where(deg > 0, torch.full_like(deg, k), torch.zeros_like(deg))
        dst = torch.repeat_interleave(ar, cnt)
        off = (torch.rand(dst.numel(), generator=generator, dtype=torch.float64)
               * deg[dst]).long()
        return start[dst] + off, dst
    parts = []  # (dst, offset in the row, rank among the row's chosen edges)
    # rows with deg <= k: every in-edge
    small = ar[deg <= k]
    if small.numel():
        d = deg[small]
        dst = torch.repeat_interleave(small, d)
        seg = torch.cumsum(d, 0) - d
        off = torch.arange(dst.numel()) - torch.repeat_interleave(seg, d)
        parts.append((dst, off, off))
    # k < deg <= 4k: a random order of the row's edges (random keys), first k kept
    mid = ar[(deg > k) & (deg <= 4 * k)]
    if mid.numel():
        d = deg[mid]
        dst = torch.repeat_interleave(mid, d)
        seg = torch.cumsum(d, 0) - d
        off = torch.arange(dst.numel()) - torch.repeat_interleave(seg, d)
        key = dst.double() + torch.rand(dst.numel(), generator=generator,
                                        dtype=torch.float64) * 0.5
        order = torch.argsort(key)          # grouped by dst, random order inside
        rank = torch.arange(dst.numel()) - torch.repeat_interleave(seg, d)
        sel = rank < k
        keep = order[sel]
        parts.append((dst[keep], off[keep], rank[sel]))
    # deg > 4k: k distinct offsets by rejection (a draw is new with prob. > 3/4)
    big = ar[deg > 4 * k]
    if big.numel():
        M = int(deg.max()) + 1
        need = torch.full((big.numel(),), k, dtype=torch.long)
        keys = torch.empty(0, dtype=torch.long)
        rows = torch.arange(big.numel())
        while True:
            r = torch.repeat_interleave(rows, need)
            off = (torch.rand(r.numel(), generator=generator, dtype=torch.float64)
                   * deg[big[r]]).long()
            keys = torch.unique(torch.cat([keys, r * M + off]))
            need = k - torch.bincount(keys // M, minlength=big.numel())
            if not bool((need > 0).any()):
                break
            need = need.clamp_min(0)
        r = keys // M  # sorted: k consecutive entries per row
        parts.append((big[r], keys % M, torch.arange(r.numel()) - r * k))
    # place every part's entries at (row offset + rank in row): sorted by dst, no sort
    cnt = torch.minimum(deg, torch.full_like(deg, k))
    base = torch.cumsum(cnt, 0) - cnt
    total = int(cnt.sum())
    pos = torch.empty(total, dtype=torch.long)
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
    seed = seed.long().cpu()
    N = colptr.numel() - 1
    if seed.numel() and (int(seed.min()) < 0 or int(seed.max()) >= N):
        raise ValueError(f"'seed' holds node ids outside [0, {N})")
    if torch.unique(seed).numel() != seed.numel():
        raise ValueError("'seed' holds duplicate node ids; pass every seed node once")
    if assoc is None:
        assoc = torch.full((N,), -1, dtype=torch.long)
    colptr = colptr.long()
    n_total = seed.numel()
    assoc[seed] = torch.arange(n_total)
    nodes: List[Tensor] = [seed]
    rows: List[Tensor] = []
    cols: List[Tensor] = []
    edges: List[Tensor] = []
    num_nodes, num_edges = [n_total], []
    frontier, frontier_local = seed, torch.arange(n_total)
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
            assoc[new] = torch.arange(n_total, n_total + new.numel())
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
    empty = torch.empty(0, dtype=torch.long)
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
        self.data = run.bundle.data  # stays on the CPU; batches are moved
        self.fanout = list(cfg.data.num_neighbors)
        self.batch_size = cfg.batch_size
        self.transform = transform
        self.sampler = TorchNeighborSampler(self.data, self.fanout,
                                            share_memory=cfg.data.num_workers > 0)
        self.index = {s: torch.nonzero(self.data[f"{s}_mask"]).flatten()
                      for s in ("train", "val", "test")}
        n_tr = self.index["train"].numel()
        w = run.dist.world_size
        if n_tr < w:
            raise ValueError(f"data.loader=neighbor: {n_tr} training nodes cannot be split "
                             f"over {w} ranks")
        run.log(f"sampling: NeighborLoader, num_neighbors={self.fanout}, batch_size="
                f"{self.batch_size} seed nodes per rank, sampler {self.sampler.backend}"
                + (" (pyg-lib / torch-sparse not installed: vectorised PyTorch sampler)"
                   if self.sampler.backend == "torch" else "")
                + f"; train seeds {n_tr // w} per rank x {w}, eval = sampled inference "
                  f"on val/test seeds")

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
        loader = make_loader(self.data, self.sampler, seeds, self.batch_size,
                             run.cfg.data.num_workers, self.transform)
        counter = ConfusionCounter(run.bundle.num_classes, run.device)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=run.device)
        bar = self._batches(loader, f"epoch {epoch}/{run.cfg.epochs}")
        for i, batch in enumerate(bar):
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
        D.all_reduce_sum(loss_sum)
        counter.all_reduce()
        return {"loss": float(loss_sum[0] / loss_sum[1].clamp(min=1)),
                "metric": counter.metric(run.metric_name)}

    @torch.no_grad()
    def evaluate(self, split: str) -> Dict[str, float]:
        """Sampled inference over the ``split`` nodes, sharded by rank."""
        run = self.run
        d = run.dist
        model = run.model.module if hasattr(run.model, "module") else run.model
        model.eval()
        idx = self.index[split][d.rank::d.world_size]
        loader = make_loader(self.data, self.sampler, idx, self.batch_size,
                             run.cfg.data.num_workers, self.transform)
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

    def evaluate_all(self, test: bool = True) -> Dict[str, Any]:
        return {"val": self.evaluate("val"), "test": self.evaluate("test") if test else None}
