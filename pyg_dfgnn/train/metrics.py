"""Losses and metrics of the benchmarking-gnns / Planetoid protocols."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["weighted_cross_entropy", "masked_cross_entropy", "ConfusionCounter"]


def weighted_cross_entropy(logits: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """Class-weighted cross-entropy of benchmarking-gnns (SBM node classification).

    The weight of class ``c`` is ``(V - n_c) / V`` with ``n_c`` its count in the
    batch (classes absent from the batch get weight 0), which balances the
    rare classes (e.g. PATTERN's pattern nodes).
    """
    V = y.numel()
    counts = torch.bincount(y, minlength=num_classes)[:num_classes].to(logits.dtype)
    weight = (V - counts) / V
    weight = weight * (counts > 0).to(logits.dtype)
    return F.cross_entropy(logits, y, weight=weight)


def masked_cross_entropy(logits: Tensor, y: Tensor, mask: Tensor, num_classes: int,
                         weighted: bool) -> Tensor:
    """The cross-entropy (``weighted``: :func:`weighted_cross_entropy`) of the
    rows where ``mask`` is true, with fixed shapes and no host synchronisation
    (a batch padded for a CUDA graph: :mod:`pyg_dfgnn.train.graphed`).  Equal
    to the unmasked loss of ``logits[mask]``, ``y[mask]``."""
    y = y.long()
    m = mask.to(logits.dtype)
    per_row = F.cross_entropy(logits, y, reduction="none")
    if weighted:
        counts = torch.zeros(num_classes, dtype=logits.dtype, device=logits.device)
        counts = counts.index_add(0, y, m)
        V = m.sum()
        weight = (V - counts) / V * (counts > 0).to(logits.dtype)
        w = weight[y] * m
    else:
        w = m
    return (w * per_row).sum() / w.sum()


class ConfusionCounter:
    """Accumulates a confusion matrix (true x predicted) on the device.

    ``mean_class_acc`` is benchmarking-gnns' SBM accuracy (mean over the classes
    present of the per-class recall, in %); ``acc`` is plain accuracy (in %).
    The matrix is a plain tensor of counts, so DDP ranks simply all-reduce it.
    """

    def __init__(self, num_classes: int, device=None):
        self.C = int(num_classes)
        self.matrix = torch.zeros(self.C, self.C, dtype=torch.long, device=device)

    @torch.no_grad()
    def update(self, logits_or_pred: Tensor, y: Tensor) -> None:
        pred = logits_or_pred.argmax(-1) if logits_or_pred.dim() > 1 else logits_or_pred
        idx = y.long() * self.C + pred.long()
        self.matrix += torch.bincount(idx, minlength=self.C * self.C).view(self.C, self.C)

    def all_reduce(self) -> "ConfusionCounter":
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(self.matrix)
        return self

    @property
    def total(self) -> int:
        return int(self.matrix.sum())

    def acc(self) -> float:
        m = self.matrix.double()
        tot = m.sum()
        return float(100.0 * m.diag().sum() / tot) if tot > 0 else 0.0

    def mean_class_acc(self) -> float:
        m = self.matrix.double()
        support = m.sum(1)
        present = support > 0
        if not bool(present.any()):
            return 0.0
        recall = m.diag()[present] / support[present]
        return float(100.0 * recall.mean())

    def metric(self, name: str) -> float:
        return self.mean_class_acc() if name == "mean_class_acc" else self.acc()


def pass_summary(loss_sum: Tensor, counter: ConfusionCounter, metric_name: str,
                 **extra) -> dict:
    """A pass's ``{"loss", "metric", **extra}`` over all (DDP) ranks, from its
    ``loss_sum = [sum of losses, their weight]`` and confusion counter (both
    all-reduced here, in place)."""
    from . import distributed as D
    D.all_reduce_sum(loss_sum)
    counter.all_reduce()
    return {"loss": float(loss_sum[0] / loss_sum[1].clamp(min=1)),
            "metric": counter.metric(metric_name), **extra}
