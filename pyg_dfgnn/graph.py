"""Graph adapter: any PyG adjacency -> destination-major CSR (+ its transpose).

The fused kernels walk the incoming edges of each destination node, so every
adjacency format PyG accepts is converted once into

* ``rowptr [N_dst + 1]``, ``col [E]`` (source ids)  -- CSR by destination,
* ``perm [E]``: CSR position -> original edge id (``None`` when identity),
* ``t_rowptr [N_src + 1]``, ``t_col [E]`` (destination ids), ``t_perm [E]``:
  the source-major transpose, ``t_perm`` mapping a transposed position to the
  CSR position of the same edge (used by the backward pass for source-side
  gradients without atomics),
* degree statistics used by the scheduler.

"Original edge order" is the order in which the caller lists the edges: the
columns of an ``edge_index`` tensor, the stored (CSR) order of a
``SparseTensor`` or a torch sparse CSR tensor, the stored order of a COO
tensor.  Edge features (``edge_attr``) and returned attention weights use it.

Conversions are cached on the adjacency object, so a static graph is
converted once, not once per layer per step.  A cached conversion is reused
only for the *same* object (weak reference) whose index tensors (the
``edge_index`` tensor; the index tensors of a sparse adjacency) have the same
shapes, the same version counters and the same content fingerprint: a 64-bit
linear hash of their elements (:func:`_fingerprint`) recomputed on every cache
hit, on the tensors' device.  On CPU every hit is fingerprinted, so an
adjacency changed in place is never served stale, whichever way it was
written -- in-place ops (version counter), writes through ``.data`` or a NumPy
view (``.numpy()``, ``torch.from_numpy``) and tensors created or changed under
:func:`torch.inference_mode` (no version counter) alike: changing any single
index always changes the fingerprint, other changes go unnoticed with
probability about ``2**-64``.  The values of a sparse adjacency are not part
of the cached conversion and not checked.

On CUDA, comparing a fingerprint needs a host sync, which stalls the
host-device pipeline on every layer call (measured on an H100: +0.5 ms per
GAT layer forward on a 1.6M-edge graph, +0.4 ms on a PATTERN batch).  So by
default a CUDA hit is fingerprinted only when a version counter cannot be
read (inference tensors); the one write that then goes unnoticed is a write
through ``.data`` into a CUDA index tensor (which autograd does not track
either).  :func:`strict_cache` (or ``PYG_DFGNN_STRICT_CACHE=1``) fingerprints
every CUDA hit as well.  Adjacency objects this package prepares itself may
skip the check (:func:`get_graph` ``trusted=True``).
"""
from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

try:  # optional dependency
    from torch_sparse import SparseTensor  # type: ignore
except Exception:  # pragma: no cover - depends on the environment
    SparseTensor = None  # type: ignore

try:
    from torch_geometric import EdgeIndex  # type: ignore
except Exception:  # pragma: no cover
    EdgeIndex = None  # type: ignore

_INT32_MAX = 2**31 - 1

#: index dtypes used as they are (``torch_geometric.typing.INDEX_DTYPES``)
INDEX_DTYPES = (torch.int64, torch.int32)
#: the integer dtypes PyG's ``propagate`` accepts for ``edge_index``; all but
#: int64/int32 are widened to int64 before any arithmetic
ACCEPTED_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def is_sparse_tensor(adj: Any) -> bool:
    """True for a ``torch_sparse.SparseTensor``."""
    return SparseTensor is not None and isinstance(adj, SparseTensor)


def is_torch_sparse(adj: Any) -> bool:
    return isinstance(adj, Tensor) and adj.layout in (
        torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)


@dataclass(eq=False)
class CSRGraph:
    """Destination-major CSR of a (possibly bipartite) graph plus its transpose."""

    rowptr: Tensor
    col: Tensor
    perm: Optional[Tensor]
    t_rowptr: Tensor
    t_col: Tensor
    t_perm: Tensor
    num_src: int
    num_dst: int
    max_in_degree: int
    max_out_degree: int
    #: the adjacency after self-loop handling, when the caller asked for
    #: loops on a SparseTensor (needed to return attention weights).
    adj: Any = None
    #: scheduler's per-graph plans, filled lazily (see :mod:`pyg_dfgnn.schedule`)
    plans: Dict[Any, Any] = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return int(self.col.numel())

    @property
    def device(self) -> torch.device:
        return self.rowptr.device

    @property
    def index_dtype(self) -> torch.dtype:
        return self.col.dtype

    @property
    def mean_in_degree(self) -> float:
        return self.num_edges / max(self.num_dst, 1)

    def in_degree(self) -> Tensor:
        return self.rowptr[1:] - self.rowptr[:-1]

    def row_index(self) -> Tensor:
        """Destination id of every CSR position (``[E]``)."""
        deg = self.in_degree().long()
        return torch.repeat_interleave(
            torch.arange(self.num_dst, device=self.device, dtype=self.col.dtype), deg,
            output_size=self.num_edges)

    def to_original(self, values: Tensor) -> Tensor:
        """Reorder a CSR-ordered per-edge tensor into the original edge order."""
        if self.perm is None:
            return values
        out = torch.empty_like(values)
        out[self.perm.long()] = values
        return out

    def to_csr_order(self, values: Tensor) -> Tensor:
        """Reorder a per-edge tensor given in original order into CSR order."""
        if self.perm is None:
            return values
        return values.index_select(0, self.perm.long())

    def __repr__(self) -> str:
        return (f"CSRGraph(num_src={self.num_src}, num_dst={self.num_dst}, "
                f"num_edges={self.num_edges}, max_in_degree={self.max_in_degree}, "
                f"max_out_degree={self.max_out_degree}, index={self.col.dtype}, "
                f"device={self.device})")


# --------------------------------------------------------------------------- #
# validation
# --------------------------------------------------------------------------- #

def _check_index(name: str, idx: Tensor, bound: int, what: str) -> None:
    if idx.numel() == 0:
        return
    lo, hi = torch.aminmax(idx)
    lo, hi = int(lo), int(hi)  # one host sync per conversion, not per launch
    if lo < 0:
        raise ValueError(f"'{name}' contains a negative {what} index ({lo})")
    if hi >= bound:
        raise ValueError(f"'{name}' contains {what} index {hi}, out of range for "
                         f"{bound} {what} nodes")


def _check_edge_index(edge_index: Tensor) -> None:
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"'edge_index' must have shape [2, num_edges], got "
                         f"{list(edge_index.shape)}")
    if edge_index.dtype not in ACCEPTED_INDEX_DTYPES:
        raise ValueError(f"'edge_index' must be an integer tensor of dtype torch.int64, "
                         f"int32, int16, int8 or uint8 (those PyG's propagate accepts; the "
                         f"small ones are widened to int64), got {edge_index.dtype}")


def plain(t: Tensor) -> Tensor:
    """``t`` as a plain :class:`torch.Tensor` (same storage).  PyG's
    ``EdgeIndex``/``Index`` keep their subclass through ``as_subclass`` (their
    ``__torch_function__`` wraps it) and then carry their own dtype through
    ``.to()``; ``as_tensor()`` is their way out."""
    if type(t) is Tensor:
        return t
    as_tensor = getattr(t, "as_tensor", None)
    return as_tensor() if callable(as_tensor) else t.as_subclass(Tensor)


def _widen(edge_index: Tensor) -> Tensor:
    """int64 copy of an index tensor in a dtype too small for index arithmetic
    (self-loop ids up to ``num_nodes`` would wrap in uint8/int8/int16)."""
    if edge_index.dtype in INDEX_DTYPES:
        return edge_index
    return plain(edge_index).long()


# --------------------------------------------------------------------------- #
# construction
# --------------------------------------------------------------------------- #

def _index_dtype(num_edges: int, num_nodes: int) -> torch.dtype:
    return torch.int32 if max(num_edges, num_nodes + 1) <= _INT32_MAX else torch.int64


def _ptr_from_sorted(sorted_idx: Tensor, n: int) -> Tensor:
    counts = torch.bincount(sorted_idx.long(), minlength=n) if sorted_idx.numel() else \
        torch.zeros(n, dtype=torch.long, device=sorted_idx.device)
    ptr = torch.zeros(n + 1, dtype=torch.long, device=sorted_idx.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    return ptr


def _finish(rowptr: Tensor, col: Tensor, perm: Optional[Tensor], num_src: int,
            num_dst: int, adj: Any = None) -> CSRGraph:
    """Build the transpose and statistics from a destination-major CSR."""
    # plain tensors: PyG's Index/EdgeIndex subclasses keep their own dtype
    # through .to() (an int32 EdgeIndex's empty column came back int64)
    rowptr, col = plain(rowptr), plain(col)
    perm = plain(perm) if perm is not None else None
    E = int(col.numel())
    itype = _index_dtype(E, max(num_src, num_dst))
    device = col.device
    rowptr = rowptr.long()
    col = col.long()
    deg = rowptr[1:] - rowptr[:-1]
    rows = torch.repeat_interleave(torch.arange(num_dst, device=device), deg, output_size=E)
    # transpose: stable sort of the CSR positions by source id
    t_perm = torch.argsort(col, stable=True) if E else torch.zeros(0, dtype=torch.long,
                                                                    device=device)
    t_col = rows[t_perm]
    t_rowptr = _ptr_from_sorted(col, num_src)
    max_in = int(deg.max()) if num_dst > 0 and E > 0 else 0
    max_out = int((t_rowptr[1:] - t_rowptr[:-1]).max()) if num_src > 0 and E > 0 else 0
    if perm is not None:
        perm = perm.to(itype)
    return CSRGraph(rowptr=rowptr.to(itype).contiguous(), col=col.to(itype).contiguous(),
                    perm=perm, t_rowptr=t_rowptr.to(itype).contiguous(),
                    t_col=t_col.to(itype).contiguous(), t_perm=t_perm.to(itype).contiguous(),
                    num_src=num_src, num_dst=num_dst, max_in_degree=max_in,
                    max_out_degree=max_out, adj=adj)


def from_edge_index(edge_index: Tensor, num_src: int, num_dst: int) -> CSRGraph:
    """``edge_index [2, E]`` (row 0 = source, row 1 = target) -> :class:`CSRGraph`."""
    _check_edge_index(edge_index)
    ei = plain(edge_index)
    ei = _widen(ei)
    src, dst = ei[0], ei[1]
    _check_index("edge_index", src, num_src, "source")
    _check_index("edge_index", dst, num_dst, "target")
    if ei.numel() and bool((dst[1:] >= dst[:-1]).all()):
        perm = None  # already destination-sorted: keep the order
        col = src
        rowptr = _ptr_from_sorted(dst, num_dst)
    else:
        perm = torch.argsort(dst, stable=True)
        col = src[perm]
        rowptr = _ptr_from_sorted(dst, num_dst)
    return _finish(rowptr, col, perm, num_src, num_dst)


def from_csr(rowptr: Tensor, col: Tensor, num_src: int, num_dst: int,
             adj: Any = None, check: bool = True) -> CSRGraph:
    """A destination-major CSR given directly (``adj_t`` convention)."""
    if rowptr.numel() != num_dst + 1:
        raise ValueError(f"'rowptr' has {rowptr.numel()} entries, expected {num_dst + 1}")
    if check:
        _check_index("adj_t", col, num_src, "source (column)")
        if rowptr.numel() > 1 and bool((rowptr[1:] < rowptr[:-1]).any()):
            raise ValueError("'adj_t' has a decreasing row pointer")
    return _finish(rowptr, col, None, num_src, num_dst, adj=adj)


def _sizes(adj: Any, size: Optional[Tuple[int, int]]) -> Tuple[Optional[int], Optional[int]]:
    if size is None:
        return None, None
    return size[0], size[1]


def build_graph(adj: Any, size: Optional[Tuple[Optional[int], Optional[int]]] = None
                ) -> CSRGraph:
    """Convert any PyG adjacency into a :class:`CSRGraph` (uncached).

    ``size = (num_src, num_dst)`` follows PyG's ``propagate(size=...)``; for
    sparse inputs the sizes come from the tensor itself.
    """
    ns, nd = _sizes(adj, size)
    if is_sparse_tensor(adj):
        rowptr, col, _ = adj.csr()
        nd_, ns_ = adj.sparse_sizes()
        return from_csr(rowptr, col, ns_, nd_, adj=adj)
    if is_torch_sparse(adj):
        nd_, ns_ = adj.shape[0], adj.shape[1]
        if adj.layout == torch.sparse_csr:
            return from_csr(adj.crow_indices(), adj.col_indices(), ns_, nd_, adj=adj)
        if adj.layout == torch.sparse_csc:
            # CSC of adj_t = source-major; original order = stored order
            ccol, row = adj.ccol_indices(), adj.row_indices()
            src = torch.repeat_interleave(torch.arange(ns_, device=row.device),
                                          (ccol[1:] - ccol[:-1]).long(),
                                          output_size=row.numel())
            g = from_edge_index(torch.stack([src, row.long()]), ns_, nd_)
            g.adj = adj
            return g
        idx = adj._indices()
        g = from_edge_index(torch.stack([idx[1], idx[0]]), ns_, nd_)
        g.adj = adj
        return g
    if not isinstance(adj, Tensor):
        raise ValueError(f"'edge_index' must be a Tensor, SparseTensor, EdgeIndex or torch "
                         f"sparse tensor, got {type(adj).__name__}")
    _check_edge_index(adj)
    if EdgeIndex is not None and isinstance(adj, EdgeIndex):
        sparse = adj.sparse_size()
        ns = ns if ns is not None else sparse[0]
        nd = nd if nd is not None else sparse[1]
    if ns is None or nd is None:
        n = int(_widen(adj).max()) + 1 if adj.numel() else 0
        ns = n if ns is None else ns
        nd = n if nd is None else nd
    if EdgeIndex is not None and isinstance(adj, EdgeIndex) and adj.is_sorted_by_col \
            and adj.numel():
        _check_index("edge_index", plain(adj)[0], ns, "source")
        _check_index("edge_index", plain(adj)[1], nd, "target")
        (colptr, row), perm = adj.get_csc()
        if colptr.numel() == nd + 1:
            g = _finish(colptr, row, perm, ns, nd)
            return g
    return from_edge_index(adj, ns, nd)


# --------------------------------------------------------------------------- #
# cache
# --------------------------------------------------------------------------- #

def _tensors_of(adj: Any):
    if is_sparse_tensor(adj):
        st = adj.storage
        # fixed positions: ``row``/``rowptr`` are filled lazily (``None`` first)
        return [st._row, st._rowptr, st._col]
    if isinstance(adj, Tensor):
        if adj.layout == torch.strided:   # edge_index (the common case)
            return [adj]
        if adj.layout == torch.sparse_csr:
            return [adj.crow_indices(), adj.col_indices()]
        if adj.layout == torch.sparse_csc:
            return [adj.ccol_indices(), adj.row_indices()]
        if adj.layout == torch.sparse_coo:
            return [adj._indices()]
        return [adj]
    return []


def _versions(tensors) -> Tuple[Optional[int], ...]:
    """Version counters of the adjacency's index tensors; ``-1`` where the
    counter cannot be read (inference tensors), ``None`` for an absent slot."""
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        try:
            out.append(t._version)
        except Exception:  # inference tensors have no version counter
            out.append(-1)
    return tuple(out)


def _same_versions(old: Tuple, new: Tuple) -> bool:
    """Versions match; a lazily computed field (``None`` on one side) is ignored."""
    return len(old) == len(new) and all(
        a is None or b is None or a == b for a, b in zip(old, new))


# --------------------------------------------------------------------------- #
# content fingerprint
# --------------------------------------------------------------------------- #

#: length of the per-device tables of random odd 64-bit weights
_FP_BLOCK = 1 << 16
_fp_tables: Dict[Any, Tuple[Tensor, Tensor]] = {}


def _fp_weights(device: torch.device) -> Tuple[Tensor, Tensor]:
    """Two tables of ``_FP_BLOCK`` random odd int64 weights on ``device``
    (fixed seed; 1 MiB per device, whatever the graph size)."""
    w = _fp_tables.get(device)
    if w is None:
        g = torch.Generator().manual_seed(0x5EED)
        a, b = (torch.randint(-2**63, 2**63 - 1, (_FP_BLOCK,), generator=g,
                              dtype=torch.int64).bitwise_or_(1) for _ in range(2))
        w = _fp_tables[device] = (a.to(device), b.to(device))
    return w


def _fingerprint(t: Tensor) -> Tensor:
    """A 64-bit linear hash of an index tensor's content (a 0-d int64 tensor on
    its device): ``sum_i w_i x_i mod 2**64`` over the flattened, int64-widened
    elements, with odd weights ``w_i = a[i % B] * b[i // B]`` from two fixed
    random tables.  Changing any single element always changes it (an odd
    weight times a nonzero difference is nonzero mod ``2**64``); other changes
    collide with probability about ``2**-64``.  Two passes over the data, no
    stored copy of it (``numel < 2**32``)."""
    if type(t) is not Tensor:
        t = plain(t)  # EdgeIndex & co.: skip their __torch_function__
    x = t.reshape(-1)
    n = x.numel()
    a, b = _fp_weights(x.device)
    if n <= _FP_BLOCK:
        return (a[:n] * x).sum()
    rows, tail = divmod(n, _FP_BLOCK)
    h = ((x[:rows * _FP_BLOCK].view(rows, _FP_BLOCK) * a).sum(1) * b[:rows]).sum()
    if tail:
        h = h + (a[:tail] * x[rows * _FP_BLOCK:]).sum() * b[rows]
    return h


def _fingerprints(tensors) -> Tuple[Tuple, Any]:
    """``(shapes, hashes)`` of the present slots: python ints on CPU, one
    stacked int64 tensor on an accelerator (compared with one host sync)."""
    shapes = tuple(None if t is None else tuple(t.shape) for t in tensors)
    present = [t for t in tensors if t is not None]
    if not present:
        return shapes, ()
    hs = [_fingerprint(t) for t in present]
    if present[0].device.type == "cpu":
        return shapes, tuple(int(h) for h in hs)
    return shapes, torch.stack(hs)


def _same_content(old: Tuple[Tuple, Any], tensors) -> bool:
    """Same shapes and fingerprints in the slots present when ``old`` was
    taken (a slot filled lazily since, like a SparseTensor's ``row``, is
    derived from the others)."""
    if old is None:   # not fingerprinted when cached (see _GraphCache.get)
        return False
    shapes, hashes = old
    if len(shapes) != len(tensors):
        return False
    now = []
    for s, t in zip(shapes, tensors):
        if s is None:
            continue
        if t is None or s != tuple(t.shape):
            return False
        now.append(t)
    new = _fingerprints(now)[1]
    if isinstance(hashes, tuple):
        return hashes == new
    return bool(torch.equal(hashes, new))  # one host sync


class _Entry(NamedTuple):
    versions: Tuple
    content: Optional[Tuple[Tuple, Any]]
    graph: "CSRGraph"


class _GraphCache:
    """id(adj) -> (weakref(adj), {key: _Entry}); entries die with adj.

    A hit needs the same object (weak reference), the same version counters of
    its index tensors and -- unless the caller marks the adjacency as
    ``trusted`` and every counter is readable -- the same content fingerprint
    (:func:`_fingerprint`), which catches the writes that bypass the version
    counter (``.data``, NumPy views, ``torch.inference_mode``).
    """

    def __init__(self) -> None:
        self._d: Dict[int, list] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        #: hits refused because the content changed behind the version counter
        self.stale = 0

    def get(self, adj: Any, key: Any, build, trusted: bool = False) -> CSRGraph:
        oid = id(adj)
        if type(adj) is Tensor and not _STRICT[0]:
            # the common hit (every layer call): an edge_index tensor on an
            # accelerator, accepted on its version counter (as below, without
            # its general steps: host time, docs/KERNELS.md, session 42)
            hit = self._plain_hit(adj, oid, key)
            if hit is not None:
                self.hits += 1
                return hit
        tensors = _tensors_of(adj)
        vers = _versions(tensors)
        hit = self._entry(adj, oid, key)
        skip = _skip_content(tensors, vers, trusted)
        if hit is not None and _same_versions(hit.versions, vers):
            if skip or _same_content(hit.content, tensors):
                self.hits += 1
                return hit.graph
            self.stale += 1
        # the fingerprint of the content the graph is built from -- only where a
        # later hit will compare it (a CUDA miss per training batch would
        # otherwise pay two passes over the indices for nothing; an entry
        # without one is rebuilt if strict_cache() is switched on later)
        content = None if skip else _fingerprints(tensors)
        graph = build()
        self.misses += 1
        self.put(adj, key, _Entry(vers, content, graph))
        return graph

    def _plain_hit(self, adj: Tensor, oid: int, key: Any) -> Optional[CSRGraph]:
        """The cached graph of a strided accelerator tensor ``adj`` whose version
        counter is that of the entry's conversion, else ``None`` (the general
        path decides)."""
        if adj.layout != torch.strided or adj.is_cpu or adj.is_inference():
            return None
        hit = self._entry(adj, oid, key)
        return hit.graph if hit is not None and hit.versions == (adj._version,) else None

    def _entry(self, adj: Any, oid: int, key: Any) -> Optional["_Entry"]:
        """The entry of ``(adj, key)``, or ``None``; an entry list left by a dead
        object whose id ``adj`` now has is dropped."""
        with self._lock:
            entries = self._d.get(oid)
            if entries is None:
                return None
            if entries[0]() is not adj:
                self._d.pop(oid, None)
                return None
            return entries[1].get(key)

    def put(self, adj: Any, key: Any, entry: "_Entry") -> bool:
        """Store ``entry`` for ``(adj, key)``; False if ``adj`` cannot be weakly
        referenced (then nothing is cached)."""
        oid = id(adj)
        with self._lock:
            entries = self._d.get(oid)
            if entries is None or entries[0]() is not adj:
                try:
                    ref = weakref.ref(adj, lambda _r, oid=oid: self._d.pop(oid, None))
                except TypeError:  # not weak-referenceable: do not cache
                    return False
                entries = [ref, {}]
                self._d[oid] = entries
            entries[1][key] = entry
        return True

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self.hits = self.misses = self.stale = 0


_cache = _GraphCache()


#: fingerprint every accelerator cache hit too (see the module docstring)
_STRICT = [os.environ.get("PYG_DFGNN_STRICT_CACHE", "0") not in ("", "0", "false")]


def strict_cache(enabled: bool = True) -> bool:
    """Fingerprint every cache hit of an accelerator (CUDA) adjacency as well,
    at the cost of one host sync per layer call (catches writes through
    ``.data`` into CUDA index tensors).  Returns the previous setting."""
    old = _STRICT[0]
    _STRICT[0] = bool(enabled)
    return old


def _on_accelerator(tensors) -> bool:
    return any(t is not None and not t.is_cpu for t in tensors)


def _skip_content(tensors, vers, trusted: bool) -> bool:
    """Whether a cache hit is accepted on its version counters alone: never for
    unversioned (inference) tensors; for trusted adjacencies and, unless
    strict_cache() is on, for accelerator tensors (module docstring)."""
    if -1 in vers:
        return False
    return trusted or (not _STRICT[0] and _on_accelerator(tensors))


def clear_cache() -> None:
    """Drop every cached graph conversion."""
    _cache.clear()


def cache_info() -> Dict[str, int]:
    """``hits``, ``misses`` (conversions), ``stale`` (hits refused because the
    content changed without a version bump) and live ``entries``."""
    return {"hits": _cache.hits, "misses": _cache.misses, "stale": _cache.stale,
            "entries": len(_cache._d)}


def _with_self_loops(adj: Any, num_nodes: int, num_src: int, num_dst: int) -> CSRGraph:
    """PyG's ``remove_self_loops`` + ``add_self_loops`` (or ``set_diag``), then CSR.

    The resulting original edge order equals PyG's: the surviving non-loop
    edges in their order, then one loop per node ``0 .. num_nodes-1``.
    """
    if is_sparse_tensor(adj):
        import torch_sparse
        looped = torch_sparse.set_diag(adj)
        return build_graph(looped)
    if is_torch_sparse(adj):
        # PyG's own utils keep the layout; the looped tensor is kept for callers
        # that return attention weights as sparse values
        from torch_geometric.utils import add_self_loops, remove_self_loops
        looped, _ = remove_self_loops(adj)
        looped, _ = add_self_loops(looped, num_nodes=num_nodes)
        g = build_graph(looped)
        g.adj = looped
        return g
    _check_edge_index(adj)
    ei = _widen(plain(adj))
    _check_index("edge_index", ei[0], num_src, "source")
    _check_index("edge_index", ei[1], num_dst, "target")
    mask = ei[0] != ei[1]
    loops = torch.arange(num_nodes, device=ei.device, dtype=ei.dtype)
    ei = torch.cat([ei[:, mask], torch.stack([loops, loops])], dim=1)
    return from_edge_index(ei, num_src, num_dst)


class GraphRef(NamedTuple):
    """A plain ``edge_index`` tensor whose CSR conversion happens inside the
    fused op, when it runs (:func:`pyg_dfgnn.ops.fused.graph_attention`).

    Under ``torch.compile`` the cached conversion (:func:`get_graph`: a
    weak-reference cache, data-dependent sizes, one host sync on a miss)
    cannot be traced; the layers then hand the op this reference instead of a
    :class:`CSRGraph`, and the op converts (or hits the cache) at run time, so
    the traced graph has no break at the layer.  ``self_loops`` as in
    :func:`get_graph`.
    """

    edge_index: Tensor
    num_src: Any
    num_dst: Any
    self_loops: Optional[Any] = None

    @property
    def device(self) -> torch.device:
        return self.edge_index.device

    @property
    def num_edges(self) -> Any:
        """Edges of the converted graph; only known before the conversion
        when no self-loops are added (``None`` otherwise)."""
        return self.edge_index.size(1) if self.self_loops is None else None

    def resolve(self) -> "CSRGraph":
        """The (cached) conversion: :func:`get_graph`."""
        return get_graph(self.edge_index, (int(self.num_src), int(self.num_dst)),
                         None if self.self_loops is None else int(self.self_loops))


def get_graph(adj: Any, size: Optional[Tuple[Optional[int], Optional[int]]] = None,
              self_loops: Optional[int] = None, trusted: bool = False) -> CSRGraph:
    """Cached :func:`build_graph`.

    ``self_loops=N`` first removes existing self-loops and adds one loop for
    nodes ``0..N-1`` exactly as PyG's GAT/GATv2/AGNN layers do.

    ``trusted=True`` skips the content fingerprint on a cache hit (the version
    counters are still checked, and an inference tensor is still fingerprinted).
    Only for adjacency objects that this package prepared and owns, which no
    user code can write to; on CUDA it saves the hit's host sync.
    """
    ns, nd = _sizes(adj, size)
    key = (ns, nd, self_loops)
    if self_loops is None:
        return _cache.get(adj, key, lambda: build_graph(adj, (ns, nd)), trusted)

    def build():
        if is_sparse_tensor(adj) or is_torch_sparse(adj):  # sizes come from the tensor
            return _with_self_loops(adj, self_loops, 0, 0)
        if ns is None or nd is None:
            n = int(_widen(adj).max()) + 1 if isinstance(adj, Tensor) and adj.numel() else 0
            s, d = (ns if ns is not None else max(n, self_loops),
                    nd if nd is not None else max(n, self_loops))
        else:
            s, d = ns, nd
        return _with_self_loops(adj, self_loops, s, d)
    return _cache.get(adj, key, build, trusted)


def attach(adj: Any, graph: CSRGraph, size: Optional[Tuple[int, int]] = None,
           self_loops: Optional[int] = None, fingerprint: Optional[Tensor] = None
           ) -> CSRGraph:
    """Register ``graph`` as the cached conversion of the ``edge_index`` tensor
    ``adj``, so that ``get_graph(adj, size, self_loops)`` -- what every layer of
    :mod:`pyg_dfgnn.nn` calls -- hits the cache instead of converting.

    For graphs prepared ahead of time, e.g. in the DataLoader's worker
    processes (:class:`pyg_dfgnn.data.PrepareGraphs`): ``graph`` must have
    been built from the same content as ``adj`` by :func:`get_graph`'s own
    conversion (:func:`pyg_dfgnn.data.prepare_graph` does that).  No host-device
    synchronisation: the cheap checks below compare shapes, devices and Python ints only; the
    content is *not* re-validated (the preparation did that).  ``fingerprint``
    is :func:`content_hash` of ``adj`` (a one-element int64 tensor,
    e.g. computed where the graph was prepared); without it, it is computed
    here (on CUDA: a few asynchronous kernels, no sync).  It is compared on
    later cache hits exactly when :func:`get_graph` would compare it (always on
    CPU; on CUDA only in :func:`strict_cache` mode), so an ``adj`` changed in
    place is still never served stale.

    Args:
        adj: the ``edge_index`` tensor ``[2, E]`` the layers will receive.
        graph: its :class:`CSRGraph` (after self-loop handling if ``self_loops``).
        size: ``(num_src, num_dst)`` of the key (default: the graph's).
        self_loops: ``None``, or the ``num_nodes`` the layers pass for their
            looped view (GAT/GATv2/AGNN with ``add_self_loops=True``: the
            number of nodes).

    Returns ``graph``.
    """
    if not isinstance(adj, Tensor) or is_torch_sparse(adj):
        raise ValueError(f"'edge_index' must be an edge_index tensor of shape [2, num_edges] "
                         f"to attach a prepared graph, got {type(adj).__name__}")
    _check_edge_index(adj)
    if not isinstance(graph, CSRGraph):
        raise ValueError(f"'graph' must be a pyg_dfgnn.graph.CSRGraph, got "
                         f"{type(graph).__name__}")
    if graph.device != adj.device:
        raise ValueError(f"'graph' is on {graph.device} but 'edge_index' is on {adj.device}; "
                         f"move both to the same device before attaching")
    ns, nd = (graph.num_src, graph.num_dst) if size is None else (int(size[0]), int(size[1]))
    if (ns, nd) != (graph.num_src, graph.num_dst):
        raise ValueError(f"'size' {(ns, nd)} does not match the graph's (num_src, num_dst) = "
                         f"{(graph.num_src, graph.num_dst)}")
    E = adj.size(1)
    if self_loops is None:
        if graph.num_edges != E:
            raise ValueError(f"'graph' has {graph.num_edges} edges but 'edge_index' has {E}: "
                             f"it was not prepared from this edge_index")
    else:
        self_loops = int(self_loops)
        if not 0 <= graph.num_edges - self_loops <= E:
            raise ValueError(f"'graph' has {graph.num_edges} edges, which cannot be "
                             f"'edge_index' ({E} edges) with its self-loops replaced by "
                             f"{self_loops} loops: it was not prepared from this edge_index")
    tensors = _tensors_of(adj)
    vers = _versions(tensors)
    if fingerprint is None:
        # only where a hit will compare it (as get_graph's own misses do)
        content = None if _skip_content(tensors, vers, False) else _fingerprints(tensors)
    else:
        if not isinstance(fingerprint, Tensor) or fingerprint.numel() != 1:
            raise ValueError("'fingerprint' must be a one-element int64 tensor "
                             "(pyg_dfgnn.graph content hash of 'edge_index')")
        shapes = (tuple(adj.shape),)
        if adj.device.type == "cpu":
            content = (shapes, (int(fingerprint.reshape(())),))
        else:
            content = (shapes, fingerprint.reshape(1).to(adj.device, torch.int64,
                                                         non_blocking=True))
    _cache.put(adj, (ns, nd, self_loops), _Entry(vers, content, graph))
    return graph


def content_hash(adj: Tensor) -> Tensor:
    """The content hash :func:`attach` / the cache compare for an ``edge_index``
    tensor: a one-element int64 tensor on ``adj``'s device."""
    return _fingerprint(adj).reshape(1)
