"""Training and evaluation steps replayed as CUDA graphs (``cuda_graphs: true``).

A training step on a batch of small graphs (PATTERN, CLUSTER) is host-bound:
the GPU finishes each of the model's few hundred small kernels before Python
has launched the next one (docs/BENCHMARKS.md: the fused Graph Transformer
step was 27-29% GPU-busy).  A CUDA graph records the whole step once --
graph preparation, forward, loss, backward and the optimiser update -- and
replays it with one launch, so the host no longer sets the pace.

A graph replays fixed shapes and fixed addresses, while every batch has other
sizes.  :class:`StaticBatches` therefore packs each batch into buffers of
fixed *capacity*:

* nodes: the largest total node count any ``batch_size`` graphs of the data
  set can have, plus one padding node; the rows past the batch's nodes are
  zero and masked;
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
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from .. import graph as _graph

__all__ = ["StaticBatches", "GraphedSteps", "capacity"]

#: eager steps before a capture (lazy initialisation, optimiser state)
WARMUP_STEPS = 3


def capacity(sizes: np.ndarray, batch_size: int) -> int:
    """The largest total of ``batch_size`` entries of ``sizes``."""
    if sizes.size == 0:
        return 0
    k = min(int(batch_size), int(sizes.size))
    return int(np.sort(sizes)[-k:].sum())


class StaticBatches:
    r"""Fixed-capacity device buffers for the batches of one or more
    :class:`~pyg_dfgnn.data.GraphBatcher` stores (see the module docstring).

    :meth:`load` packs a batch's graphs on the host (into pinned memory) and
    copies them into the buffers; :meth:`inputs` turns the buffers into the
    model's inputs with device ops of fixed shapes only (no host sync), so it
    can run inside a CUDA graph capture.

    Args:
        stores: the stores whose batches will be loaded (the capacities cover
            every one of them).
        batch_size: graphs per batch.
        device: the training device.
        views: the CSR views to build for the fused layers (as
            :class:`~pyg_dfgnn.data.GraphBatcher`'s ``views``); empty for PyG's
            layers.
    """

    def __init__(self, stores: Sequence[Any], batch_size: int, device: torch.device,
                 views: Sequence[bool] = ()):
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
        self.n_cap = max(capacity(s.n, self.B) for s in self.stores)
        self.num_nodes = self.n_cap + 1        # + one padding node
        self.e_cap = max(capacity(s.e, self.B) for s in self.stores)
        self.loops = any(s.ei_nl is not None for s in self.stores) and any(self.views)
        self.enl_cap = max(capacity(s.e - s.loops, self.B) for s in self.stores)
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

    @property
    def buffers(self) -> Dict[str, Tensor]:
        """The device buffers (static addresses)."""
        return {k: d for k, (_, d) in self._bufs.items()}

    def node_attr(self, key: str) -> Tensor:
        """The device buffer of node attribute ``key`` (``[num_nodes, ...]``;
        the loaded batch's rows first)."""
        return self._bufs["x:" + key][1]

    def load(self, store: Any, ids: np.ndarray) -> int:
        """Pack graphs ``ids`` of ``store`` into the buffers; returns the
        number of real nodes.  Asynchronous on CUDA (pinned copies)."""
        from ..data.batching import _segments
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or not 0 < ids.size <= self.B:
            raise ValueError(f"'ids' must hold 1..{self.B} graph indices, got shape "
                             f"{ids.shape}")
        if self._copied is not None:   # the previous copy must have left the pinned memory
            self._copied.synchronize()
        nc, ec = store.n[ids], store.e[ids]
        N, E = int(nc.sum()), int(ec.sum())
        if N > self.n_cap or E > self.e_cap:   # cannot happen for the stores given
            raise ValueError(f"batch of {N} nodes / {E} edges exceeds the capacity "
                             f"{self.n_cap} / {self.e_cap}")
        h = {k: p for k, (p, _) in self._bufs.items()}
        n0, n1 = store.node_ptr[ids], store.node_ptr[ids + 1]
        for k in self.node_keys:
            buf = h["x:" + k]
            _segments(store.node_attrs[k], n0, n1, 0, out=buf.narrow(0, 0, N))
            buf.narrow(0, N, buf.size(0) - N).zero_()
        e0, e1 = store.edge_ptr[ids], store.edge_ptr[ids + 1]
        _segments(store.ei[0], e0, e1, 0, out=h["src"].narrow(0, 0, E))
        _segments(store.ei[1], e0, e1, 0, out=h["dst"].narrow(0, 0, E))
        meta = np.zeros((3, self.B + 1), np.int64)
        meta[0, 1:ids.size + 1] = np.cumsum(nc)
        meta[1, 1:ids.size + 1] = np.cumsum(ec)
        meta[:2, ids.size + 1:] = meta[:2, ids.size:ids.size + 1]
        if self.loops:
            nl = ec - store.loops[ids]
            Enl = int(nl.sum())
            if store.ei_nl is not None:
                a, b = store.nl_ptr[ids], store.nl_ptr[ids + 1]
                _segments(store.ei_nl[0], a, b, 0, out=h["src_nl"].narrow(0, 0, Enl))
                _segments(store.ei_nl[1], a, b, 0, out=h["dst_nl"].narrow(0, 0, Enl))
            else:   # this store has no loops: its non-loop edges are all edges
                h["src_nl"].narrow(0, 0, Enl).copy_(h["src"].narrow(0, 0, Enl))
                h["dst_nl"].narrow(0, 0, Enl).copy_(h["dst"].narrow(0, 0, Enl))
            meta[2, 1:ids.size + 1] = np.cumsum(nl)
            meta[2, ids.size + 1:] = meta[2, ids.size]
        h["meta"].copy_(torch.from_numpy(meta))
        for p, d in self._bufs.values():
            d.copy_(p, non_blocking=p.is_pinned())
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        self.n = N
        return N

    def _global(self, src: Tensor, dst: Tensor, row: int) -> Tuple[Tensor, Tensor]:
        """Batch-global ``[2, E]`` edges from the local ids of the buffers, with
        the entries past the batch's edges set to the padding node
        (``n_cap``), and the mask of the batch's own entries."""
        meta = self._bufs["meta"][1]
        pos = torch.arange(src.numel(), device=src.device)
        ends = meta[row, 1:]
        g = torch.searchsorted(ends, pos, right=True).clamp_(max=self.B - 1)
        valid = pos < ends[-1]
        ei = torch.stack([src.long(), dst.long()]) + meta[0, :-1][g]
        return torch.where(valid, ei, self.n_cap), valid

    def inputs(self) -> Dict[str, Any]:
        """The model inputs of the loaded batch, from fixed-shape device ops:
        ``x``-like node attributes, ``edge_index`` (padding edges as loops on
        the padding node), ``node_mask`` (real rows) and, for the fused
        layers, their CSR views registered in the graph cache for this
        ``edge_index`` (padding edges left out)."""
        b = self.buffers
        Nr = self.num_nodes
        out: Dict[str, Any] = {k: b["x:" + k] for k in self.node_keys}
        meta = b["meta"]
        out["node_mask"] = torch.arange(Nr, device=self.device) < meta[0, -1]
        edge_index, valid = self._global(b["src"], b["dst"], 1)
        out["edge_index"] = edge_index
        if self.views:
            from ..data.batching import sorted_graph_views
            # the CSR views see the padding edges at row Nr, past the last row
            csr = torch.where(valid, edge_index, Nr)
            nonloop = None
            if self.loops:
                nl, nl_valid = self._global(b["src_nl"], b["dst_nl"], 2)
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
    graphs after :data:`WARMUP_STEPS` eager steps (``capture=False``: the same
    padded steps, always eager -- what the CPU tests check).

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
        self.steps = 0
        self.train_graph = None
        self.eval_graph = None
        self._train_out: Optional[Tuple[Tensor, Tensor]] = None
        self._eval_out: Optional[Tuple[Tensor, Tensor]] = None

    # ------------------------------------------------------------------ bodies
    def _forward(self) -> Tuple[Tensor, Tensor]:
        inp = self.static.inputs()
        with self.autocast():
            out = self.model(inp["x"], inp["edge_index"], lap_pe=inp.get("lap_pe"),
                             node_mask=inp["node_mask"])
            loss = self.loss_fn(out, inp["y"], inp["node_mask"])
        return out, loss

    def _train_body(self) -> Tuple[Tensor, Tensor]:
        out, loss = self._forward()
        loss.backward()
        self.opt.step()
        return out.detach(), loss.detach()

    @contextlib.contextmanager
    def _side_stream(self):
        if not self.capture:
            yield
            return
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            yield
        torch.cuda.current_stream().wait_stream(s)


    # ------------------------------------------------------------------ steps
    def train_step(self, store: Any, ids: np.ndarray) -> Tuple[Tensor, Tensor, int]:
        """One optimiser step on graphs ``ids`` of ``store``: ``(out, loss, n)``
        with ``out`` the logits of the padded batch (its first ``n`` rows are
        the real nodes) and ``loss`` a 0-dim tensor.  Both are overwritten by
        the next step."""
        n = self.static.load(store, ids)
        self.model.train()
        if self.train_graph is not None:
            self.train_graph.replay()
            out, loss = self._train_out
            return out, loss, n
        if not self.capture or self.steps < WARMUP_STEPS:
            with self._side_stream():
                self.opt.zero_grad(set_to_none=True)
                out, loss = self._train_body()
            self.steps += 1
            return out, loss, n
        # capture this step (recording runs nothing), then run it
        self.opt.zero_grad(set_to_none=True)
        self.train_graph, self._train_out = self._capture(self._train_body)
        self.steps += 1
        out, loss = self._train_out
        return out, loss, n

    @staticmethod
    def _capture(body):
        """``body`` recorded as a CUDA graph and replayed once: ``(graph, outputs)``."""
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outputs = body()
        g.replay()
        return g, outputs

    @torch.no_grad()
    def eval_step(self, store: Any, ids: np.ndarray) -> Tuple[Tensor, Tensor, int]:
        """The evaluation forward (and loss) on graphs ``ids`` of ``store``."""
        n = self.static.load(store, ids)
        self.model.eval()
        if self.eval_graph is not None:
            self.eval_graph.replay()
            out, loss = self._eval_out
            return out, loss, n
        if not self.capture or self.train_graph is None:
            # eager until the training graph exists (its capture comes first, so
            # that parameters and optimiser state have their final addresses)
            with self._side_stream():
                out, loss = self._forward()
            return out, loss, n
        self.eval_graph, self._eval_out = self._capture(self._forward)
        out, loss = self._eval_out
        return out, loss, n

    def reset(self) -> None:
        """Drop the captured graphs (e.g. after the parameters were replaced)."""
        self.train_graph = self.eval_graph = None
        self._train_out = self._eval_out = None
        self.steps = 0

