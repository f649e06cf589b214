"""Training and evaluation steps replayed as CUDA graphs (``cuda_graphs: true``).

A training step on a batch of small graphs (PATTERN, CLUSTER) is host-bound:
the GPU finishes each of the model's few hundred small kernels before Python
has launched the next one (docs/BENCHMARKS.md: the fused Graph Transformer
step was 27-29% GPU-busy).  A CUDA graph records the whole step once --
graph preparation, forward, loss, backward and the optimiser update -- and
replays it with one launch, so the host no longer sets the pace.

A graph replays fixed shapes and fixed addresses, while every batch has other
sizes.  :class:`StaticBatches` therefore packs each batch into buffers of
fixed *capacity*, from a small ascending ladder of size *buckets* (each with
its own captured graphs, :class:`GraphedSteps`): a batch goes to the smallest
bucket that holds its node and edge totals; the largest bucket is the worst
case -- the largest totals any ``batch_size`` graphs of the data set can have
-- so every batch fits, and the ones below it are placed from the totals of
random batches (:func:`bucket_capacities`), which concentrate far below the
worst case.  In its bucket a batch has

* nodes: the bucket's capacity plus one padding node (the bucket's last
  row); the rows past the batch's nodes are zero and masked;
* edges: likewise; the edges past the batch's are padding.  The layers get
  them as loops on the padding node (valid indices, so PyG's own layers run
  too); the fused layers' CSR views leave them out entirely (built inside the
  graph, with the edges past the batch sent to a row that does not exist), so
  no kernel spends time on them.

Nothing of a padding row reaches a real one: padding nodes have no edges to
real nodes, dense layers act row by row, BatchNorm takes its statistics over
the real rows only (``node_mask`` of the models in
:mod:`pyg_dfgnn.train.models`), and the loss and the metrics count real nodes
only.  So a step equals the eager step on the unpadded batch up to
floating-point summation order (``tests/train/test_graphed.py`` checks that in
float64).

What a replay cannot redo is refused when the run starts (``ConfigError``,
exit 2): host-side decisions that depend on the batch (fp16's GradScaler,
DDP's bucket hooks, the dynamic schedule's row splitting for in-degrees over
:data:`~pyg_dfgnn.schedule.MIN_SPLIT`), an attention dropout seeded from the
host, and optimisers without a capturable implementation.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from .. import graph as _graph

__all__ = ["StaticBatches", "GraphedSteps", "capacity", "worst_case", "batch_totals",
           "bucket_capacities"]

#: eager steps before a capture (lazy initialisation, optimiser state)
WARMUP_STEPS = 3

#: ``cuda_graph_buckets`` -> the batch-total quantiles of the buckets below the
#: tail bucket (see :func:`bucket_capacities`)
BUCKET_QUANTILES: Dict[int, Tuple[float, ...]] = {
    1: (), 2: (), 3: (0.9,), 4: (0.5, 0.9), 5: (0.5, 0.9, 0.99)}
#: the tail bucket: this many standard deviations of the batch totals above
#: their mean (or the largest sampled total, if larger)
TAIL_SD = 5.0
#: the largest ``cuda_graph_buckets`` (every bucket used costs a capture)
MAX_BUCKETS = max(BUCKET_QUANTILES)
#: bucket capacities below the worst case are rounded up to a multiple of this
BUCKET_ALIGN = 64
#: random batches drawn (over all stores) to place the bucket bounds
BUCKET_SAMPLES = 8192

#: the side stream of every graphed run in this process, per CUDA device index:
#: cuBLAS keeps a workspace (33-65 MiB on an H100) for every stream it ran on,
#: for the life of the process, so a new stream per run would leave one behind
#: per run (measured in session 10's bench: +65 MiB per training run)
_SIDE_STREAMS: Dict[int, Any] = {}


def capacity(sizes: np.ndarray, batch_size: int) -> int:
    """The largest total of ``batch_size`` entries of ``sizes``."""
    if sizes.size == 0:
        return 0
    k = min(int(batch_size), int(sizes.size))
    return int(np.sort(sizes)[-k:].sum())


def _sizes(store: Any) -> np.ndarray:
    """``[num_graphs, 3]``: nodes, edges and non-loop edges of each graph."""
    return np.stack([store.n, store.e, store.e - store.loops], 1).astype(np.int64)


def worst_case(stores: Sequence[Any], batch_size: int) -> Tuple[int, int, int]:
    """The capacity every batch fits: the largest node, edge and non-loop edge
    totals any ``batch_size`` graphs of one of ``stores`` can have (each
    maximised on its own)."""
    per = [_sizes(s) for s in stores]
    return tuple(max(capacity(p[:, j], batch_size) for p in per) for j in range(3))


def batch_totals(stores: Sequence[Any], batch_size: int, samples: int = BUCKET_SAMPLES,
                 seed: int = 0) -> np.ndarray:
    """``[S, 3]`` node, edge and non-loop edge totals of random batches of
    ``batch_size`` graphs: each store contributes its share of the graphs of
    ``samples``, as full batches of random permutations (an epoch's shuffled
    batches); a store of fewer graphs than ``batch_size`` is one batch."""
    rng = np.random.default_rng(seed)
    B = int(batch_size)
    G = sum(int(s.num_graphs) for s in stores)
    out = []
    for s in stores:
        sz = _sizes(s)
        g = sz.shape[0]
        per = g // B
        if per == 0:
            out.append(sz.sum(0, keepdims=True))
            continue
        want = max(1, -(-int(samples) * g // G))
        parts, have = [], 0
        while have < want:
            idx = rng.permutation(g)[:per * B].reshape(per, B)
            parts.append(sz[idx].sum(1))
            have += per
        out.append(np.concatenate(parts)[:want])
    return np.concatenate(out)


def bucket_capacities(stores: Sequence[Any], batch_size: int, num_buckets: int,
                      samples: int = BUCKET_SAMPLES, seed: int = 0) -> List[Tuple[int, int, int]]:
    """The ascending ``(nodes, edges, non-loop edges)`` capacities of at most
    ``num_buckets`` buckets, placed from the totals of random batches
    (:func:`batch_totals`, seeded: the same for every run on the same data),
    each total on its own:

    * the last bucket is the worst case (:func:`worst_case`), so every batch
      fits (``num_buckets=1``: this one only);
    * below it (``num_buckets >= 2``) the *tail* bucket: the mean of the totals
      plus :data:`TAIL_SD` standard deviations, or the largest sampled total
      if larger.  A total is a sum of ``batch_size`` graph sizes, about normal,
      so a random batch exceeds it with a probability of about 3e-7: in
      practice no batch needs the worst case, whose graph is never captured
      (for PATTERN at batch 128 the worst case is far above any real batch);
    * below the tail (``num_buckets >= 3``) buckets that hold the
      :data:`BUCKET_QUANTILES` shares of the batches (3: 90%; 4: 50%, 90%; 5:
      50%, 90%, 99%): a batch's *level* is the largest of its totals'
      empirical quantile levels; the bucket for share ``q`` holds, in every
      total, the batches whose level is at most the ``q``-quantile of the
      levels (the per-total quantiles alone would hold fewer batches where the
      totals are not fully correlated).

    Every bucket below the worst case is rounded up to a multiple of
    :data:`BUCKET_ALIGN` and capped at the worst case; equal buckets are
    merged (small data sets may have fewer buckets)."""
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, (int, np.integer)) \
            or not 1 <= num_buckets <= MAX_BUCKETS:
        raise ValueError(f"'num_buckets' must be an int in 1..{MAX_BUCKETS}, got {num_buckets!r}")
    worst = np.asarray(worst_case(stores, batch_size), np.int64)
    bounds = []
    if num_buckets >= 2:
        tot = batch_totals(stores, batch_size, samples, seed)
        S = tot.shape[0]
        level = np.max([np.searchsorted(np.sort(tot[:, j]), tot[:, j], side="right")
                        for j in range(tot.shape[1])], axis=0) / S
        for q in BUCKET_QUANTILES[int(num_buckets)]:
            held = level <= np.quantile(level, q, method="higher")
            bounds.append(tot[held].max(0))
        mean, sd = tot.mean(0), tot.std(0)
        bounds.append(np.maximum(tot.max(0), np.ceil(mean + TAIL_SD * sd)))
    ladder = []
    for b in bounds:
        b = np.asarray(b, np.int64)
        b = np.minimum(-(-b // BUCKET_ALIGN) * BUCKET_ALIGN, worst)
        ladder.append(tuple(int(v) for v in b))
    ladder.append(tuple(int(v) for v in worst))
    out: List[Tuple[int, int, int]] = []
    for b in ladder:   # the bounds ascend in every total; drop repeats
        if not out or b != out[-1]:
            out.append(b)
    return out


class StaticBatches:
    r"""Fixed-capacity device buffers for the batches of one or more
    :class:`~pyg_dfgnn.data.GraphBatcher` stores (see the module docstring).

    The batches go to *buckets*: an ascending ladder of ``(nodes, edges)``
    capacities whose largest is the worst case (:func:`bucket_capacities`).
    :meth:`load` puts a batch in the smallest bucket that holds its totals
    (known on the host from the store's per-graph sizes) and packs its graphs
    on the host (into pinned memory) and copies them into the buffers, which
    have the largest bucket's size: a bucket is a prefix of them, with its
    own padding node (its last node row) and padding edges.  :meth:`inputs`
    turns the bucket's prefix into the model's inputs with device ops of
    fixed shapes only (no host sync), so it can run inside a CUDA graph
    capture; each bucket has other shapes, hence its own graphs.

    Args:
        stores: the stores whose batches will be loaded (the capacities cover
            every one of them).
        batch_size: graphs per batch.
        device: the training device.
        views: the CSR views to build for the fused layers (as
            :class:`~pyg_dfgnn.data.GraphBatcher`'s ``views``); empty for PyG's
            layers.
        buckets: the number of buckets (``1``: the worst case only; see
            :func:`bucket_capacities`), or the capacities themselves, an
            ascending sequence of ``(nodes, edges)`` or ``(nodes, edges,
            non-loop edges)`` -- capped at the worst case, which is appended
            where the last one is smaller.
    """

    def __init__(self, stores: Sequence[Any], batch_size: int, device: torch.device,
                 views: Sequence[bool] = (), buckets: Union[int, Sequence[Sequence[int]]] = 1):
        if not stores:
            raise ValueError("'stores' is empty")
        self.stores = list(stores)
        self.B = int(batch_size)
        self.device = torch.device(device)
        self.views = tuple(bool(v) for v in views)
        first = self.stores[0]
        self.node_keys = list(first.node_attrs)
        for s in self.stores[1:]:
            if list(s.node_attrs) != self.node_keys:
                raise ValueError("the stores' node attributes differ: "
                                 f"{sorted(s.node_attrs)} vs {sorted(self.node_keys)}")
        self.loops = any(s.ei_nl is not None for s in self.stores) and any(self.views)
        ladder = self._ladder(buckets)
        if not self.loops:   # no non-loop edge lists: only nodes and edges count
            ladder = [(n, e, e) for n, e, _ in ladder]
        #: ascending ``(nodes, edges, non-loop edges)`` capacities
        self.buckets: List[Tuple[int, int, int]] = [
            b for i, b in enumerate(ladder) if i == 0 or b != ladder[i - 1]]
        # the largest bucket: the worst case, the buffers' size
        self.n_cap, self.e_cap, self.enl_cap = self.buckets[-1]
        self.num_nodes = self.n_cap + 1        # + one padding node
        # degree maxima of each view over every graph (the schedule's input)
        self.max_deg = {v: (max(int(s.stats[v][0].max(initial=0)) for s in self.stores),
                            max(int(s.stats[v][1].max(initial=0)) for s in self.stores))
                        for v in self.views}
        pin = self.device.type == "cuda"
        dev = self.device

        def pair(shape, dtype):
            return (torch.zeros(shape, dtype=dtype, pin_memory=pin),
                    torch.zeros(shape, dtype=dtype, device=dev))

        Nr = self.num_nodes
        self._bufs: Dict[str, Tuple[Tensor, Tensor]] = {}
        for k in self.node_keys:
            t = first.node_attrs[k]
            self._bufs["x:" + k] = pair((Nr,) + tuple(t.shape[1:]), t.dtype)
        idt = max((s.ei.dtype for s in self.stores), key=lambda d: torch.iinfo(d).bits)
        self._bufs["src"] = pair((self.e_cap,), idt)
        self._bufs["dst"] = pair((self.e_cap,), idt)
        if self.loops:
            self._bufs["src_nl"] = pair((self.enl_cap,), idt)
            self._bufs["dst_nl"] = pair((self.enl_cap,), idt)
        # [node, edge, non-loop edge] offsets of the batch's graphs, B + 1 each
        self._bufs["meta"] = pair((3, self.B + 1), torch.int64)
        self._copied: Optional[Any] = None   # event: the pinned buffers may be reused
        self.n = 0                             # real nodes of the loaded batch
        self.bucket = len(self.buckets) - 1    # bucket of the loaded batch

    def _ladder(self, buckets) -> List[Tuple[int, int, int]]:
        if isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer, list, tuple)):
            raise TypeError(f"'buckets' must be an int or a sequence of capacities, got "
                            f"{type(buckets).__name__}")
        if isinstance(buckets, (int, np.integer)):
            return bucket_capacities(self.stores, self.B, int(buckets))
        worst = worst_case(self.stores, self.B)
        out: List[Tuple[int, int, int]] = []
        for b in buckets:
            b = tuple(int(v) for v in b)
            if len(b) not in (2, 3) or min(b) < 0:
                raise ValueError(f"'buckets': each bucket is (nodes, edges[, non-loop "
                                 f"edges]) >= 0, got {b}")
            b = (b[0], b[1], b[2] if len(b) == 3 else b[1])
            b = tuple(min(v, w) for v, w in zip(b, worst))
            if out and any(v < u for v, u in zip(b, out[-1])):
                raise ValueError(f"'buckets' must be ascending, got {out[-1]} before {b}")
            if not out or b != out[-1]:
                out.append(b)
        if not out or out[-1] != worst:
            out.append(worst)
        return out

    @property
    def buffers(self) -> Dict[str, Tensor]:
        """The device buffers (static addresses; the largest bucket's size)."""
        return {k: d for k, (_, d) in self._bufs.items()}

    def node_attr(self, key: str) -> Tensor:
        """The device buffer of node attribute ``key`` (``[num_nodes, ...]``;
        the loaded batch's rows first)."""
        return self._bufs["x:" + key][1]

    def bucket_nodes(self, bucket: int) -> int:
        """The node rows of ``bucket``: its capacity plus its padding node."""
        return self.buckets[bucket][0] + 1

    def totals(self, store: Any, ids: np.ndarray) -> Tuple[int, int, int]:
        """Nodes, edges and non-loop edges of graphs ``ids`` of ``store``."""
        ids = np.asarray(ids, dtype=np.int64)
        return (int(store.n[ids].sum()), int(store.e[ids].sum()),
                int((store.e[ids] - store.loops[ids]).sum()))

    def bucket_of(self, store: Any, ids: np.ndarray) -> int:
        """The smallest bucket that holds graphs ``ids`` of ``store`` (host only)."""
        N, E, Enl = self.totals(store, ids)
        for i, (n, e, enl) in enumerate(self.buckets):
            if N <= n and E <= e and (Enl <= enl or not self.loops):
                return i
        # cannot happen for the stores given
        raise ValueError(f"batch of {N} nodes / {E} edges exceeds the capacity "
                         f"{self.n_cap} / {self.e_cap}")

    def load(self, store: Any, ids: np.ndarray) -> int:
        """Pack graphs ``ids`` of ``store`` into the buffers (the prefix of the
        smallest bucket that holds them, :attr:`bucket`); returns the number of
        real nodes.  Asynchronous on CUDA (pinned copies)."""
        from ..data.batching import _segments
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or not 0 < ids.size <= self.B:
            raise ValueError(f"'ids' must hold 1..{self.B} graph indices, got shape "
                             f"{ids.shape}")
        b = self.bucket_of(store, ids)
        if self._copied is not None:   # the previous copy must have left the pinned memory
            self._copied.synchronize()
        nc, ec = store.n[ids], store.e[ids]
        N, E = int(nc.sum()), int(ec.sum())
        Nr = self.bucket_nodes(b)
        h = {k: p for k, (p, _) in self._bufs.items()}
        n0, n1 = store.node_ptr[ids], store.node_ptr[ids + 1]
        # the bucket's node rows: the batch's, then zeros (its padding rows);
        # its edges: the batch's only (the rest is masked in inputs())
        rows = {"x:" + k: Nr for k in self.node_keys}
        for k in self.node_keys:
            buf = h["x:" + k]
            _segments(store.node_attrs[k], n0, n1, 0, out=buf.narrow(0, 0, N))
            buf.narrow(0, N, Nr - N).zero_()
        e0, e1 = store.edge_ptr[ids], store.edge_ptr[ids + 1]
        _segments(store.ei[0], e0, e1, 0, out=h["src"].narrow(0, 0, E))
        _segments(store.ei[1], e0, e1, 0, out=h["dst"].narrow(0, 0, E))
        rows["src"] = rows["dst"] = E
        meta = np.zeros((3, self.B + 1), np.int64)
        meta[0, 1:ids.size + 1] = np.cumsum(nc)
        meta[1, 1:ids.size + 1] = np.cumsum(ec)
        meta[:2, ids.size + 1:] = meta[:2, ids.size:ids.size + 1]
        if self.loops:
            nl = ec - store.loops[ids]
            Enl = int(nl.sum())
            if store.ei_nl is not None:
                a, c = store.nl_ptr[ids], store.nl_ptr[ids + 1]
                _segments(store.ei_nl[0], a, c, 0, out=h["src_nl"].narrow(0, 0, Enl))
                _segments(store.ei_nl[1], a, c, 0, out=h["dst_nl"].narrow(0, 0, Enl))
            else:   # this store has no loops: its non-loop edges are all edges
                h["src_nl"].narrow(0, 0, Enl).copy_(h["src"].narrow(0, 0, Enl))
                h["dst_nl"].narrow(0, 0, Enl).copy_(h["dst"].narrow(0, 0, Enl))
            meta[2, 1:ids.size + 1] = np.cumsum(nl)
            meta[2, ids.size + 1:] = meta[2, ids.size]
            rows["src_nl"] = rows["dst_nl"] = Enl
        h["meta"].copy_(torch.from_numpy(meta))
        rows["meta"] = 3
        for k, (p, d) in self._bufs.items():
            r = rows[k]
            d.narrow(0, 0, r).copy_(p.narrow(0, 0, r), non_blocking=p.is_pinned())
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        self.n = N
        self.bucket = b
        return N

    def _global(self, src: Tensor, dst: Tensor, row: int, pad: int) -> Tuple[Tensor, Tensor]:
        """Batch-global ``[2, E]`` edges from the local ids of the buffers, with
        the entries past the batch's edges set to the padding node ``pad``,
        and the mask of the batch's own entries."""
        meta = self._bufs["meta"][1]
        pos = torch.arange(src.numel(), device=src.device)
        ends = meta[row, 1:]
        g = torch.searchsorted(ends, pos, right=True).clamp_(max=self.B - 1)
        valid = pos < ends[-1]
        ei = torch.stack([src.long(), dst.long()]) + meta[0, :-1][g]
        return torch.where(valid, ei, pad), valid

    def inputs(self, bucket: Optional[int] = None) -> Dict[str, Any]:
        """The model inputs of the loaded batch in ``bucket`` (default: the
        batch's own, :attr:`bucket`; a larger one pads more), from fixed-shape
        device ops on that bucket's prefix of the buffers: ``x``-like node
        attributes, ``edge_index`` (padding edges as loops on the bucket's
        padding node, its last row), ``node_mask`` (real rows) and, for the
        fused layers, their CSR views registered in the graph cache for this
        ``edge_index`` (padding edges left out)."""
        bucket = self.bucket if bucket is None else int(bucket)
        if not self.bucket <= bucket < len(self.buckets):
            raise ValueError(f"'bucket' must be in {self.bucket}..{len(self.buckets) - 1} "
                             f"(the loaded batch's bucket or a larger one), got {bucket}")
        n_cap, e_cap, enl_cap = self.buckets[bucket]
        b = self.buffers
        Nr = n_cap + 1
        out: Dict[str, Any] = {k: b["x:" + k].narrow(0, 0, Nr) for k in self.node_keys}
        meta = b["meta"]
        out["node_mask"] = torch.arange(Nr, device=self.device) < meta[0, -1]
        edge_index, valid = self._global(b["src"].narrow(0, 0, e_cap),
                                         b["dst"].narrow(0, 0, e_cap), 1, n_cap)
        out["edge_index"] = edge_index
        if self.views:
            from ..data.batching import sorted_graph_views
            # the CSR views see the padding edges at row Nr, past the last row
            csr = torch.where(valid, edge_index, Nr)
            nonloop = None
            if self.loops:
                nl, nl_valid = self._global(b["src_nl"].narrow(0, 0, enl_cap),
                                            b["dst_nl"].narrow(0, 0, enl_cap), 2, n_cap)
                nonloop = torch.where(nl_valid, nl, Nr)
            graphs = sorted_graph_views(csr, Nr, self.views,
                                        [self.max_deg[v][0] for v in self.views],
                                        [self.max_deg[v][1] for v in self.views], nonloop)
            for v, g in zip(self.views, graphs):
                _graph.attach(edge_index, g, (Nr, Nr), Nr if v else None)
            out["graphs"] = graphs
        return out


class GraphedSteps:
    """The training step and the evaluation forward of a run, captured as CUDA
    graphs, one of each per bucket of :class:`StaticBatches` (``capture=False``:
    the same padded steps in the same buckets with the same schedule -- dry
    runs included -- only eager instead of captured and replayed: what the CPU
    tests check).

    **Capture schedule.**  The first :data:`WARMUP_STEPS` training steps run
    eagerly, whatever their buckets (lazy initialisation, the optimiser's
    state).  The next training step is the *capture point*: the training
    graphs of every bucket below the worst case (plus the worst case if this
    batch needs it) are captured there, all at once, in **descending** size
    order (see *Memory*), and then the graph of the batch's bucket is replayed
    -- its one optimiser step.  After that every training batch is a replay,
    except that a bucket without a graph (the worst case, which in practice no
    batch needs, see :func:`bucket_capacities`) is captured the first time a
    batch needs it, into the same pool.  No eager step runs after the warm-up
    and no graph is ever dropped and captured again.  The evaluation graphs
    likewise: evaluation runs eagerly until the training capture point has
    passed (the training graphs come first, so that parameters and optimiser
    state have their final addresses), then the first evaluation batch
    captures the evaluation graphs of every bucket below the worst case
    (descending, plus its own bucket) and the worst case's comes when needed.

    A capture may not do a shape's lazy work (library workspaces and plans,
    allocator growth: a sync or a fresh host-to-device copy fails it), so a
    bucket whose shapes have not run yet in that mode gets a *dry run* just
    before its capture, eagerly on a side stream: the loaded batch in the
    bucket's shapes, forward and backward but **no optimiser step**, then the
    gradients are dropped (``zero_grad(set_to_none=True)``, as before every
    training capture: each capture allocates its own, see *Memory*).  A
    training-mode forward updates BatchNorm's running statistics, so the
    model's buffers are saved before a dry run and copied back in place after
    it: a dry run leaves parameters, optimiser state and buffers bit-identical
    (only the random stream advances, by the dropout draws of one forward).
    The evaluation forward gets its own dry run (no-grad, eval mode) per
    bucket: it takes other code paths than training (no autograd, BatchNorm
    on its running statistics, the layers' forward-only kernels), whose lazy
    work the training dry run would not have done; it is one forward per
    bucket and run.  A bucket smaller than the loaded batch is dry-run and
    captured on the graphs of the batch that fit it (:meth:`_fitting`; the
    data does not matter, only the shapes, which are the bucket's); where not
    one graph fits, the bucket is left for later like the worst case.  After
    the captures the batch itself is loaded again.  Every batch is exactly one
    optimiser step; a capture records and runs nothing.

    **Memory.**  Every graph of the run is captured into **one** private memory
    pool, so a graph reuses what another one's capture freed, and the pool
    holds about the largest graph's working memory rather than the sum.  For
    that the largest graphs are captured first: a larger graph's freed blocks
    are split for a smaller one's tensors, while a smaller graph's are too
    small for a larger one's (the pool would grow towards the sum).  Only a
    bucket captured after the capture point (the worst case) can grow the
    pool.  Sharing is safe because (1) the graphs never run concurrently:
    every replay and capture is issued from this object on the current stream,
    in order; (2) a graph reads only what is outside the pool -- the static
    buffers, parameters, optimiser state and BatchNorm statistics (created
    eagerly before the first capture and updated in place) -- or what it wrote
    itself earlier in the same replay: the gradients are allocated inside the
    capture (``zero_grad(set_to_none=True)`` before it), so each graph has its
    own, written by its backward before its optimiser step reads them;
    (3) what the host reads after a replay, the outputs ``(out, loss)``, are
    tensors still alive while the later graphs are captured, so no later
    capture places anything on them -- but an *earlier* graph may have used
    their memory as scratch, so they are valid only until the next step of any
    bucket (train or eval), which is the contract of :meth:`train_step` and
    :meth:`eval_step` (the trainer reads them, in stream order, before the next
    step).  The dry runs allocate outside the pool, once per bucket, before
    the capture point's captures are done.

    Args:
        model: the module trained (its ``forward(x, edge_index, lap_pe=...,
            node_mask=...)``).
        opt: its optimiser (capturable where ``capture``).
        static: the :class:`StaticBatches`.
        loss_fn: ``loss_fn(out, y, node_mask)`` -> scalar tensor.
        autocast: a zero-argument callable returning the precision context.
        capture: record CUDA graphs (CUDA only).
    """

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 static: StaticBatches, loss_fn, autocast, capture: bool):
        self.model, self.opt, self.static = model, opt, static
        self.loss_fn, self.autocast, self.capture = loss_fn, autocast, capture
        K = len(static.buckets)
        #: batches per bucket so far (training steps, evaluation batches)
        self.train_counts = [0] * K
        self.eval_counts = [0] * K
        self._stream = None   # the side stream of the eager work (_side_stream)
        self.reset()

    # ------------------------------------------------------------------ bodies
    def _forward(self, bucket: int) -> Tuple[Tensor, Tensor]:
        inp = self.static.inputs(bucket)
        with self.autocast():
            out = self.model(inp["x"], inp["edge_index"], lap_pe=inp.get("lap_pe"),
                             node_mask=inp["node_mask"])
            loss = self.loss_fn(out, inp["y"], inp["node_mask"])
        return out, loss

    def _train_body(self, bucket: int) -> Tuple[Tensor, Tensor]:
        out, loss = self._forward(bucket)
        loss.backward()
        self.opt.step()
        return out.detach(), loss.detach()

    def _side(self):
        """The run's one side stream, for the eager work and the captures: the
        process's one per device (:data:`_SIDE_STREAMS`), so that runs one
        after another in a process (a sweep, ``dfgnn bench``'s training
        section) do not each leave a cuBLAS workspace behind."""
        if self._stream is None:
            dev = torch.cuda.current_device()
            if dev not in _SIDE_STREAMS:
                _SIDE_STREAMS[dev] = torch.cuda.Stream()
            self._stream = _SIDE_STREAMS[dev]
        return self._stream

    @contextlib.contextmanager
    def _side_stream(self):
        """Eager work (warm-up steps, dry runs) on the run's one side stream,
        which the captures use too.  One stream for the whole run, not one per
        use: cuBLAS gets a workspace for every stream it runs on (33-65 MiB on
        an H100), allocated from PyTorch's caching allocator and kept for the
        life of the process (docs/BENCHMARKS.md, session 8)."""
        if not self.capture:
            yield
            return
        s = self._side()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            yield
        torch.cuda.current_stream().wait_stream(s)

    @contextlib.contextmanager
    def _keep_buffers(self):
        """The model's buffers (BatchNorm's running statistics and counts) as
        they were on entry, copied back in place on exit (their addresses are
        the graphs')."""
        saved = [(b, b.detach().clone()) for b in self.model.buffers()]
        try:
            yield
        finally:
            with torch.no_grad():
                for b, s in saved:
                    b.copy_(s)

    # ---------------------------------------------------------------- dry runs
    def _dry_train(self, bucket: int) -> None:
        """The training step's lazy work at ``bucket``'s shapes outside a
        capture: forward and backward of the loaded batch, no optimiser step;
        parameters, optimiser state and buffers stay bit-identical, the
        gradients are dropped."""
        with self._side_stream(), self._keep_buffers():
            self.opt.zero_grad(set_to_none=True)
            _, loss = self._forward(bucket)
            loss.backward()
            self.opt.zero_grad(set_to_none=True)
        self._ran["train"].add(bucket)
        self.dry_runs += 1
        self.schedule.append(("dry-train", bucket))

    def _dry_eval(self, bucket: int) -> None:
        """The evaluation forward's lazy work at ``bucket``'s shapes (eval
        mode, no grad), outside a capture; changes nothing."""
        with torch.no_grad(), self._side_stream(), self._keep_buffers():
            self._forward(bucket)
        self._ran["eval"].add(bucket)
        self.dry_runs += 1
        self.schedule.append(("dry-eval", bucket))

    # ---------------------------------------------------------------- captures
    def _capture(self, body):
        """``body`` recorded as a CUDA graph in the run's shared pool (see the
        class docstring): ``(graph, outputs)``.  Records and runs nothing."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool, stream=self._side()):
            outputs = body()
        return g, outputs

    def _fitting(self, store: Any, ids: np.ndarray, bucket: int) -> Optional[np.ndarray]:
        """The graphs of ``ids`` that together fit ``bucket`` (taken in order
        while they fit), or ``None`` where not one does."""
        n, e, enl = self.static.buckets[bucket]
        N = E = Enl = 0
        keep = []
        for i in np.asarray(ids, dtype=np.int64):
            dn, de, dnl = self.static.totals(store, i[None])
            if N + dn <= n and E + de <= e and (Enl + dnl <= enl or not self.static.loops):
                keep.append(i)
                N, E, Enl = N + dn, E + de, Enl + dnl
        return np.asarray(keep, dtype=np.int64) if keep else None

    def _arm(self, kind: str, store: Any, ids: np.ndarray) -> None:
        """Capture the ``kind`` (``"train"``/``"eval"``) graphs due now with
        batch ``ids`` of ``store`` loaded (class docstring): at the first call
        every bucket below the worst case and the batch's own, descending,
        later the batch's bucket only; each after a dry run where its shapes
        have not run in this mode.  The batch is loaded again at the end.
        ``capture=False``: the same dry runs and loads, no capture."""
        s = self.static
        b = s.bucket
        armed = self._armed[kind]
        due = {b} if armed else set(range(len(s.buckets) - 1)) | {b}
        graphs, outs = ((self.train_graphs, self._train_out) if kind == "train"
                        else (self.eval_graphs, self._eval_out))
        moved = False   # the buffers hold graphs other than the batch's
        for k in sorted(due - armed, reverse=True):   # the largest first (one pool)
            if s.bucket > k:    # the loaded graphs exceed bucket k: those that fit
                sub = self._fitting(store, ids, k)
                if sub is None:
                    continue    # no batch of its graphs: later, if one needs it
                s.load(store, sub)
                moved = True
            if k not in self._ran[kind]:
                (self._dry_train if kind == "train" else self._dry_eval)(k)
            if self.capture:
                if kind == "train":
                    self.opt.zero_grad(set_to_none=True)   # its own gradients, in the pool
                    body = (lambda k=k: self._train_body(k))
                else:
                    body = (lambda k=k: self._forward(k))
                graphs[k], outs[k] = self._capture(body)
                self.captures += 1
            armed.add(k)
            self.schedule.append((kind, k))
        if moved:
            s.load(store, ids)

    # ------------------------------------------------------------------ steps
    def train_step(self, store: Any, ids: np.ndarray) -> Tuple[Tensor, Tensor, int]:
        """One optimiser step on graphs ``ids`` of ``store``: ``(out, loss, n)``
        with ``out`` the logits of the padded batch (its first ``n`` rows are
        the real nodes) and ``loss`` a 0-dim tensor.  Both are overwritten by
        the next step (training or evaluation, any bucket)."""
        n = self.static.load(store, ids)
        b = self.static.bucket
        self.train_counts[b] += 1
        self.model.train()
        if self.steps >= WARMUP_STEPS and b not in self._armed["train"]:
            self._arm("train", store, ids)
        self.steps += 1
        g = self.train_graphs.get(b)
        if g is not None:
            g.replay()
            out, loss = self._train_out[b]
            return out, loss, n
        with self._side_stream():
            self.opt.zero_grad(set_to_none=True)
            out, loss = self._train_body(b)
        self._ran["train"].add(b)
        return out, loss, n

    @torch.no_grad()
    def eval_step(self, store: Any, ids: np.ndarray) -> Tuple[Tensor, Tensor, int]:
        """The evaluation forward (and loss) on graphs ``ids`` of ``store``
        (outputs as :meth:`train_step`'s)."""
        n = self.static.load(store, ids)
        b = self.static.bucket
        self.eval_counts[b] += 1
        self.model.eval()
        if self._armed["train"] and b not in self._armed["eval"]:
            self._arm("eval", store, ids)
        g = self.eval_graphs.get(b)
        if g is not None:
            g.replay()
            out, loss = self._eval_out[b]
            return out, loss, n
        with self._side_stream():   # before the training capture point
            out, loss = self._forward(b)
        self._ran["eval"].add(b)
        return out, loss, n

    @property
    def captured(self) -> Dict[str, List[int]]:
        """The buckets with a captured training / evaluation graph."""
        return {"train": sorted(self.train_graphs), "eval": sorted(self.eval_graphs)}

    def reset(self) -> None:
        """Drop the captured graphs and their pool (e.g. after the parameters
        were replaced); the next steps warm up and capture again."""
        self.train_graphs: Dict[int, Any] = {}
        self.eval_graphs: Dict[int, Any] = {}
        self._train_out: Dict[int, Tuple[Tensor, Tensor]] = {}
        self._eval_out: Dict[int, Tuple[Tensor, Tensor]] = {}
        self._pool = None
        #: per mode, the buckets whose shapes have run eagerly (step or dry run)
        self._ran: Dict[str, set] = {"train": set(), "eval": set()}
        #: per mode, the buckets past their capture (``capture=False``: past the
        #: point where a CUDA run would capture them)
        self._armed: Dict[str, set] = {"train": set(), "eval": set()}
        #: training steps so far
        self.steps = 0
        #: graphs captured so far (each bucket and mode at most once)
        self.captures = 0
        #: dry runs so far (training and evaluation)
        self.dry_runs = 0
        #: the schedule so far, in order: ``("dry-train" | "dry-eval", bucket)``
        #: per dry run, ``("train" | "eval", bucket)`` per capture (``capture=
        #: False``: where a CUDA run captures)
        self.schedule: List[Tuple[str, int]] = []
