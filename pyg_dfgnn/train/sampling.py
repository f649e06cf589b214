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
from .metrics import ConfusionCounter

__all__ = ["TorchNeighborSampler", "sample_neighbors", "seed_shard", "make_loader",
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
        self.data = run.bundle.data  # stays on the CPU; batches are moved
        self.fanout = list(cfg.data.num_neighbors)
        self.batch_size = cfg.batch_size
        self.transform = transform
        self.sampler = TorchNeighborSampler(self.data, self.fanout,
                                            share_memory=cfg.data.num_workers > 0)
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
        run.log(f"sampling: NeighborLoader, num_neighbors={self.fanout}, batch_size="
                f"{self.batch_size} seed nodes per rank, sampler {self.sampler.backend}"
                + (" (pyg-lib / torch-sparse not installed: vectorised PyTorch sampler)"
                   if self.sampler.backend == "torch" else "")
                + f"; train seeds {n_tr // w} per rank x {w}, eval = "
                + {"sampled": f"sampled inference on val/test seeds ({self.eval_batch_size} "
                              "per batch)",
                   "layerwise": f"layer-wise full-graph inference ({self.eval_batch_size} "
                                "target nodes per chunk)",
                   "full": "one full-graph forward on the device"}[self.eval_mode])

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
        D.all_reduce_sum(loss_sum)
        counter.all_reduce()
        return {"loss": float(loss_sum[0] / loss_sum[1].clamp(min=1)),
                "metric": counter.metric(run.metric_name), "steps": steps,
                "steps_full": steps_full, "first_batch_s": first_batch_s}

    @torch.no_grad()
    def evaluate(self, split: str) -> Dict[str, float]:
        """Sampled inference over the ``split`` nodes, sharded by rank."""
        run = self.run
        d = run.dist
        model = run.model.module if hasattr(run.model, "module") else run.model
        model.eval()
        idx = self.index[split][d.rank::d.world_size]
        loader = make_loader(self.data, self.sampler, idx, self.eval_batch_size,
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

    @torch.no_grad()
    def full_output(self) -> Tensor:
        """The model's output for every node (``data.eval=layerwise`` / ``full``).
        Every rank computes all of it (the metrics need no all-reduce)."""
        run = self.run
        model = run.net
        model.eval()
        with run._autocast():
            if self.eval_mode == "layerwise":
                return layerwise_inference(model, self.data.x, self.sampler.colptr,
                                           self.sampler.row, self.eval_batch_size,
                                           device=run.device)
            if self._device_graph is None:
                self._device_graph = (self.data.x.to(run.device),
                                      self.data.edge_index.to(run.device))
            return run.eval_model(*self._device_graph)

    def _split_metrics(self, out: Tensor, split: str) -> Dict[str, float]:
        run = self.run
        if self._device_labels is None:
            self._device_labels = {k: self.data[k].to(run.device) for k in
                                   ("y", "train_mask", "val_mask", "test_mask")}
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
