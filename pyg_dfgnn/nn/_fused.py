"""Shared plumbing of the drop-in attention layers.

Everything the four layers have in common lives here, so that each layer file
only holds the few lines that differ from PyG's ``forward``:

* :class:`FusedAttentionMixin` -- when to fall back to PyG's own message
  passing (explain mode, hooks, ``decomposed_layers > 1``, unusual ``flow`` /
  ``aggr``, overridden ``message`` & co., tracing, unsupported dtypes), the
  once-per-reason warning on CUDA, and a clear TorchScript error;
* :func:`resolve_adjacency` -- every adjacency PyG accepts (``edge_index``
  tensor, :class:`~torch_geometric.EdgeIndex`, ``torch_sparse.SparseTensor``,
  ``torch.sparse`` tensors) plus PyG's self-loop handling, turned into a cached
  :class:`~pyg_dfgnn.graph.CSRGraph`, the (looped) edge features in the graph's
  original edge order, and the (looped) adjacency PyG would hand back;
* :func:`common_dtype` -- one dtype for all inputs of a fused call (autocast);
* :func:`attention_weights` -- PyG's ``return_attention_weights`` formats.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, NamedTuple, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.utils import add_self_loops, remove_self_loops
from torch_geometric.utils.sparse import set_sparse_value

from ..graph import CSRGraph, GraphRef, get_graph, is_sparse_tensor, is_torch_sparse, plain
from ..ops import SUPPORTED_DTYPES
from ._glue import _global_hooks, _plain_params, add_bias

__all__ = ["FusedAttentionMixin", "Adjacency", "resolve_adjacency", "common_dtype",
           "attention_weights", "check_sparse_loops", "generic_propagate"]

#: PyG's generic (non-templated) ``propagate``: supports explain mode, hooks and
#: ``decomposed_layers``, whatever class it is called on.
generic_propagate = MessagePassing.__dict__.get("_orig_propagate",
                                                MessagePassing.__dict__["propagate"])

_HOOK_DICTS = (
    "_propagate_forward_pre_hooks", "_propagate_forward_hooks",
    "_message_forward_pre_hooks", "_message_forward_hooks",
    "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
    "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks",
    "_edge_update_forward_pre_hooks", "_edge_update_forward_hooks",
)

#: methods whose override by a user subclass the fused path would silently skip
_PYG_METHODS = ("message", "aggregate", "message_and_aggregate", "update",
                "edge_update", "explain_message")

_WARNED: set = set()

#: the dtypes of the layers' one-op paths (the CUDA kernels' own)
LAYER_OP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _warn_once(cls: type, reason: str) -> None:
    key = (cls, reason)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"pyg_dfgnn.nn.{cls.__name__}: falling back to PyG's own (unfused) message "
        f"passing because of {reason}. Results are PyG's; only speed is lost. "
        f"(This warning is shown once per layer class and reason.)", stacklevel=4)


class FusedAttentionMixin:
    """Mixed in *before* the PyG class: ``class GATConv(FusedAttentionMixin,
    torch_geometric.nn.GATConv)``.  Subclasses set ``_pyg_cls`` to that PyG
    class."""

    _pyg_cls: type = MessagePassing

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        super()._set_jittable_templates(raise_on_error)
        # PyG records ``cls.propagate`` as the "original" propagate used in
        # explain mode and for ``decomposed_layers > 1``.  For a subclass of an
        # already instantiated PyG conv that is the parent's *templated*
        # propagate, which supports neither (explain masks would be ignored):
        # pin PyG's generic implementation instead.
        cls = type(self)
        if cls.__dict__.get("_orig_propagate") is not generic_propagate:
            cls._orig_propagate = generic_propagate
            if self.__dict__.get("_explain") or self.__dict__.get("_decomposed_layers", 1) > 1:
                self.propagate = generic_propagate.__get__(self, cls)  # (unpickling)

    def _fused_fallback_reason(self, *tensors: Any) -> Optional[str]:
        """Why this call cannot take the fused path (``None`` if it can).

        ``tensors`` are the node-feature inputs (``None`` and pairs allowed).
        """
        # (this runs on every layer call, eager or under torch.compile: plain
        # reads where PyG's are plain -- host time, docs/KERNELS.md, session 42)
        if torch.jit.is_tracing():
            return "torch.jit tracing"
        if self.explain:
            return "explain mode"
        if self.decomposed_layers > 1:
            return "decomposed_layers > 1"
        d = self.__dict__
        for name in _HOOK_DICTS:
            hooks = d[name] if name in d else getattr(self, name)
            if len(hooks) > 0:
                return "registered message-passing hooks"
        if self.flow != "source_to_target":
            return f"flow='{self.flow}'"
        if self.aggr not in ("add", "sum"):
            return f"aggr={self.aggr!r}"
        cls = type(self)
        for name in _PYG_METHODS:
            if getattr(cls, name) is not getattr(self._pyg_cls, name):
                return f"an overridden '{name}'"
        if self.training and getattr(self, "dropout", 0.0) >= 1.0:
            return "dropout >= 1"
        for t in tensors:
            if type(t) is Tensor or isinstance(t, Tensor):
                if t.dtype not in SUPPORTED_DTYPES:
                    return f"dtype {t.dtype}"
            elif isinstance(t, (tuple, list)):
                for u in t:
                    if isinstance(u, Tensor) and u.dtype not in SUPPORTED_DTYPES:
                        return f"dtype {u.dtype}"
        return None

    def _fused_fallback(self, reason: str, like: Any) -> None:
        """Record a fallback (warns once per class and reason on CUDA)."""
        if isinstance(like, (tuple, list)):
            like = like[0]
        if isinstance(like, Tensor) and like.is_cuda and not torch.compiler.is_compiling():
            _warn_once(type(self), reason)

    def _fused_edge_features(self, edge_attr: Tensor) -> Tensor:
        """GAT/GATv2: ``lin_edge`` of (1-D promoted) edge features, ``[E, H, C]``."""
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        return self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)

    def _fused_merge_heads(self, out: Tensor, res: Optional[Tensor],
                           add_bias_here: bool = True) -> Tensor:
        """GAT/GATv2 epilogue: concat or average heads, residual, bias (unless
        ``add_bias_here`` is false: the kernel added it).  ``out`` may be in the
        kernels' padded head width (:mod:`._padded`): its real columns are
        sliced out in the pass that adds the bias."""
        H, C = self.heads, self.out_channels
        if not add_bias_here:   # (the kernel's output is the layer's, as a view)
            return out.view(-1, H * C) if self.concat else out.view(-1, C)
        if out.size(-1) != C:
            out = out[..., :C]
            if self.concat and self.bias is not None and res is None:
                return add_bias(out, self.bias.view(H, C)).view(-1, H * C)
        if self.concat:
            out = out.reshape(-1, H * C)
        else:
            out = out.mean(dim=1)
        if res is not None:
            out = out + res
        if self.bias is not None:
            out = add_bias(out, self.bias)   # GEMV bias gradient (nn/_glue.py)
        return out

    # -- the one-op layer paths (the layers' ``_layer_op``) ----------------------

    @staticmethod
    def _layer_op_applies(flag, x: Tensor, edge_index: Any, cpu: bool = False,
                          dtypes: Tuple[torch.dtype, ...] = LAYER_OP_DTYPES) -> bool:
        """Whether a call may take a layer's one-op path (``dfgnn_C::*_layer``)
        as far as its inputs go: the layer module's ``flag`` (``LAYER_OP``) on,
        an eager CUDA call (or CPU call, with ``cpu``) of a 2-D ``x`` in one of
        ``dtypes`` (the kernel dtypes) on an ``edge_index`` tensor, no
        autocast, no global module hooks (the path does not call the
        projections' modules)."""
        return bool(flag[0] and (x.is_cuda or (cpu and x.is_cpu)) and x.dim() == 2
                    and x.dtype in dtypes
                    and isinstance(edge_index, Tensor) and edge_index.layout == torch.strided
                    and not torch.compiler.is_compiling()
                    and not torch.is_autocast_enabled(x.device.type) and not _global_hooks())

    @staticmethod
    def _layer_op_maps(lins, rows: int, x: Tensor):
        """``[(weight, bias)]`` of projections a one-op path can run itself, or
        ``None`` where one of ``lins`` is not such a map: a plain linear map
        (no hooks) with a ``[rows, in]`` weight and a ``[rows]`` bias or none,
        in ``x``'s dtype and on its device (``x``'s attributes read once)."""
        shape, dtype, device = (rows, x.size(1)), x.dtype, x.device
        out = []
        for lin in lins:
            wb = _plain_params(lin)
            if wb is None:
                return None
            w, b = wb
            if (w.shape != shape or w.dtype != dtype or w.device != device
                    or (b is not None and (b.shape != (rows,) or b.dtype != dtype
                                           or b.device != device))):
                return None
            out.append(wb)
        return out

    def _member(self, name: str) -> Any:
        """``getattr(self, name)`` for a parameter, buffer or submodule slot, read
        from the module's own dicts where it is registered there (each
        ``Module.__getattr__`` costs about a microsecond of a layer call's host
        time)."""
        for d in (self._parameters, self._buffers, self._modules):   # (__getattr__'s order)
            if name in d:
                return d[name]
        return getattr(self, name)

    def _layer_op_graph(self, x: Tensor, edge_index: Tensor, loops: bool) -> Optional[CSRGraph]:
        """The cached CSR graph of a one-op call on the node set of ``x``
        (PyG's self-loops where ``loops``), or ``None`` where it is not that
        square graph."""
        n = x.size(0)
        if n == 0:
            return None
        if type(edge_index) is Tensor:   # (what resolve_adjacency does for it)
            g = get_graph(edge_index, (n, n), n if loops else None)
        else:
            g = resolve_adjacency(edge_index, None, n, n, loops=n if loops else None,
                                  fill_value=getattr(self, "fill_value", None)).graph
        return g if isinstance(g, CSRGraph) and g.num_src == n and g.num_dst == n else None

    @property
    def _fused_dropout(self) -> float:
        """Attention dropout of this call (PyG applies it in training only)."""
        return float(self.dropout) if self.training else 0.0

    def __prepare_scriptable__(self):
        raise RuntimeError(
            f"pyg_dfgnn.nn.{type(self).__name__} cannot be compiled with TorchScript "
            f"(torch.jit.script): its fused attention runs through a torch.library custom "
            f"op and a Python graph cache. Use torch.compile(model) instead, or build the "
            f"model from torch_geometric.nn.{type(self).__name__} and load this layer's "
            f"state_dict into it.")


# --------------------------------------------------------------------------- #
# adjacency
# --------------------------------------------------------------------------- #

class Adjacency(NamedTuple):
    """What a layer needs to know about its adjacency for one call."""

    graph: CSRGraph
    #: edge features PyG would use (looped, original edge order), or ``None``
    edge_attr: Optional[Tensor]
    #: the (looped) adjacency PyG returns with the attention weights; only
    #: meaningful when requested with ``need_adj=True``
    adj: Any


def _torch_sparse_values(adj: Tensor) -> Tensor:
    return adj._values() if adj.layout == torch.sparse_coo else adj.values()


def _pyg_loops(adj: Any, edge_attr: Optional[Tensor], fill_value: Any,
               num_nodes: int) -> Tuple[Any, Optional[Tensor]]:
    """PyG's ``remove_self_loops`` + ``add_self_loops`` (exactly, errors included)."""
    adj, edge_attr = remove_self_loops(adj, edge_attr)
    return add_self_loops(adj, edge_attr, fill_value=fill_value, num_nodes=num_nodes)


def looped_edge_attr(edge_index: Tensor, edge_attr: Tensor, fill_value: Any,
                     num_nodes: int, num_dst: Optional[int] = None) -> Tensor:
    """The edge features of PyG's ``remove_self_loops`` + ``add_self_loops(
    edge_index, edge_attr, fill_value, num_nodes)`` on an ``edge_index``
    tensor: those of the non-loop edges in their order, then one row per
    node ``0 .. num_nodes-1`` filled as PyG fills it (``None``: ones; a
    number; a tensor; ``'add'``/``'sum'``/``'mean'``/``'min'``/``'max'``/
    ``'mul'``: that reduction of the features of the node's incoming non-loop
    edges, PyG's ``scatter``).

    Unlike PyG's own call, the reduction always runs on an int64 index: with an
    int32 ``edge_index`` the gradient of ``torch``'s scatter with an int32 index
    is wrong (and NaN for ``'max'``/``'min'``), and uint8/int8/int16 indices are
    widened before any arithmetic.  ``num_dst`` (the validated number of
    targets) spares the out-of-range check when it cannot fail.
    """
    from torch_geometric.utils import scatter
    ei = plain(edge_index)
    if ei.dtype not in (torch.int64, torch.int32):
        ei = ei.long()
    mask = ei[0] != ei[1]
    attr = edge_attr[mask]
    size = (num_nodes,) + tuple(attr.shape[1:])
    if fill_value is None:
        loop = attr.new_ones(size)
    elif isinstance(fill_value, (int, float)):
        loop = attr.new_full(size, fill_value)
    elif isinstance(fill_value, Tensor):
        loop = fill_value.to(attr.device, attr.dtype)
        if attr.dim() != loop.dim():
            loop = loop.unsqueeze(0)
        loop = loop.expand(size).contiguous()
    elif isinstance(fill_value, str):
        tgt = ei[1][mask].long()
        # targets are < num_dst (validated when the graph was converted), so only
        # num_dst > num_nodes (bipartite) needs the check, and its host sync
        if (tgt.numel() and tgt.is_cuda and (num_dst is None or num_dst > num_nodes)
                and int(tgt.max()) >= num_nodes):
            # PyG's add_self_loops indexes out of bounds here (a RuntimeError on the
            # CPU); on CUDA that would be a device-side assert, so say it first
            raise RuntimeError(
                f"'edge_index' has target index {int(tgt.max())}, out of range for the "
                f"self-loop features (fill_value={fill_value!r}) of num_nodes={num_nodes} "
                f"nodes (PyG's add_self_loops fails on this input as well)")
        loop = scatter(attr, tgt, 0, num_nodes, fill_value)
    else:
        raise AttributeError("No valid 'fill_value' provided")  # PyG's error
    return torch.cat([attr, loop], dim=0)


def _looped_index(edge_index: Tensor, num_nodes: int) -> Tensor:
    """PyG's looped ``edge_index`` (non-loop edges, then ``0..num_nodes-1``)
    for an index dtype too small for PyG's own ``arange`` (widened to int64)."""
    ei = plain(edge_index).long()
    loops = torch.arange(num_nodes, device=ei.device).view(1, -1).expand(2, -1)
    return torch.cat([ei[:, ei[0] != ei[1]], loops], dim=1)


def resolve_sizes(edge_index: Any, size: Any, num_src: Optional[int],
                  num_dst: Optional[int]) -> Tuple[int, int]:
    """``(num_src, num_dst)`` exactly as PyG's ``propagate`` infers them."""
    s = _pick_sizes(edge_index, size, num_src, num_dst)
    return int(s[0]), int(s[1])


def _pick_sizes(edge_index: Any, size: Any, num_src: Any, num_dst: Any) -> list:
    """:func:`resolve_sizes` without the ``int`` conversion (symbolic sizes
    stay symbolic under torch.compile; ``None`` where nothing gives a size)."""
    if isinstance(edge_index, EdgeIndex):
        s = [edge_index.num_rows, edge_index.num_cols]
    elif is_sparse_tensor(edge_index) or is_torch_sparse(edge_index):
        s = [edge_index.size(1), edge_index.size(0)]
    else:
        s = [size[0], size[1]] if size is not None else [None, None]
    if s[0] is None:
        s[0] = num_src
    if s[1] is None:
        s[1] = num_dst
    if s[0] is None:
        s[0] = s[1]
    if s[1] is None:
        s[1] = s[0]
    return s


def check_sparse_loops(edge_index: Any, edge_dim: Optional[int]) -> None:
    """PyG's GAT/GATv2 refuse self-loops + ``edge_dim`` on a ``SparseTensor``."""
    if is_sparse_tensor(edge_index) and edge_dim is not None:
        raise NotImplementedError(
            "The usage of 'edge_attr' and 'add_self_loops' "
            "simultaneously is currently not yet supported for "
            "'edge_index' in a 'SparseTensor' form")


def implied_edge_attr(edge_index: Any, edge_attr: Optional[Tensor]) -> Optional[Tensor]:
    """The edge features PyG's ``_collect`` sees: ``edge_attr`` or else the
    values of a ``SparseTensor`` (any) / ``torch.sparse`` tensor (if not 1-D)."""
    if edge_attr is not None:
        return edge_attr
    if is_sparse_tensor(edge_index):
        return edge_index.storage.value()
    if is_torch_sparse(edge_index):
        v = _torch_sparse_values(edge_index)
        return v if v.dim() > 1 else None
    return None


def _resolve_adjacency(edge_index: Any, size: Any, num_src: Optional[int],
                       num_dst: Optional[int], *, loops: Optional[int] = None,
                       fill_value: Any = None, edge_attr: Optional[Tensor] = None,
                       use_edge_attr: bool = False, need_adj: bool = False) -> Adjacency:
    """Adjacency of one layer call, following PyG's ``forward`` + ``propagate``.

    Args:
        edge_index: any adjacency PyG accepts.
        size: ``propagate``'s ``size`` argument.
        num_src, num_dst: rows of the source / destination features (or ``None``).
        loops: ``None`` for no self-loops, else the ``num_nodes`` PyG passes to
            ``add_self_loops`` (``set_diag`` for a ``SparseTensor``).
        fill_value: ``add_self_loops``'s ``fill_value`` for looped edge features.
        edge_attr: the ``edge_attr`` argument of the layer.
        use_edge_attr: whether the layer consumes edge features at all
            (``lin_edge is not None``); if not, none are prepared.
        need_adj: also build the looped adjacency PyG returns with the
            attention weights.
    """
    if type(edge_index) is Tensor and edge_index.layout == torch.strided:
        return _dense_adjacency(edge_index, size, num_src, num_dst, loops, fill_value,
                                edge_attr, use_edge_attr, need_adj)
    if is_sparse_tensor(edge_index):
        if loops is not None:
            graph = get_graph(edge_index, None, 0)  # torch_sparse.set_diag
            adj = graph.adj
        else:
            graph = get_graph(edge_index)
            adj = edge_index
        ea = implied_edge_attr(adj, edge_attr) if use_edge_attr else None
        return Adjacency(graph, ea, adj)

    if is_torch_sparse(edge_index):
        adj = edge_index
        if loops is None:
            graph = get_graph(edge_index)
        elif edge_attr is not None or (use_edge_attr and
                                       implied_edge_attr(edge_index, None) is not None):
            # PyG's own functions (they refuse an explicit edge_attr here)
            adj, edge_attr = _pyg_loops(edge_index, edge_attr, fill_value, loops)
            graph = get_graph(adj)
        else:
            graph = get_graph(edge_index, None, loops)  # graph.py applies PyG's loops
            adj = graph.adj
        ea = implied_edge_attr(adj, edge_attr) if use_edge_attr else None
        return Adjacency(graph, ea, adj)

    if not isinstance(edge_index, Tensor):
        raise ValueError(
            '`MessagePassing.propagate` only supports integer tensors of '
            'shape `[2, num_messages]`, `torch_sparse.SparseTensor` '
            'or `torch.sparse.Tensor` for argument `edge_index`.')
    return _dense_adjacency(edge_index, size, num_src, num_dst, loops, fill_value, edge_attr,
                            use_edge_attr, need_adj)


def _dense_adjacency(edge_index: Tensor, size: Any, num_src: Optional[int],
                     num_dst: Optional[int], loops: Optional[int], fill_value: Any,
                     edge_attr: Optional[Tensor], use_edge_attr: bool,
                     need_adj: bool) -> Adjacency:
    """:func:`_resolve_adjacency` of an ``edge_index`` tensor (or EdgeIndex)."""
    ns, nd = resolve_sizes(edge_index, size, num_src, num_dst)
    adj = edge_index
    ea = edge_attr if use_edge_attr else None
    if loops is None:
        graph = get_graph(edge_index, (ns, nd))
    else:
        # graph.py applies remove/add_self_loops itself (cached, PyG's edge order)
        graph = get_graph(edge_index, (ns, nd), loops)
        if ea is not None:
            ea = looped_edge_attr(edge_index, ea, fill_value, loops, nd)
        if need_adj:
            if edge_index.dtype in (torch.int64, torch.int32):
                adj, _ = _pyg_loops(edge_index, None, None, loops)  # PyG's types
            else:
                adj = _looped_index(edge_index, loops)
    return Adjacency(graph, ea, adj)


# The conversion is Python (weak-reference cache, one host sync on a miss) and
# cannot be traced: under torch.compile a plain edge_index tensor is handed to
# the op as a GraphRef (the op converts it when it runs, see
# ops/fused.py: graph_attention_fwd), and only the other adjacency types and
# the calls that need the converted graph in Python (attention weights,
# self-loop edge features) run it eagerly -- one graph break at the call site.
_resolve_adjacency_eager = torch.compiler.disable(
    _resolve_adjacency, reason="pyg_dfgnn: cached CSR conversion of the adjacency")


def _traceable_ref(edge_index: Any, size: Any, num_src: Optional[int],
                   num_dst: Optional[int], loops: Optional[int], edge_attr: Optional[Tensor],
                   use_edge_attr: bool, need_adj: bool) -> Optional[GraphRef]:
    """The :class:`GraphRef` of a call the op can convert itself, or ``None``."""
    if type(edge_index) is not Tensor or need_adj:
        return None
    if use_edge_attr and edge_attr is not None and loops is not None:
        return None   # looped edge features are built from the converted graph
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        return None   # the eager path raises PyG's error
    ns, nd = _pick_sizes(edge_index, size, num_src, num_dst)
    if ns is None:
        return None   # sizes from the indices' maximum: data-dependent
    return GraphRef(edge_index, ns, nd, loops)


def resolve_adjacency(edge_index: Any, size: Any, num_src: Optional[int],
                      num_dst: Optional[int], *, loops: Optional[int] = None,
                      fill_value: Any = None, edge_attr: Optional[Tensor] = None,
                      use_edge_attr: bool = False, need_adj: bool = False) -> Adjacency:
    """:func:`_resolve_adjacency` (see there for the arguments), except
    under torch.compile, where a plain ``edge_index`` tensor becomes a
    :class:`~pyg_dfgnn.graph.GraphRef` that the fused op converts when it runs
    (no graph break)."""
    if not torch.compiler.is_compiling():   # eager: no torch.compiler.disable wrapper
        return _resolve_adjacency(edge_index, size, num_src, num_dst, loops=loops,
                                  fill_value=fill_value, edge_attr=edge_attr,
                                  use_edge_attr=use_edge_attr, need_adj=need_adj)
    ref = _traceable_ref(edge_index, size, num_src, num_dst, loops, edge_attr,
                         use_edge_attr, need_adj)
    if ref is not None:
        return Adjacency(ref, edge_attr if use_edge_attr else None, edge_index)
    return _resolve_adjacency_eager(edge_index, size, num_src, num_dst, loops=loops,
                                    fill_value=fill_value, edge_attr=edge_attr,
                                    use_edge_attr=use_edge_attr, need_adj=need_adj)


# --------------------------------------------------------------------------- #
# dtypes and return values
# --------------------------------------------------------------------------- #

def common_dtype(*tensors: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    """Cast the inputs of one fused call to one dtype.

    Without autocast this is PyG's type promotion.  Under autocast the linear
    layers produce half precision while parameter products promote to float32;
    if any input is in the autocast dtype, the fused call runs in it (as a
    matmul would).
    """
    present = [t for t in tensors if t is not None]
    dt = present[0].dtype
    if all(t.dtype == dt for t in present):
        # nothing to cast (under autocast too: if any input is in the autocast
        # dtype, all are)
        return tensors
    dt = functools.reduce(torch.promote_types, [t.dtype for t in present])
    dev = present[0].device.type
    if dt == torch.float32 and dev in ("cuda", "cpu", "xpu") and \
            torch.is_autocast_enabled(dev):
        low = torch.get_autocast_dtype(dev)
        if any(t.dtype == low for t in present):  # some input came out of autocast
            dt = low
    return tuple(t if (t is None or t.dtype == dt) else t.to(dt) for t in tensors)


def attention_weights(out: Tensor, adj: Any, alpha: Tensor) -> Any:
    """GAT/GATv2's ``return_attention_weights`` result, in PyG's types."""
    if is_sparse_tensor(adj):
        return out, adj.set_value(alpha, layout='coo')
    if is_torch_sparse(adj):
        return out, (set_sparse_value(adj, alpha), alpha)
    return out, (adj, alpha)
