"""The training loop behind ``dfgnn train``.

One :func:`train` call: resolve device / DDP, load the data (logging its
source), build the model on the chosen backend, then per epoch train, validate,
step the scheduler, log one line, write ``checkpoint_last.pt`` (and
``checkpoint_best.pt`` on improvement) and finally evaluate the best model on
the test split and write ``results.json``.  Only rank 0 writes files or logs.

Reproducibility: the randomness of epoch ``e`` (shuffling, dropout, LapPE sign
flips) is seeded from ``(seed, e, rank)``, so resuming from a checkpoint
continues exactly as an uninterrupted run would.
"""
from __future__ import annotations

import copy
import json
import os
import platform
import random
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from . import distributed as D
from .config import TrainConfig, config_to_dict
from .metrics import ConfusionCounter, weighted_cross_entropy
from .models import build_model, count_parameters

__all__ = ["train", "environment_info", "TrainingError"]


class TrainingError(RuntimeError):
    """A problem found before training starts (missing checkpoint, bad resume, ...)."""


# ----------------------------------------------------------------------------
# small helpers
# ----------------------------------------------------------------------------
def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 7919 + rank * 104_729) % (2 ** 63 - 1)


def environment_info(device: torch.device, backend: str, world_size: int = 1) -> Dict[str, Any]:
    import torch_geometric
    try:
        from .. import __version__ as dfgnn_version
    except Exception:  # pragma: no cover
        dfgnn_version = None
    info: Dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "pyg_dfgnn": dfgnn_version,
        "backend": backend,
        "device": str(device),
        "world_size": world_size,
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "cpu_threads": torch.get_num_threads(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["gpu"] = torch.cuda.get_device_name(device if device.type == "cuda" else 0)
    else:
        info["gpu"] = None
    return info


def _fmt_mem(nbytes: Optional[int]) -> str:
    if nbytes is None:
        return "n/a (cpu)"
    return f"{nbytes / 2 ** 30:.2f} GiB"


class _Log:
    """Rank-0 logger: stdout (tqdm-safe) + ``out_dir/train.log``."""

    def __init__(self, path: Optional[str], enabled: bool):
        self.enabled = enabled
        self.fh = open(path, "a") if (enabled and path) else None

    def __call__(self, msg: str) -> None:
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
            tqdm.write(msg, file=sys.stdout)
        except Exception:  # pragma: no cover
            print(msg)
        sys.stdout.flush()
        if self.fh:
            self.fh.write(msg + "\n")
            self.fh.flush()

    def close(self):
        if self.fh:
            self.fh.close()
            self.fh = None


def _atomic_save(obj, path: str) -> None:
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


# ----------------------------------------------------------------------------
# optimiser / scheduler
# ----------------------------------------------------------------------------
def _make_optimizer(cfg: TrainConfig, params):
    o = cfg.optimizer
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)


def _make_scheduler(cfg: TrainConfig, opt):
    s = cfg.scheduler
    if s.name == "plateau":
        # benchmarking-gnns: no floor in the scheduler, training stops once lr < min_lr
        floor = 0.0 if s.stop_at_min_lr else s.min_lr
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=s.factor,
                                                          patience=s.patience, min_lr=floor)
    if s.name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(cfg.epochs, 1),
                                                          eta_min=s.min_lr)
    if s.name == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=s.step_size, gamma=s.factor)
    return None


# ----------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------
class _Run:
    def __init__(self, cfg: TrainConfig, dist: D.DistInfo):
        self.cfg = cfg
        self.dist = dist
        self.device = dist.device
        self.out_dir = cfg.resolved_out_dir()
        self.main = dist.is_main
        if self.main:
            os.makedirs(self.out_dir, exist_ok=True)
        self.log = _Log(os.path.join(self.out_dir, "train.log") if self.main else None,
                        self.main)
        self.progress = (cfg.log.progress and self.main and sys.stderr.isatty())

    # ---------------------------------------------------------------- data
    def load_data(self):
        from ..data.datasets import add_laplacian_pe, load_data
        cfg = self.cfg
        t0 = time.perf_counter()
        # rank 0 prepares (generates / processes) first, the others then read the cache
        if self.dist.enabled and not self.main:
            D.barrier()
        bundle = load_data(cfg.data, seed=cfg.seed, log=self.log)
        if self.dist.enabled and self.main:
            D.barrier()
        if cfg.model.lap_pe and bundle.kind == "graphs":
            self.log(f"computing Laplacian PE (k={cfg.model.lap_pe_dim}) ...")
            bundle.train = add_laplacian_pe(bundle.train, cfg.model.lap_pe_dim)
            bundle.val = add_laplacian_pe(bundle.val, cfg.model.lap_pe_dim)
            bundle.test = add_laplacian_pe(bundle.test, cfg.model.lap_pe_dim)
        self.data_time = time.perf_counter() - t0
        self.bundle = bundle
        self.metric_name = bundle.metric
        self.log(f"dataset {bundle.name}: source = {bundle.source}")
        self.log(f"dataset {bundle.name}: {bundle.stats}, classes={bundle.num_classes}, "
                 f"metric={bundle.metric} (prepared in {self.data_time:.1f}s)")
        if bundle.kind == "full":
            self.full = bundle.data.to(self.device)

    def _train_loader(self, epoch: int):
        from torch_geometric.loader import DataLoader
        ds = self.bundle.train
        if self.dist.enabled:
            from torch.utils.data.distributed import DistributedSampler
            sampler = DistributedSampler(ds, num_replicas=self.dist.world_size,
                                         rank=self.dist.rank, shuffle=True, seed=self.cfg.seed)
            sampler.set_epoch(epoch)
        else:
            g = torch.Generator().manual_seed(_epoch_seed(self.cfg.seed, epoch, 0))
            sampler = torch.utils.data.RandomSampler(ds, generator=g)
        return DataLoader(ds, batch_size=self.cfg.batch_size, sampler=sampler,
                          num_workers=self.cfg.data.num_workers)

    def _eval_loader(self, ds):
        from torch_geometric.loader import DataLoader
        idx = list(range(self.dist.rank, len(ds), self.dist.world_size))  # disjoint shards
        return DataLoader(ds, batch_size=self.cfg.batch_size, sampler=idx,
                          num_workers=self.cfg.data.num_workers)

    # ---------------------------------------------------------------- model
    def build(self):
        cfg, b = self.cfg, self.bundle
        _seed_all(cfg.seed)  # identical initial weights on every rank and for both backends
        model = build_model(cfg.model, b.in_dim, b.num_classes, b.categorical, cfg.backend)
        model = model.to(self.device)
        self.num_params = count_parameters(model)
        self.log(f"model {cfg.model.name} (backend={cfg.backend}): {self.num_params:,} "
                 f"parameters; conv layers from "
                 f"{'pyg_dfgnn.nn' if cfg.backend == 'fused' else 'torch_geometric.nn'}")
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DDP(model, device_ids=ids)
        self.model = model
        self.opt = _make_optimizer(cfg, model.parameters())
        self.sched = _make_scheduler(cfg, self.opt)

    def _loss(self, out, y):
        if self.bundle.weighted_loss:
            return weighted_cross_entropy(out, y, self.bundle.num_classes)
        return F.cross_entropy(out, y)

    def _forward(self, model, batch):
        return model(batch.x, batch.edge_index, lap_pe=getattr(batch, "lap_pe", None))

    # ---------------------------------------------------------------- epochs
    def train_epoch_graphs(self, epoch: int) -> Dict[str, float]:
        self.model.train()
        counter = ConfusionCounter(self.bundle.num_classes, self.device)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=self.device)  # [sum, batches]
        loader = self._train_loader(epoch)
        it = loader
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = it = tqdm(loader, desc=f"epoch {epoch}/{self.cfg.epochs}", leave=False,
                            dynamic_ncols=True, file=sys.stderr)
        for i, batch in enumerate(it):
            batch = batch.to(self.device)
            out = self._forward(self.model, batch)
            loss = self._loss(out, batch.y)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            loss_sum[0] += loss.detach().double()
            loss_sum[1] += 1
            counter.update(out.detach(), batch.y)
            if bar is not None and i % 10 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
        if bar is not None:
            bar.close()
        D.all_reduce_sum(loss_sum)
        counter.all_reduce()
        return {"loss": float(loss_sum[0] / loss_sum[1].clamp(min=1)),
                "metric": counter.metric(self.metric_name)}

    @torch.no_grad()
    def eval_graphs(self, ds) -> Dict[str, float]:
        model = _unwrap(self.model)
        model.eval()
        counter = ConfusionCounter(self.bundle.num_classes, self.device)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=self.device)
        for batch in self._eval_loader(ds):
            batch = batch.to(self.device)
            out = self._forward(model, batch)
            loss_sum[0] += self._loss(out, batch.y).double()
            loss_sum[1] += 1
            counter.update(out, batch.y)
        D.all_reduce_sum(loss_sum)
        counter.all_reduce()
        return {"loss": float(loss_sum[0] / loss_sum[1].clamp(min=1)),
                "metric": counter.metric(self.metric_name)}

    def train_epoch_full(self, epoch: int) -> Dict[str, float]:
        # full batch: every rank computes the same step (DDP just replicates)
        self.model.train()
        d = self.full
        out = self.model(d.x, d.edge_index)
        loss = self._loss(out[d.train_mask], d.y[d.train_mask])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        c = ConfusionCounter(self.bundle.num_classes, self.device)
        c.update(out.detach()[d.train_mask], d.y[d.train_mask])
        return {"loss": float(loss.detach()), "metric": c.metric(self.metric_name)}

    @torch.no_grad()
    def eval_full(self) -> Dict[str, Dict[str, float]]:
        model = _unwrap(self.model)
        model.eval()
        d = self.full
        out = model(d.x, d.edge_index)
        res = {}
        for split in ("train", "val", "test"):
            mask = d[f"{split}_mask"]
            c = ConfusionCounter(self.bundle.num_classes, self.device)
            c.update(out[mask], d.y[mask])
            res[split] = {"loss": float(self._loss(out[mask], d.y[mask])),
                          "metric": c.metric(self.metric_name)}
        return res

    # ---------------------------------------------------------------- checkpoints
    def _state(self, epoch: int) -> Dict[str, Any]:
        return {
            "epoch": epoch,
            "model": _unwrap(self.model).state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict() if self.sched is not None else None,
            "best": self.best,
            "history": self.history,
            "early_stop_bad_epochs": self.bad_epochs,
            "config": config_to_dict(self.cfg),
            "elapsed_train_s": self.train_time,
        }

    def maybe_resume(self) -> int:
        """Returns the first epoch to run (1 when starting fresh)."""
        cfg = self.cfg
        if cfg.resume in (None, False):
            return 1
        path = (os.path.join(self.out_dir, "checkpoint_last.pt") if cfg.resume is True
                else cfg.resume)
        if not os.path.isfile(path):
            raise TrainingError(f"resume: checkpoint not found: {path}")
        ckpt = torch.load(path, map_location=self.device, weights_only=False)
        try:
            _unwrap(self.model).load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise TrainingError(f"resume: checkpoint {path} does not match the model of this "
                                f"config ({e})") from e
        self.opt.load_state_dict(ckpt["optimizer"])
        if self.sched is not None and ckpt.get("scheduler") is not None:
            self.sched.load_state_dict(ckpt["scheduler"])
        self.best = ckpt.get("best") or self.best
        self.history = list(ckpt.get("history") or [])
        self.bad_epochs = int(ckpt.get("early_stop_bad_epochs", 0))
        self.train_time = float(ckpt.get("elapsed_train_s", 0.0))
        best_path = os.path.join(os.path.dirname(path), "checkpoint_best.pt")
        if os.path.isfile(best_path):
            self.best_state = torch.load(best_path, map_location=self.device,
                                         weights_only=False)["model"]
        self.resumed_from = os.path.abspath(path)
        self.log(f"resumed from {path} (epoch {ckpt['epoch']})")
        return int(ckpt["epoch"]) + 1

    # ---------------------------------------------------------------- main loop
    def _improved(self, val: Dict[str, float]) -> bool:
        if self.cfg.checkpoint.monitor == "val_loss":
            return self.best.get("val_loss") is None or val["loss"] < self.best["val_loss"]
        return self.best.get("val_metric") is None or val["metric"] > self.best["val_metric"]

    def run(self) -> Dict[str, Any]:
        cfg = self.cfg
        t_start = time.perf_counter()
        self.env = environment_info(self.device, cfg.backend, self.dist.world_size)
        if self.main:
            with open(os.path.join(self.out_dir, "config.yaml"), "w") as f:
                yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
        self.log(f"dfgnn train: {cfg.name} | device {self.device}"
                 + (f" x{self.dist.world_size} ranks (DDP, {self.dist.backend})"
                    if self.dist.enabled else "")
                 + f" | gpu {self.env['gpu'] or 'none'} | torch {self.env['torch']} | "
                   f"PyG {self.env['torch_geometric']} | backend {cfg.backend} | out_dir "
                   f"{self.out_dir}")
        self.load_data()
        self.build()
        self.best: Dict[str, Any] = {}
        self.best_state = None
        self.history: List[Dict[str, Any]] = []
        self.bad_epochs = 0
        self.train_time = 0.0
        self.resumed_from = None
        start = self.maybe_resume()
        graphs = self.bundle.kind == "graphs"
        stop_reason = "max epochs"
        es = cfg.early_stopping
        es_best = None
        if self.history:
            key = "val_loss" if es.monitor == "val_loss" else "val_metric"
            vals = [h[key] for h in self.history]
            es_best = min(vals) if es.monitor == "val_loss" else max(vals)
        self.log(f"training epochs {start}..{cfg.epochs}")

        for epoch in range(start, cfg.epochs + 1):
            torch.manual_seed(_epoch_seed(cfg.seed, epoch, self.dist.rank))
            cuda = self.device.type == "cuda"
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
            t0 = time.perf_counter()
            if graphs:
                tr = self.train_epoch_graphs(epoch)
                t_train = time.perf_counter() - t0
                va = self.eval_graphs(self.bundle.val)
                te = None
                if cfg.eval_test_every and epoch % cfg.eval_test_every == 0:
                    te = self.eval_graphs(self.bundle.test)
            else:
                tr = self.train_epoch_full(epoch)
                t_train = time.perf_counter() - t0
                ev = self.eval_full()
                va, te = ev["val"], ev["test"]
            if cuda:
                torch.cuda.synchronize(self.device)
            epoch_time = time.perf_counter() - t0
            self.train_time += epoch_time
            peak = torch.cuda.max_memory_allocated(self.device) if cuda else None
            lr = self.opt.param_groups[0]["lr"]
            rec = {"epoch": epoch, "train_loss": tr["loss"], "train_metric": tr["metric"],
                   "val_loss": va["loss"], "val_metric": va["metric"],
                   "test_loss": te["loss"] if te else None,
                   "test_metric": te["metric"] if te else None,
                   "lr": lr, "epoch_time_s": epoch_time, "train_time_s": t_train,
                   "peak_gpu_mem_bytes": peak}
            self.history.append(rec)

            improved = self._improved(va)
            if improved:
                self.best = {"epoch": epoch, "val_loss": va["loss"], "val_metric": va["metric"],
                             "test_loss": rec["test_loss"], "test_metric": rec["test_metric"]}
                self.best_state = copy.deepcopy(_unwrap(self.model).state_dict())

            if self.sched is not None:
                if isinstance(self.sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    self.sched.step(va["loss"])
                else:
                    self.sched.step()

            if epoch % cfg.log.every == 0 or epoch == cfg.epochs:
                m = "acc" if self.metric_name == "acc" else "mean-class acc"
                line = (f"epoch {epoch:4d}/{cfg.epochs} | train loss {tr['loss']:.4f} "
                        f"{m} {tr['metric']:6.2f} | val loss {va['loss']:.4f} {m} "
                        f"{va['metric']:6.2f}")
                if te:
                    line += f" | test {m} {te['metric']:6.2f}"
                line += (f" | lr {lr:.2e} | {epoch_time:6.2f}s | peak mem {_fmt_mem(peak)}"
                         + (" *" if improved else ""))
                self.log(line)

            if self.main and cfg.checkpoint.enabled:
                state = self._state(epoch)
                _atomic_save(state, os.path.join(self.out_dir, "checkpoint_last.pt"))
                if improved:
                    _atomic_save(state, os.path.join(self.out_dir, "checkpoint_best.pt"))

            # ---- stopping rules (decided identically on every rank)
            stop = None
            if es.patience > 0:
                cur = va["loss"] if es.monitor == "val_loss" else va["metric"]
                better = (es_best is None or
                          (cur < es_best - es.min_delta if es.monitor == "val_loss"
                           else cur > es_best + es.min_delta))
                if better:
                    es_best, self.bad_epochs = cur, 0
                else:
                    self.bad_epochs += 1
                    if self.bad_epochs >= es.patience:
                        stop = (f"early stopping ({es.monitor} did not improve for "
                                f"{es.patience} epochs)")
            s = cfg.scheduler
            new_lr = self.opt.param_groups[0]["lr"]
            if s.name == "plateau" and s.stop_at_min_lr and new_lr < s.min_lr:
                stop = f"learning rate {new_lr:.2e} fell below min_lr {s.min_lr:.0e}"
            if cfg.time_limit_min is not None and \
                    time.perf_counter() - t_start > cfg.time_limit_min * 60:
                stop = f"time limit of {cfg.time_limit_min} min reached"
            if D.any_flag(stop is not None, self.device):
                stop_reason = stop or "stopped by another rank"
                self.log(f"stopping: {stop_reason}")
                break
        else:
            if start > cfg.epochs:
                stop_reason = "already complete (resumed at or after the last epoch)"

        # ---- final evaluation: last and best model on test
        final = self._final_eval()
        total = time.perf_counter() - t_start
        results = self._results(final, stop_reason, total)
        if self.main:
            path = os.path.join(self.out_dir, "results.json")
            with open(path + ".tmp", "w") as f:
                json.dump(results, f, indent=2, default=str)
            os.replace(path + ".tmp", path)
            m = results["metrics"]
            self.log(f"done ({stop_reason}) in {total:.1f}s: best epoch {m['best_epoch']}, "
                     f"val {m['best_val_metric']:.2f}, test {m['test_metric']:.2f} "
                     f"({self.metric_name}) -> {path}")
        self.log.close()
        return results

    def _final_eval(self) -> Dict[str, Any]:
        graphs = self.bundle.kind == "graphs"
        model = _unwrap(self.model)

        def evaluate():
            if graphs:
                return {"val": self.eval_graphs(self.bundle.val),
                        "test": self.eval_graphs(self.bundle.test)}
            ev = self.eval_full()
            return {"val": ev["val"], "test": ev["test"]}

        last = evaluate()
        if self.best_state is not None:
            current = copy.deepcopy(model.state_dict())
            model.load_state_dict(self.best_state)
            best = evaluate()
            model.load_state_dict(current)
        else:
            best = last
        return {"last": last, "best": best}

    def _results(self, final, stop_reason: str, total: float) -> Dict[str, Any]:
        times = [h["epoch_time_s"] for h in self.history]
        peaks = [h["peak_gpu_mem_bytes"] for h in self.history if h["peak_gpu_mem_bytes"]]
        last_h = self.history[-1] if self.history else {}
        metrics = {
            "metric": self.metric_name,
            "best_epoch": self.best.get("epoch"),
            "best_val_metric": final["best"]["val"]["metric"],
            "best_val_loss": final["best"]["val"]["loss"],
            "test_metric": final["best"]["test"]["metric"],   # test at the best val epoch
            "test_loss": final["best"]["test"]["loss"],
            "final_epoch": last_h.get("epoch"),
            "final_train_loss": last_h.get("train_loss"),
            "final_train_metric": last_h.get("train_metric"),
            "final_val_metric": final["last"]["val"]["metric"],
            "final_test_metric": final["last"]["test"]["metric"],
            "final_test_loss": final["last"]["test"]["loss"],
        }
        return {
            "name": self.cfg.name,
            "config": config_to_dict(self.cfg),
            "dataset": {"name": self.bundle.name, "source": self.bundle.source,
                        "num_classes": self.bundle.num_classes, "stats": self.bundle.stats},
            "model": {"name": self.cfg.model.name, "backend": self.cfg.backend,
                      "parameters": self.num_params},
            "metrics": metrics,
            "stop_reason": stop_reason,
            "resumed_from": self.resumed_from,
            "timings": {
                "total_s": total,
                "data_s": self.data_time,
                "train_s": self.train_time,
                "epochs_run": len(self.history),
                "epoch_s_mean": statistics.fmean(times) if times else None,
                "epoch_s_median": statistics.median(times) if times else None,
                "peak_gpu_mem_bytes": max(peaks) if peaks else None,
            },
            "environment": self.env,
            "history": self.history,
        }


def train(cfg: TrainConfig) -> Dict[str, Any]:
    """Run one training job described by ``cfg``; returns the ``results.json`` content.

    Under ``torchrun`` (``WORLD_SIZE > 1``) it trains with DistributedDataParallel
    (NCCL on CUDA, gloo on CPU); every rank returns the same results, only rank 0
    writes them.
    """
    dist = D.setup(cfg.device)
    try:
        return _Run(cfg, dist).run()
    finally:
        D.cleanup()
