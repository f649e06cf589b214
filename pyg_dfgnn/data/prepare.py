"""Graph preparation off the training step's critical path.

PyG's :class:`~torch_geometric.loader.DataLoader` hands over a new
:class:`~torch_geometric.data.Batch` every step, so the layers' graph cache
(keyed on the ``edge_index`` object) misses and the first layer of every step
converts the batch to CSR on the training device -- with host syncs for the
validation and the degree statistics.  Here the conversion runs where the
batch is collated instead (in the DataLoader's worker processes when
``num_workers > 0``), the result travels with the batch through
``batch.to(device)`` (``non_blocking`` from pinned memory), and
:func:`attach_prepared` registers it in the graph cache on the device without
any host-device synchronisation:

.. code-block:: python

    from pyg_dfgnn.data import PrepareGraphs, PreparedDataLoader, attach_prepared

    loader = PreparedDataLoader(dataset, batch_size=128, shuffle=True, num_workers=4,
                                pin_memory=True, prepare=PrepareGraphs(self_loops=True))
    for batch in loader:
        batch = attach_prepared(batch.to(device, non_blocking=True))
        out = model(batch.x, batch.edge_index)   # every layer hits the cache

``self_loops`` names the views the model's layers ask for: ``True`` for
``GATConv`` / ``GATv2Conv`` / ``AGNNConv`` with ``add_self_loops=True`` (their
looped view), ``False`` for ``TransformerConv`` and layers without self-loops,
``(False, True)`` for a model mixing both.  A view no layer asks for only costs
preparation time; a layer whose view was not prepared converts as before.

The prepared CSR is built by the same functions as the layers' own conversion
(:func:`pyg_dfgnn.graph.build_graph`), so it is identical to it, and bad input
raises the same :class:`ValueError` (re-raised by the DataLoader from the
worker, with the worker's traceback).
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.loader import DataLoader

from .. import graph as _graph
from ..graph import CSRGraph

__all__ = ["PREPARED_KEY", "PreparedGraph", "prepare_graph", "PrepareGraphs",
           "PrepareCollater", "PreparedDataLoader", "attach_prepared"]

#: the attribute of a batch that carries its prepared graphs
PREPARED_KEY = "dfgnn_graphs"


class PreparedGraph(NamedTuple):
    """A :class:`~pyg_dfgnn.graph.CSRGraph` in a form that PyG's
    ``Data.to`` / ``pin_memory`` / ``apply`` carry: tensors (moved) and Python
    ints (kept as they are, so the device side needs no host sync to read
    them)."""

    rowptr: Tensor
    col: Tensor
    perm: Optional[Tensor]
    t_rowptr: Tensor
    t_col: Tensor
    t_perm: Tensor
    #: content hash of the ``edge_index`` it was built from (``[1]`` int64)
    fingerprint: Tensor
    num_src: int
    num_dst: int
    max_in_degree: int
    max_out_degree: int
    #: ``None`` (the graph as given) or ``num_nodes`` (PyG's self-loop handling)
    self_loops: Optional[int]

    def to_graph(self) -> CSRGraph:
        """The :class:`~pyg_dfgnn.graph.CSRGraph` (sharing the tensors)."""
        return CSRGraph(rowptr=self.rowptr, col=self.col, perm=self.perm,
                        t_rowptr=self.t_rowptr, t_col=self.t_col, t_perm=self.t_perm,
                        num_src=self.num_src, num_dst=self.num_dst,
                        max_in_degree=self.max_in_degree, max_out_degree=self.max_out_degree)


def prepare_graph(edge_index: Tensor, num_nodes: int, self_loops: bool = False
                  ) -> PreparedGraph:
    """The CSR view a layer of :mod:`pyg_dfgnn.nn` builds for ``edge_index`` on
    ``num_nodes`` nodes: with ``self_loops=False`` the one of
    ``get_graph(edge_index, (N, N))`` (``TransformerConv``, layers without
    self-loops), with ``self_loops=True`` the one of ``get_graph(edge_index,
    (N, N), N)`` (``GATConv``/``GATv2Conv``/``AGNNConv`` with
    ``add_self_loops=True``).  Raises the layers' :class:`ValueError` for
    an invalid ``edge_index``."""
    if not isinstance(edge_index, Tensor) or _graph.is_torch_sparse(edge_index):
        raise ValueError(f"'edge_index' must be a tensor of shape [2, num_edges], got "
                         f"{type(edge_index).__name__}")
    num_nodes = int(num_nodes)
    if num_nodes < 0:
        raise ValueError(f"'num_nodes' must be >= 0, got {num_nodes}")
    if self_loops:
        g = _graph._with_self_loops(edge_index, num_nodes, num_nodes, num_nodes)
    else:
        g = _graph.build_graph(edge_index, (num_nodes, num_nodes))
    return PreparedGraph(g.rowptr, g.col, g.perm, g.t_rowptr, g.t_col, g.t_perm,
                         _graph.content_hash(edge_index), g.num_src, g.num_dst,
                         g.max_in_degree, g.max_out_degree,
                         num_nodes if self_loops else None)


def _views(self_loops: Union[bool, Sequence[bool]]) -> Tuple[bool, ...]:
    if isinstance(self_loops, bool):
        return (self_loops,)
    try:
        views = tuple(self_loops)
    except TypeError:
        views = ()
    if not views or not all(isinstance(v, bool) for v in views):
        raise ValueError(f"'self_loops' must be a bool or a non-empty sequence of bools "
                         f"(the views to prepare), got {self_loops!r}")
    return tuple(dict.fromkeys(views))


class PrepareGraphs:
    r"""Transform that adds the prepared CSR view(s) of ``data.edge_index`` to a
    (batched) homogeneous graph as ``data.dfgnn_graphs`` (a list of
    :class:`PreparedGraph`).

    Apply it to *collated* batches -- :class:`PreparedDataLoader` does, in the
    DataLoader's workers -- not as a dataset transform: the prepared graph of
    a single graph is not what its batch needs.  :func:`attach_prepared` puts
    the views into the layers' graph cache once the batch is on its device.

    Args:
        self_loops (bool or sequence of bool): which views to prepare (see
            :mod:`pyg_dfgnn.data.prepare`): ``True`` for the looped view of
            GAT/GATv2/AGNN layers with ``add_self_loops=True``, ``False`` for
            ``TransformerConv`` and layers without self-loops.
    """

    def __init__(self, self_loops: Union[bool, Sequence[bool]] = False):
        self.views = _views(self_loops)

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> Optional["PrepareGraphs"]:
        """The transform preparing exactly the views that the
        :mod:`pyg_dfgnn.nn` layers of ``model`` ask for when called as
        ``conv(x, edge_index)`` on all nodes of a batch (``None`` when the
        model has no such layer)."""
        from ..nn._fused import FusedAttentionMixin
        views = [bool(getattr(m, "add_self_loops", False)) for m in model.modules()
                 if isinstance(m, FusedAttentionMixin)]
        return cls(sorted(set(views))) if views else None

    def __call__(self, data: Any) -> Any:
        from torch_geometric.data import HeteroData
        if isinstance(data, HeteroData):
            raise ValueError("PrepareGraphs: 'data' must be a homogeneous Data / Batch, "
                             "got HeteroData")
        edge_index = getattr(data, "edge_index", None)
        if edge_index is None:
            raise ValueError("PrepareGraphs: 'data' has no 'edge_index'")
        n = data.num_nodes
        if n is None:
            raise ValueError("PrepareGraphs: the number of nodes of 'data' is unknown "
                             "(no 'x' or 'num_nodes')")
        data[PREPARED_KEY] = [prepare_graph(edge_index, n, v) for v in self.views]
        return data

    def __repr__(self) -> str:
        v = self.views[0] if len(self.views) == 1 else list(self.views)
        return f"{type(self).__name__}(self_loops={v})"


class PrepareCollater:
    """``collate_fn`` wrapper: ``prepare(collate(data_list))`` (picklable, so it
    runs in the DataLoader's worker processes)."""

    def __init__(self, collate, prepare: PrepareGraphs):
        self.collate, self.prepare = collate, prepare

    def __call__(self, data_list: List[Any]) -> Any:
        return self.prepare(self.collate(data_list))


class PreparedDataLoader(DataLoader):
    """PyG's :class:`~torch_geometric.loader.DataLoader` whose batches carry
    their prepared graph views (see :class:`PrepareGraphs`), built where the
    batch is collated (in the worker processes when ``num_workers > 0``).

    Takes the arguments of PyG's ``DataLoader`` plus ``prepare`` (a
    :class:`PrepareGraphs`, default ``PrepareGraphs()``).
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 follow_batch: Optional[List[str]] = None,
                 exclude_keys: Optional[List[str]] = None,
                 prepare: Optional[PrepareGraphs] = None, **kwargs: Any):
        if prepare is None:
            prepare = PrepareGraphs()
        if not isinstance(prepare, PrepareGraphs):
            raise ValueError(f"'prepare' must be a pyg_dfgnn.data.PrepareGraphs, got "
                             f"{type(prepare).__name__}")
        super().__init__(dataset, batch_size, shuffle, follow_batch, exclude_keys, **kwargs)
        self.prepare = prepare
        self.collate_fn = PrepareCollater(self.collate_fn, prepare)


def attach_prepared(batch: Any) -> Any:
    """Register the prepared graph views of ``batch`` (on its device, after
    ``batch.to(device)``) in the layers' graph cache for ``batch.edge_index``,
    so that every layer of the model hits the cache.  No host-device sync.
    Returns ``batch``; a batch without prepared views is returned unchanged."""
    views = getattr(batch, PREPARED_KEY, None) if hasattr(batch, "keys") else None
    if not views:
        return batch
    edge_index = batch.edge_index
    for p in views:
        if not isinstance(p, PreparedGraph):  # a list after PyG's .to(): rebuild the tuple
            p = PreparedGraph(*p)
        if p.rowptr.device != edge_index.device:
            raise ValueError(f"'batch': its prepared graphs are on {p.rowptr.device} but "
                             f"batch.edge_index is on {edge_index.device}; move the whole "
                             f"batch with batch.to(device) before attach_prepared(batch)")
        _graph.attach(edge_index, p.to_graph(), (p.num_src, p.num_dst), p.self_loops,
                      p.fingerprint)
    return batch
