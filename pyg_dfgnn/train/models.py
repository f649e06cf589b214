"""Reference attention GNNs, built from ``pyg_dfgnn.nn`` or ``torch_geometric.nn`` layers.

The ``backend`` switch only changes where the conv classes come from
(``GATConv``, ``TransformerConv``, ``AGNNConv`` have the same names and
constructor signatures in both), so with the same seed both backends build
bit-identical parameters and a run compares the fused kernels with native PyG
on exactly the same model.

* :class:`GATNet` -- benchmarking-gnns GAT (``readout="mlp"``): input embedding,
  ``L-1`` multi-head GAT layers (``hidden/heads`` per head, concatenated) and a
  single-head output layer of ``out_dim``, each followed by BatchNorm, ELU and
  a residual connection, then the 3-layer MLP readout.  With
  ``readout="conv"`` it is the original Planetoid GAT (Velickovic et al.):
  dropout, ``L-1`` concat layers with ELU, and a last GATConv that outputs the
  classes (``out_heads`` averaged heads).
* :class:`GraphTransformerNet` -- Dwivedi & Bresson's Graph Transformer (sparse
  graph attention): embedding (+ optional Laplacian PE), ``L`` layers of
  multi-head Q/K/V attention (``TransformerConv``, concatenated heads, no root
  weight), output projection O, residual, BatchNorm (or LayerNorm), FFN
  (2x width, ReLU), residual, BatchNorm; MLP readout.
* :class:`AGNNNet` -- Thekumparampil et al.'s AGNN: linear (or embedding)
  input layer with ReLU, ``L`` AGNNConv propagation layers, linear output
  (optionally BatchNorm/residual/ELU around each propagation for the SBM runs,
  and the MLP readout).
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["BackendError", "conv_module", "build_model", "GATNet", "GraphTransformerNet",
           "AGNNNet", "MLPReadout", "InputEncoder", "count_parameters", "masked_batch_norm"]


class BackendError(RuntimeError):
    """The requested layer backend cannot be imported."""


def conv_module(backend: str):
    """The module providing ``GATConv``/``TransformerConv``/``AGNNConv`` for ``backend``."""
    if backend == "pyg":
        return importlib.import_module("torch_geometric.nn")
    if backend == "fused":
        try:
            mod = importlib.import_module("pyg_dfgnn.nn")
            for name in ("GATConv", "TransformerConv", "AGNNConv"):
                getattr(mod, name)
        except (ImportError, AttributeError) as e:
            raise BackendError(f"backend=fused needs pyg_dfgnn.nn (GATConv, TransformerConv, "
                               f"AGNNConv), which failed to import: {e}; use backend=pyg") from e
        return mod
    raise BackendError(f"unknown backend {backend!r}; choose fused or pyg")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class InputEncoder(nn.Module):
    """Integer node features -> ``nn.Embedding``; dense features -> ``nn.Linear``."""

    def __init__(self, in_dim: int, out_dim: int, categorical: bool):
        super().__init__()
        self.categorical = categorical
        self.enc = nn.Embedding(in_dim, out_dim) if categorical else nn.Linear(in_dim, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        if self.categorical:
            if x.dim() > 1:
                x = x.view(x.size(0), -1)[:, 0]
            return self.enc(x.long())
        return self.enc(x.float())


class MLPReadout(nn.Module):
    """benchmarking-gnns MLP readout: ``d -> d/2 -> d/4 -> classes`` with ReLU."""

    def __init__(self, in_dim: int, out_dim: int, L: int = 2):
        super().__init__()
        dims = [max(in_dim // (2 ** i), 1) for i in range(L + 1)]
        self.layers = nn.ModuleList([nn.Linear(dims[i], dims[i + 1]) for i in range(L)])
        self.out = nn.Linear(dims[L], out_dim)

    def forward(self, x: Tensor) -> Tensor:
        for lin in self.layers:
            x = F.relu(lin(x))
        return self.out(x)


class _MaskedBatchNorm(torch.autograd.Function):
    """BatchNorm over the ``mask`` rows of ``x``, optionally followed by an ELU,
    with a hand-written backward that keeps only the input and two ``[C]``
    statistics.

    The same expressions written as autograd ops keep three ``[N, C]`` fp32
    tensors per norm for backward (``xf - mean`` twice and the normalised
    output), plus the ELU's output: 6 of the ~14 ``[N, D]`` tensors a Graph
    Transformer layer saved in a padded (CUDA-graph) step, 3 of GAT's 7 per
    block (docs/KERNELS.md, session 10).  The backward recomputes ``x_hat``
    (and the ELU's input) from the saved ``x``.  Returns ``y`` and the batch
    ``mean`` and biased ``var`` (no gradient: the running statistics)."""

    @staticmethod
    def forward(ctx, x, mask, weight, bias, eps, elu):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))   # half precision: fp32 sums
        m = mask.to(xf.dtype).unsqueeze(-1)
        cnt = m.sum()
        mean = (xf * m).sum(0) / cnt
        d = (xf - mean) * m
        var = (d * d).sum(0) / cnt
        invstd = torch.rsqrt(var + eps)
        y = (xf - mean) * invstd
        if weight is not None:
            y = y * weight + bias
        if elu:
            y = F.elu(y)
        ctx.save_for_backward(x, m, cnt, mean, invstd, weight, bias)
        ctx.elu = elu
        ctx.mark_non_differentiable(mean, var)
        return y.to(x.dtype), mean, var

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, _dmean, _dvar):
        # y_i = w xh_i + b with xh_i = (x_i - mean) s: the statistics come from
        # the masked rows only but act on every row, so with g = dy (the
        # gradient at y before the affine weight) and per-column sums that are
        # also d bias and d weight:
        # dx_j = w s (g_j - m_j / n (sum_i g_i + xh_j sum_i g_i xh_i))
        x, m, cnt, mean, invstd, weight, bias = ctx.saved_tensors
        xh = (x.to(mean.dtype) - mean) * invstd
        g = dy.to(mean.dtype)
        if ctx.elu:   # ELU'(z) = 1 for z > 0, exp(z) otherwise, z the norm's output
            z = xh if weight is None else xh * weight + bias
            g = torch.where(z > 0, g, g * torch.exp(z))
        sum_g, sum_gx = g.sum(0), (g * xh).sum(0)
        dw = sum_gx if weight is not None and ctx.needs_input_grad[2] else None
        db = sum_g if weight is not None and ctx.needs_input_grad[3] else None
        dx = None
        if ctx.needs_input_grad[0]:
            scale = invstd if weight is None else invstd * weight
            dx = ((g - m / cnt * (sum_g + xh * sum_gx)) * scale).to(x.dtype)
        return dx, None, dw, db, None, None


def masked_batch_norm(bn: nn.BatchNorm1d, x: Tensor, mask: Tensor, elu: bool = False
                      ) -> Tensor:
    r"""``bn(x[mask])`` written back in place of ``x``'s masked rows, for a
    batch padded to a fixed size (:mod:`pyg_dfgnn.train.graphed`): in training
    the statistics are taken over the rows where ``mask`` is true only,
    :math:`\mu = \sum_i m_i x_i / n`, :math:`\sigma^2 = \sum_i m_i (x_i -
    \mu)^2 / n`, and the running estimates are updated with them (unbiased
    variance, as :class:`torch.nn.BatchNorm1d` does); the padding rows are
    normalised with the same statistics.  In evaluation (running statistics)
    this is ``bn(x)``.  ``elu=True`` returns ``F.elu`` of that.  No host
    synchronisation (fixed shapes).  Backward keeps ``x`` only, as
    :class:`torch.nn.BatchNorm1d` does (:class:`_MaskedBatchNorm`)."""
    use_batch = bn.training or not bn.track_running_stats
    if not use_batch:
        y = bn(x)
        return F.elu(y) if elu else y
    y, mean, var = _MaskedBatchNorm.apply(x, mask, bn.weight if bn.affine else None,
                                          bn.bias if bn.affine else None, bn.eps, elu)
    if bn.training and bn.track_running_stats:
        with torch.no_grad():
            cnt = mask.sum().to(mean.dtype)
            bn.num_batches_tracked.add_(1)
            mom = (bn.momentum if bn.momentum is not None
                   else 1.0 / bn.num_batches_tracked.to(mean.dtype))
            bn.running_mean.mul_(1 - mom).add_(mom * mean.to(bn.running_mean.dtype))
            unbiased = var * (cnt / (cnt - 1).clamp(min=1))
            bn.running_var.mul_(1 - mom).add_(mom * unbiased.to(bn.running_var.dtype))
    return y


def norm(module: nn.Module, x: Tensor, node_mask: Optional[Tensor] = None,
         elu: bool = False) -> Tensor:
    """``module(x)`` (then ``F.elu`` where ``elu``); a BatchNorm over the
    ``node_mask`` rows only when given."""
    if node_mask is not None and isinstance(module, nn.BatchNorm1d):
        return masked_batch_norm(module, x, node_mask, elu)
    y = module(x)
    return F.elu(y) if elu else y


def _readout(kind: str, in_dim: int, num_classes: int) -> nn.Module:
    return MLPReadout(in_dim, num_classes) if kind == "mlp" else nn.Linear(in_dim, num_classes)


# ----------------------------------------------------------------------------
class GATNet(nn.Module):
    def __init__(self, convs, in_dim: int, num_classes: int, categorical: bool,
                 hidden: int = 152, heads: int = 8, layers: int = 4,
                 out_dim: Optional[int] = None, dropout: float = 0.0,
                 attn_dropout: float = 0.0, in_dropout: float = 0.0, batch_norm: bool = True,
                 residual: bool = True, readout: str = "mlp", self_loops: bool = True,
                 out_heads: int = 1):
        super().__init__()
        GATConv = convs.GATConv
        self.readout_kind = readout
        self.dropout, self.in_dropout = dropout, in_dropout
        self.residual = residual
        per_head = hidden // heads
        if readout == "conv":  # Planetoid GAT (Velickovic et al.)
            self.encoder = None
            self.convs = nn.ModuleList()
            d = in_dim
            for _ in range(layers - 1):
                self.convs.append(GATConv(d, per_head, heads=heads, concat=True,
                                          dropout=attn_dropout, add_self_loops=self_loops))
                d = per_head * heads
            self.convs.append(GATConv(d, num_classes, heads=out_heads, concat=False,
                                      dropout=attn_dropout, add_self_loops=self_loops))
            self.norms = nn.ModuleList([nn.Identity() for _ in self.convs])
            self.head = None
            return
        out_dim = out_dim or hidden
        self.encoder = InputEncoder(in_dim, hidden, categorical)
        self.convs, self.norms = nn.ModuleList(), nn.ModuleList()
        for i in range(layers):
            last = i == layers - 1
            if last:   # benchmarking-gnns: single-head output layer of out_dim
                conv = GATConv(hidden, out_dim, heads=1, concat=True,
                               dropout=attn_dropout, add_self_loops=self_loops)
                width = out_dim
            else:
                conv = GATConv(hidden, per_head, heads=heads, concat=True,
                               dropout=attn_dropout, add_self_loops=self_loops)
                width = per_head * heads
            self.convs.append(conv)
            self.norms.append(nn.BatchNorm1d(width) if batch_norm else nn.Identity())
        self.head = _readout(readout, out_dim, num_classes)

    def block(self, i: int, h: Tensor, edge_index, node_mask: Optional[Tensor] = None
              ) -> Tensor:
        """Attention layer ``i`` with what follows it (the forward's loop body;
        also one stage of layer-wise inference).  ``node_mask``: the real rows
        of a padded batch (BatchNorm statistics, :func:`masked_batch_norm`)."""
        conv = self.convs[i]
        if self.readout_kind == "conv":
            h = conv(h, edge_index)
            if i < len(self.convs) - 1:
                h = F.dropout(F.elu(h), self.dropout, self.training)
            return h
        h_in = h
        h = norm(self.norms[i], conv(h, edge_index), node_mask, elu=True)
        if self.residual and h.shape == h_in.shape:
            h = h_in + h
        return F.dropout(h, self.dropout, self.training)

    def forward(self, x: Tensor, edge_index, node_mask: Optional[Tensor] = None,
                **_) -> Tensor:
        if self.readout_kind == "conv":
            h = F.dropout(x.float(), self.in_dropout, self.training)
            for i in range(len(self.convs)):
                h = self.block(i, h, edge_index, node_mask)
            return h
        h = self.encoder(x)
        h = F.dropout(h, self.in_dropout, self.training)
        for i in range(len(self.convs)):
            h = self.block(i, h, edge_index, node_mask)
        return self.head(h)


# ----------------------------------------------------------------------------
class GraphTransformerLayer(nn.Module):
    def __init__(self, convs, in_dim: int, out_dim: int, heads: int, dropout: float = 0.0,
                 attn_dropout: float = 0.0, batch_norm: bool = True, layer_norm: bool = False,
                 residual: bool = True):
        super().__init__()
        self.attn = convs.TransformerConv(in_dim, out_dim // heads, heads=heads, concat=True,
                                          dropout=attn_dropout, root_weight=False)
        self.O = nn.Linear(out_dim, out_dim)
        self.ffn1 = nn.Linear(out_dim, 2 * out_dim)
        self.ffn2 = nn.Linear(2 * out_dim, out_dim)
        self.norm1 = self._norm(out_dim, batch_norm, layer_norm)
        self.norm2 = self._norm(out_dim, batch_norm, layer_norm)
        self.dropout = dropout
        self.residual = residual and in_dim == out_dim

    @staticmethod
    def _norm(d, bn, ln):
        if ln:
            return nn.LayerNorm(d)
        return nn.BatchNorm1d(d) if bn else nn.Identity()

    def forward(self, h: Tensor, edge_index, node_mask: Optional[Tensor] = None) -> Tensor:
        h_in = h
        h = self.attn(h, edge_index)
        h = F.dropout(h, self.dropout, self.training)
        h = self.O(h)
        if self.residual:
            h = h_in + h
        h = norm(self.norm1, h, node_mask)
        h_in2 = h
        h = F.dropout(F.relu(self.ffn1(h)), self.dropout, self.training)
        h = self.ffn2(h)
        if self.residual:
            h = h_in2 + h
        return norm(self.norm2, h, node_mask)


class GraphTransformerNet(nn.Module):
    def __init__(self, convs, in_dim: int, num_classes: int, categorical: bool,
                 hidden: int = 80, heads: int = 8, layers: int = 10,
                 out_dim: Optional[int] = None, dropout: float = 0.0,
                 attn_dropout: float = 0.0, in_dropout: float = 0.0, batch_norm: bool = True,
                 layer_norm: bool = False, residual: bool = True, readout: str = "mlp",
                 lap_pe: bool = False, lap_pe_dim: int = 2):
        super().__init__()
        out_dim = out_dim or hidden
        self.encoder = InputEncoder(in_dim, hidden, categorical)
        self.lap_pe = lap_pe
        self.pe_encoder = nn.Linear(lap_pe_dim, hidden) if lap_pe else None
        self.in_dropout = in_dropout
        self.layers = nn.ModuleList([
            GraphTransformerLayer(convs, hidden, out_dim if i == layers - 1 else hidden, heads,
                                  dropout, attn_dropout, batch_norm, layer_norm, residual)
            for i in range(layers)])
        self.head = _readout(readout, out_dim, num_classes)

    def forward(self, x: Tensor, edge_index, lap_pe: Optional[Tensor] = None,
                node_mask: Optional[Tensor] = None, **_) -> Tensor:
        h = self.encoder(x)
        if self.lap_pe:
            if lap_pe is None:
                raise ValueError("model built with lap_pe=True but the batch has no lap_pe")
            if self.training:  # random sign flip per eigenvector (Dwivedi & Bresson)
                sign = torch.randint(0, 2, (lap_pe.size(1),), device=lap_pe.device) * 2 - 1
                lap_pe = lap_pe * sign.to(lap_pe.dtype)
            h = h + self.pe_encoder(lap_pe.float())
        h = F.dropout(h, self.in_dropout, self.training)
        for layer in self.layers:
            h = layer(h, edge_index, node_mask)
        return self.head(h)


# ----------------------------------------------------------------------------
class AGNNNet(nn.Module):
    def __init__(self, convs, in_dim: int, num_classes: int, categorical: bool,
                 hidden: int = 16, layers: int = 4, dropout: float = 0.5,
                 in_dropout: float = 0.5, batch_norm: bool = False, residual: bool = False,
                 readout: str = "linear", self_loops: bool = True, fixed_first: bool = True):
        super().__init__()
        self.categorical = categorical
        self.encoder = InputEncoder(in_dim, hidden, categorical)
        self.convs = nn.ModuleList([
            convs.AGNNConv(requires_grad=not (fixed_first and i == 0),
                           add_self_loops=self_loops)
            for i in range(layers)])
        self.norms = nn.ModuleList([nn.BatchNorm1d(hidden) if batch_norm else nn.Identity()
                                    for _ in range(layers)])
        # with BN/residual (SBM runs) each propagation is a full block with an ELU
        self.block = batch_norm or residual
        self.residual = residual
        self.dropout, self.in_dropout = dropout, in_dropout
        self.head = _readout(readout, hidden, num_classes)

    def forward(self, x: Tensor, edge_index, node_mask: Optional[Tensor] = None,
                **_) -> Tensor:
        if not self.categorical:
            x = F.dropout(x.float(), self.in_dropout, self.training)
        h = F.relu(self.encoder(x))
        if self.categorical:
            h = F.dropout(h, self.in_dropout, self.training)
        for i in range(len(self.convs)):
            h = self.propagate_block(i, h, edge_index, node_mask)
        h = F.dropout(h, self.dropout, self.training)
        return self.head(h)

    def propagate_block(self, i: int, h: Tensor, edge_index,
                        node_mask: Optional[Tensor] = None) -> Tensor:
        """Propagation ``i`` (with BN/ELU/residual where configured): the
        forward's loop body, also one stage of layer-wise inference."""
        h_in = h
        h = self.convs[i](h, edge_index)
        if self.block:
            h = norm(self.norms[i], h, node_mask, elu=True)
            if self.residual:
                h = h_in + h
        return h


# ----------------------------------------------------------------------------
def build_model(mcfg, in_dim: int, num_classes: int, categorical: bool,
                backend: str) -> nn.Module:
    """Model from the ``model`` config section (see :class:`~.config.ModelConfig`)."""
    convs = conv_module(backend)
    m = mcfg
    if m.name == "gat":
        return GATNet(convs, in_dim, num_classes, categorical, hidden=m.hidden, heads=m.heads,
                      layers=m.layers, out_dim=m.out_dim, dropout=m.dropout,
                      attn_dropout=m.attn_dropout, in_dropout=m.in_dropout,
                      batch_norm=m.batch_norm, residual=m.residual, readout=m.readout,
                      self_loops=m.self_loops, out_heads=m.out_heads)
    if m.name == "gt":
        return GraphTransformerNet(convs, in_dim, num_classes, categorical, hidden=m.hidden,
                                   heads=m.heads, layers=m.layers, out_dim=m.out_dim,
                                   dropout=m.dropout, attn_dropout=m.attn_dropout,
                                   in_dropout=m.in_dropout, batch_norm=m.batch_norm,
                                   layer_norm=m.layer_norm, residual=m.residual,
                                   readout=m.readout, lap_pe=m.lap_pe, lap_pe_dim=m.lap_pe_dim)
    if m.name == "agnn":
        return AGNNNet(convs, in_dim, num_classes, categorical, hidden=m.hidden,
                       layers=m.layers, dropout=m.dropout, in_dropout=m.in_dropout,
                       batch_norm=m.batch_norm, residual=m.residual, readout=m.readout,
                       self_loops=m.self_loops, fixed_first=m.agnn_fixed_first)
    raise ValueError(f"unknown model {m.name!r}; choose gat, gt or agnn")
