"""Batches of small graphs without PyG's per-step collation and graph conversion.

A training step on batches of small graphs (PATTERN, CLUSTER: ~119 nodes and
~6,100 edges each, 26-128 graphs per step) spends little time in the layers'
kernels.  Around them, PyG's :class:`~torch_geometric.loader.DataLoader`
collates every batch in Python (one ``Data`` at a time, in worker processes
that it restarts every epoch), ships it between processes, and the first layer
of the step converts the new ``edge_index`` to CSR on the device with several
host-device synchronisations (validation, sortedness, degree statistics).

:class:`GraphBatcher` does that work once, when it is built, and keeps the
graphs in one compact store (concatenated tensors, node ids local to their
graph, the edges of every graph sorted by target).  A batch is then:

* a few slice copies on the host (no per-graph Python objects), one pinned,
  asynchronous copy to the device, and the local-to-batch id shift on the
  device -- the same :class:`~torch_geometric.data.Batch` PyG would collate
  (``x``, ``edge_index``, ``y``, ``batch``, ``ptr``, other node/edge/graph
  attributes), except that each graph's edges come in target order (message
  passing does not depend on the order of the edges);
* with ``views``, the CSR views the :mod:`pyg_dfgnn.nn` layers need, built on
  the device **without a sort of the destinations and without a host sync**
  (the edges are already in target order, self-loops are merged in by
  position, the degree maxima come from per-graph statistics kept on the
  host), and registered in the layers' graph cache, so every layer of the
  step hits it.

.. code-block:: python

    from pyg_dfgnn.data import GraphBatcher, GraphBatchLoader

    store = GraphBatcher(train_graphs, views=(True,))        # GAT: looped view
    for batch in GraphBatchLoader(store, batch_size=128, shuffle=True, device="cuda"):
        out = model(batch.x, batch.edge_index)                # no conversion, no sync

Bad input (an ``edge_index`` index out of range of its graph, a wrong shape)
raises the layers' :class:`ValueError` when the store is built, naming the
graph.  Graphs whose attributes PyG collates in another way than
concatenation along dimension 0 (custom ``__inc__`` / ``__cat_dim__``,
non-tensor attributes) are refused with a :class:`ValueError` that says so:
use PyG's DataLoader for those.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from .. import graph as _graph
from ..graph import CSRGraph

__all__ = ["GraphBatcher", "GraphBatchLoader", "sorted_graph_views"]

_INT32_MAX = 2**31 - 1


#: dtypes whose CPU tensors :func:`_segments` copies with NumPy
_NUMPY_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
                 torch.float16, torch.float32, torch.float64)


def _segments(tensor: Tensor, starts: np.ndarray, ends: np.ndarray, dim: int = 0,
              out: Optional[Tensor] = None) -> Tensor:
    """``cat`` of ``tensor``'s slices ``[starts[i]:ends[i]]`` along ``dim``
    (into ``out`` where given).  CPU tensors of NumPy's dtypes are copied by
    ``np.concatenate`` of the slices' views: a batch of 128 graphs' edge
    arrays 3-4x faster than ``torch.cat`` of 128 ``narrow`` views, whose
    per-slice cost dominates (docs/KERNELS.md, session 32).  The same result
    either way; slices outside ``tensor`` raise ``torch.narrow``'s error."""
    a_list = np.asarray(starts).tolist()
    b_list = np.asarray(ends).tolist()
    if not a_list:
        shape = list(tensor.shape)
        shape[dim] = 0
        return tensor.new_empty(shape) if out is None else out
    size = tensor.size(dim)
    total = sum(b - a for a, b in zip(a_list, b_list))
    fast = (tensor.device.type == "cpu" and tensor.dtype in _NUMPY_DTYPES
            and not tensor.requires_grad
            and all(0 <= a <= b <= size for a, b in zip(a_list, b_list)))
    if fast and out is not None:
        shape = list(tensor.shape)
        shape[dim] = total
        fast = (out.device.type == "cpu" and out.dtype == tensor.dtype
                and not out.requires_grad and list(out.shape) == shape)
    if fast:
        arr = tensor.numpy()
        lead = (slice(None),) * dim
        parts = [arr[lead + (slice(a, b),)] for a, b in zip(a_list, b_list)]
        if out is None:
            return torch.from_numpy(np.concatenate(parts, axis=dim))
        np.concatenate(parts, axis=dim, out=out.numpy())
        return out
    parts = [tensor.narrow(dim, int(a), int(b - a)) for a, b in zip(a_list, b_list)]
    return torch.cat(parts, dim=dim, out=out) if out is not None else torch.cat(parts, dim)


def _seg_max(values: np.ndarray, ptr: np.ndarray) -> np.ndarray:
    """Per-segment maximum of ``values`` (segments ``ptr[i]:ptr[i+1]``, 0 if empty)."""
    out = np.zeros(len(ptr) - 1, dtype=np.int64)
    nonempty = ptr[1:] > ptr[:-1]
    if values.size and nonempty.any():
        red = np.maximum.reduceat(values, ptr[:-1][nonempty])
        out[nonempty] = red
    return out


def sorted_graph_views(edge_index: Tensor, num_nodes: int, views: Sequence[bool],
                       max_in: Sequence[int], max_out: Sequence[int],
                       nonloop: Optional[Tensor] = None) -> List[CSRGraph]:
    """The :class:`~pyg_dfgnn.graph.CSRGraph` views of a **target-sorted,
    validated** ``edge_index`` on ``num_nodes`` nodes, equal to those
    :func:`pyg_dfgnn.graph.get_graph` builds (``views[i] = False``: the graph as
    given; ``True``: PyG's ``remove_self_loops`` + ``add_self_loops`` view of
    GAT/GATv2/AGNN), built with device ops only -- no destination sort, no
    host-device sync.  ``max_in`` / ``max_out`` are the views' degree maxima
    (known on the host).  ``nonloop`` is ``edge_index`` without its self-loops
    (target-sorted; ``None`` when it has none).  The caller guarantees the
    preconditions (:class:`GraphBatcher` checks them once per data set)."""
    dev = edge_index.device
    N = int(num_nodes)
    E = int(edge_index.size(1))
    out = []
    nodes = torch.arange(N + 1, device=dev)

    def transpose(col: Tensor, rows: Tensor, num_edges: int):
        if num_edges:
            t_perm = torch.argsort(col, stable=True)
            t_col = rows[t_perm]
            t_rowptr = torch.searchsorted(col[t_perm], nodes)
        else:
            t_perm = torch.zeros(0, dtype=torch.long, device=dev)
            t_col = t_perm
            t_rowptr = torch.zeros(N + 1, dtype=torch.long, device=dev)
        return t_perm, t_col, t_rowptr

    for i, looped in enumerate(views):
        if not looped:
            src, dst = edge_index[0], edge_index[1]
            itype = _graph._index_dtype(E, N)
            rowptr = torch.searchsorted(dst, nodes) if E else torch.zeros(
                N + 1, dtype=torch.long, device=dev)
            t_perm, t_col, t_rowptr = transpose(src, dst, E)
            col, perm = src, None
            n_edges = E
        else:
            ei = edge_index if nonloop is None else nonloop
            src, dst = ei[0], ei[1]
            E_nl = int(ei.size(1))
            n_edges = E_nl + N
            itype = _graph._index_dtype(n_edges, N)
            ar = nodes[:N]
            rowptr_nl = torch.searchsorted(dst, nodes) if E_nl else torch.zeros(
                N + 1, dtype=torch.long, device=dev)
            # PyG's looped order is (non-loop edges, then loops 0..N-1); a stable
            # sort by target puts a node's loop after its non-loop in-edges:
            # non-loop edge k moves up by its target d (the loops of 0..d-1),
            # the loop of v lands at rowptr_nl[v+1] + v.
            pos_nl = torch.arange(E_nl, device=dev) + dst
            pos_loop = rowptr_nl[1:] + ar
            col = torch.empty(n_edges, dtype=torch.long, device=dev)
            rows = torch.empty_like(col)
            perm = torch.empty_like(col)
            col[pos_nl] = src
            col[pos_loop] = ar
            rows[pos_nl] = dst
            rows[pos_loop] = ar
            perm[pos_nl] = torch.arange(E_nl, device=dev)
            perm[pos_loop] = ar + E_nl
            rowptr = rowptr_nl + nodes
            t_perm, t_col, t_rowptr = transpose(col, rows, n_edges)
            if E_nl == 0:
                perm = None   # get_graph: the looped list is already target-sorted
        out.append(CSRGraph(
            rowptr=rowptr.to(itype).contiguous(), col=col.to(itype).contiguous(),
            perm=perm.to(itype) if perm is not None else None,
            t_rowptr=t_rowptr.to(itype).contiguous(), t_col=t_col.to(itype).contiguous(),
            t_perm=t_perm.to(itype).contiguous(), num_src=N, num_dst=N,
            max_in_degree=int(max_in[i]), max_out_degree=int(max_out[i])))
    return out


class GraphBatcher:
    r"""A compact, pre-validated store of small graphs that makes
    :class:`~torch_geometric.data.Batch`\ es of them cheaply, optionally with
    the CSR views of :mod:`pyg_dfgnn.nn`'s layers attached (see the module
    docstring).

    Args:
        graphs (sequence of Data): homogeneous graphs with an ``edge_index``
            and tensor attributes that PyG concatenates along dimension 0
            (node-level such as ``x``/``y``/``lap_pe``, edge-level such as
            ``edge_attr``, graph-level).
        views (sequence of bool): the CSR views to attach to every batch:
            ``True`` for GAT/GATv2/AGNN layers with ``add_self_loops=True``,
            ``False`` for ``TransformerConv`` and layers without self-loops
            (:meth:`PrepareGraphs.for_model(model).views
            <pyg_dfgnn.data.PrepareGraphs.for_model>` gives a model's);
            empty: plain batches (e.g. for PyG's own layers).
        build_device: where the one-time sort of the edges runs (the store
            itself stays on the host); default: the host.
    """

    def __init__(self, graphs: Sequence[Any], views: Sequence[bool] = (),
                 build_device: Optional[Union[str, torch.device]] = None):
        graphs = list(graphs)
        if not graphs:
            raise ValueError("'graphs' is empty")
        self.views = tuple(bool(v) for v in views)
        self.num_graphs = len(graphs)
        self._classify(graphs)
        n = np.fromiter((int(g.num_nodes) for g in graphs), np.int64, len(graphs))
        e = np.fromiter((int(g.edge_index.size(1)) for g in graphs), np.int64, len(graphs))
        self.n, self.e = n, e
        self.node_ptr = np.concatenate([[0], np.cumsum(n)])
        self.edge_ptr = np.concatenate([[0], np.cumsum(e)])
        ei = torch.cat([_graph.plain(g.edge_index) for g in graphs], 1)
        order = self._check_and_sort(ei, n, e, build_device)
        ei = ei[:, order] if order is not None else ei
        small = int(n.max(initial=0)) <= torch.iinfo(torch.int16).max
        self.ei = ei.to(torch.int16 if small else torch.int32).contiguous()
        self.node_attrs = {k: torch.cat([g[k] for g in graphs], 0) for k in self._node_keys}
        self.edge_attrs = {}
        for k in self._edge_keys:
            a = torch.cat([g[k] for g in graphs], 0)
            self.edge_attrs[k] = a[order] if order is not None else a
        self.graph_attrs = {k: torch.cat([g[k].reshape(-1, *g[k].shape[1:])
                                          if g[k].dim() else g[k].reshape(1)
                                          for g in graphs], 0) for k in self._graph_keys}
        self._stats(ei)

    # ------------------------------------------------------------------ build
    def _classify(self, graphs) -> None:
        first = graphs[0]
        keys = set(first.keys())
        if "edge_index" not in keys:
            raise ValueError("'graphs' must have an 'edge_index'")
        self._node_keys, self._edge_keys, self._graph_keys = [], [], []
        for k in sorted(keys - {"edge_index", "num_nodes"}):
            v = first[k]
            if not isinstance(v, Tensor):
                raise ValueError(f"GraphBatcher: attribute {k!r} is a {type(v).__name__}, "
                                 f"not a tensor; use PyG's DataLoader for such graphs")
            if first.__cat_dim__(k, v) != 0 or not _is_zero(first.__inc__(k, v)):
                raise ValueError(f"GraphBatcher: PyG collates attribute {k!r} with an "
                                 f"increment or along another dimension; use PyG's "
                                 f"DataLoader for such graphs")
            if first.is_node_attr(k):
                self._node_keys.append(k)
            elif first.is_edge_attr(k):
                self._edge_keys.append(k)
            else:
                self._graph_keys.append(k)
        for i, g in enumerate(graphs):
            if set(g.keys()) != keys:
                raise ValueError(f"'graphs': graph {i} has the attributes "
                                 f"{sorted(g.keys())}, graph 0 has {sorted(keys)}")
            ei = g.edge_index
            if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.size(0) != 2:
                raise ValueError(f"'graphs': graph {i}: 'edge_index' must be a tensor of "
                                 f"shape [2, num_edges], got "
                                 f"{tuple(ei.shape) if isinstance(ei, Tensor) else type(ei)}")
            if ei.dtype.is_floating_point or ei.dtype == torch.bool:
                raise ValueError(f"'graphs': graph {i}: 'edge_index' must hold integer "
                                 f"indices, got {ei.dtype}")
            if g.num_nodes is None:
                raise ValueError(f"'graphs': graph {i}: its number of nodes is unknown")

    def _check_and_sort(self, ei: Tensor, n: np.ndarray, e: np.ndarray,
                        build_device) -> Optional[Tensor]:
        """Validate every edge against its own graph's node count; the stable
        per-graph target order (``None`` if the edges are in it already)."""
        if ei.numel() == 0:
            return None
        ei = ei.long()
        bound = torch.repeat_interleave(torch.from_numpy(n), torch.from_numpy(e))
        for row, what in ((0, "source"), (1, "target")):
            bad = (ei[row] < 0) | (ei[row] >= bound)
            if bool(bad.any()):
                k = int(bad.nonzero()[0, 0])
                gi = int(np.searchsorted(self.edge_ptr, k, side="right") - 1)
                raise ValueError(f"'graphs': graph {gi}: 'edge_index' has a {what} index "
                                 f"{int(ei[row, k])}, out of range for its {int(n[gi])} "
                                 f"nodes")
        gid = torch.repeat_interleave(torch.arange(len(n)), torch.from_numpy(e))
        key = gid * (int(n.max()) + 1) + ei[1]
        if bool((key[1:] >= key[:-1]).all()):
            return None
        dev = torch.device(build_device) if build_device is not None else key.device
        return torch.argsort(key.to(dev), stable=True).cpu()

    def _stats(self, ei: Tensor) -> None:
        """Per-graph degree maxima of each view (host ints), and the non-loop
        edges when some graph has self-loops."""
        src = ei[0].long().numpy() + np.repeat(self.node_ptr[:-1], self.e)
        dst = ei[1].long().numpy() + np.repeat(self.node_ptr[:-1], self.e)
        N_all = int(self.node_ptr[-1])
        loop = src == dst
        self.loops = np.bincount(np.repeat(np.arange(self.num_graphs), self.e)[loop],
                                 minlength=self.num_graphs) if loop.any() else \
            np.zeros(self.num_graphs, np.int64)
        self.stats = {}
        indeg = np.bincount(dst, minlength=N_all)
        outdeg = np.bincount(src, minlength=N_all)
        self.stats[False] = (_seg_max(indeg, self.node_ptr), _seg_max(outdeg, self.node_ptr))
        keep = ~loop
        indeg_l = np.bincount(dst[keep], minlength=N_all) + 1
        outdeg_l = np.bincount(src[keep], minlength=N_all) + 1
        self.stats[True] = (_seg_max(indeg_l, self.node_ptr),
                            _seg_max(outdeg_l, self.node_ptr))
        if self.loops.any():
            self.nl_ptr = np.concatenate([[0], np.cumsum(self.e - self.loops)])
            self.ei_nl = self.ei[:, torch.from_numpy(keep)].contiguous()
        else:
            self.nl_ptr, self.ei_nl = None, None

    # ------------------------------------------------------------------ batches
    def __len__(self) -> int:
        return self.num_graphs

    def batch(self, ids: Union[Sequence[int], np.ndarray, Tensor],
              device: Optional[Union[str, torch.device]] = None) -> Any:
        """The :class:`~torch_geometric.data.Batch` of graphs ``ids`` (in that
        order) on ``device``, with the store's ``views`` attached to the
        layers' graph cache.  No host-device synchronisation."""
        from torch_geometric.data import Batch
        ids = np.asarray(ids.cpu() if isinstance(ids, Tensor) else ids, dtype=np.int64)
        if ids.ndim != 1:
            raise ValueError(f"'ids' must be one-dimensional, got shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_graphs):
            raise ValueError(f"'ids' must be graph indices in [0, {self.num_graphs}), got "
                             f"{int(ids.min())}..{int(ids.max())}")
        device = torch.device(device) if device is not None else torch.device("cpu")
        pin = device.type == "cuda"
        nc, ec = self.n[ids], self.e[ids]
        N, E, B = int(nc.sum()), int(ec.sum()), int(ids.size)
        n0, n1 = self.node_ptr[ids], self.node_ptr[ids + 1]
        e0, e1 = self.edge_ptr[ids], self.edge_ptr[ids + 1]
        node_off = np.concatenate([[0], np.cumsum(nc)])
        edge_off = np.concatenate([[0], np.cumsum(ec)])

        def host(t: Tensor, a, b, dim=0) -> Tensor:
            shape = list(t.shape)
            shape[dim] = int((b - a).sum())
            buf = torch.empty(shape, dtype=t.dtype, pin_memory=pin)
            return _segments(t, a, b, dim, out=buf).to(device, non_blocking=pin)

        nl = ec - self.loops[ids]
        meta = torch.from_numpy(np.stack([node_off[:-1], nc, ec, nl]))
        meta = (meta.pin_memory() if pin else meta).to(device, non_blocking=pin)
        noff_e = torch.repeat_interleave(meta[0], meta[2], output_size=E)
        edge_index = host(self.ei, e0, e1, dim=1).long() + noff_e
        attrs: Dict[str, Tensor] = {k: host(v, n0, n1) for k, v in self.node_attrs.items()}
        for k, v in self.edge_attrs.items():
            attrs[k] = host(v, e0, e1)
        for k, v in self.graph_attrs.items():
            attrs[k] = host(v, ids, ids + 1)
        batch_vec = torch.repeat_interleave(torch.arange(B, device=device), meta[1],
                                            output_size=N)
        ptr = torch.from_numpy(node_off)
        ptr = (ptr.pin_memory() if pin else ptr).to(device, non_blocking=pin)
        out = Batch(edge_index=edge_index, batch=batch_vec, ptr=ptr, **attrs)
        out._num_graphs = B
        if self.views:
            nonloop = None
            if self.ei_nl is not None and any(self.views):
                a, b = self.nl_ptr[ids], self.nl_ptr[ids + 1]
                noff_nl = torch.repeat_interleave(meta[0], meta[3], output_size=int(nl.sum()))
                nonloop = host(self.ei_nl, a, b, dim=1).long() + noff_nl
            maxima = [(int(self.stats[v][0][ids].max(initial=0)),
                       int(self.stats[v][1][ids].max(initial=0))) for v in self.views]
            graphs = sorted_graph_views(edge_index, N, self.views,
                                        [m[0] for m in maxima], [m[1] for m in maxima],
                                        nonloop)
            for v, g in zip(self.views, graphs):
                _graph.attach(edge_index, g, (N, N), N if v else None)
        return out


def _is_zero(inc: Any) -> bool:
    if isinstance(inc, Tensor):
        return bool((inc == 0).all())
    return inc == 0 or inc is None


class GraphBatchLoader:
    """Iterates over batches of a :class:`GraphBatcher`, like PyG's
    ``DataLoader(dataset, batch_size, shuffle|sampler, drop_last)`` does over
    the same graphs (same grouping of graph indices into batches).

    Args:
        store (GraphBatcher): the graphs.
        batch_size (int): graphs per batch.
        shuffle (bool): a random order each pass (``generator`` seeds it).
        sampler (iterable of int, optional): the graph indices to visit, in
            order (e.g. a ``DistributedSampler``); excludes ``shuffle``.
        drop_last (bool): drop a last, incomplete batch.
        device: where batches are made.
    """

    def __init__(self, store: GraphBatcher, batch_size: int = 1, shuffle: bool = False,
                 sampler: Optional[Iterable[int]] = None, drop_last: bool = False,
                 device: Optional[Union[str, torch.device]] = None,
                 generator: Optional[torch.Generator] = None):
        if not isinstance(store, GraphBatcher):
            raise ValueError(f"'store' must be a GraphBatcher, got {type(store).__name__}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"'batch_size' must be a positive integer, got {batch_size!r}")
        if shuffle and sampler is not None:
            raise ValueError("'sampler' and 'shuffle' are mutually exclusive")
        self.store, self.batch_size, self.shuffle = store, batch_size, shuffle
        self.sampler, self.drop_last, self.device = sampler, drop_last, device
        self.generator = generator

    def _order(self) -> np.ndarray:
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), np.int64)
        if self.shuffle:
            return torch.randperm(len(self.store), generator=self.generator).numpy()
        return np.arange(len(self.store))

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.store)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def id_batches(self) -> Iterator[np.ndarray]:
        """The graph indices of each batch, in order (what :meth:`__iter__`
        makes its batches of)."""
        order = self._order()
        bs = self.batch_size
        stop = len(order) - len(order) % bs if self.drop_last else len(order)
        for i in range(0, stop, bs):
            yield order[i:i + bs]

    def __iter__(self) -> Iterator[Any]:
        for ids in self.id_batches():
            yield self.store.batch(ids, self.device)
