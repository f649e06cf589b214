"""The training loop behind ``dfgnn train``.

One :func:`train` call: resolve device / DDP, load the data (logging its
source), build the model on the chosen backend, then per epoch train, validate,
step the scheduler, log one line, write ``checkpoint_best.pt`` (on
improvement) and ``checkpoint_last.pt`` and finally evaluate the best model on
the test split and write ``results.json``.  Only rank 0 writes files or logs.
Every file is written atomically and a kill between the writes leaves a
consistent run (see ``_Run._write_checkpoints``).

Before anything is loaded, :func:`train` checks the machine (device, writable
``out_dir``) and, on resume, that the checkpoint is readable and that only
:data:`RESUMABLE_KEYS` differ from its config.  A NaN / inf loss stops the run
(:class:`TrainingDiverged`, results.json ``status: diverged``) without
checkpointing the diverged epoch.

Reproducibility: the randomness of epoch ``e`` (shuffling, dropout, LapPE sign
flips) is seeded from ``(seed, e, rank)``, so resuming from a checkpoint
continues exactly as an uninterrupted run would.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
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

from ..data.cache import atomic_torch_save, atomic_write, short_error
from ..ops.fused import backward_mode
from . import distributed as D
from .config import ConfigError, TrainConfig, check_environment, config_to_dict
from .metrics import ConfusionCounter, pass_summary, weighted_cross_entropy
from .models import build_model, count_parameters

__all__ = ["train", "environment_info", "TrainingError", "TrainingDiverged",
           "RESUMABLE_KEYS"]


class TrainingError(RuntimeError):
    """A problem that stops a run (missing or unreadable checkpoint, divergence, ...)."""


class TrainingDiverged(TrainingError):
    """The loss became NaN / inf; ``results`` is what was written to results.json."""

    def __init__(self, msg: str, results: Optional[Dict[str, Any]] = None):
        super().__init__(msg)
        self.results = results


#: Config keys that may differ between a checkpoint and the run resuming it: they
#: change how long / where / how verbosely the run goes on, not what it computes.
#: (``device`` changes the hardware, not the maths; the numbers may differ in the
#: last bits.)  Every other key -- data, model, optimizer, scheduler, seed,
#: backend, batch_size, checkpoint.monitor, early_stopping.monitor/min_delta --
#: is fixed by the checkpoint: its weights, optimizer state and history were
#: produced by those values, so changing them would mislabel or mix two runs.
RESUMABLE_KEYS = ("epochs", "time_limit_min", "early_stopping.patience", "out_dir", "resume",
                  "device", "name", "eval_test_every", "log.progress", "log.every",
                  "checkpoint.enabled", "data.num_workers", "data.sample_on", "data.prepare_graphs", "data.batcher", "optimizer.implementation",
                  "compile.enabled", "compile.dynamic", "compile.mode", "compile.backend",
                  "compile.fullgraph", "memory_check", "attention_backward",
                  "cublas_workspace_kib")


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
    atomic_torch_save(obj, path)


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _read_checkpoint(path: str) -> Dict[str, Any]:
    """Load a ``dfgnn train`` checkpoint on the CPU; a clear TrainingError otherwise."""
    if not os.path.isfile(path):
        raise TrainingError(f"resume: checkpoint not found: {path}")
    try:
        # weights_only: a checkpoint is tensors and plain Python values; never run code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise TrainingError(f"resume: cannot read checkpoint {path} ({short_error(e)}); the "
                            "file is damaged or not written by dfgnn train") from None
    need = ("epoch", "model", "optimizer", "config")
    missing = [k for k in need if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise TrainingError(f"resume: {path} is not a dfgnn train checkpoint (missing: "
                            f"{', '.join(missing)})")
    return ckpt


def _check_resume_config(cfg: TrainConfig, ckpt: Dict[str, Any], path: str) -> None:
    """ConfigError naming every key that differs from the checkpoint's and may not."""
    old = _flatten(ckpt["config"])
    default = _flatten(config_to_dict(TrainConfig()))
    diffs = []
    for key, new in _flatten(config_to_dict(cfg)).items():
        if key in RESUMABLE_KEYS:
            continue
        was = old.get(key, default.get(key))  # a key newer than the checkpoint: its default
        if was != new:
            diffs.append(f"{key} (checkpoint {was!r}, now {new!r})")
    if diffs:
        raise ConfigError(
            f"resume: the config differs from the one of checkpoint {path} in "
            f"{', '.join(diffs)}; these keys cannot change on resume (only "
            f"{', '.join(RESUMABLE_KEYS)} can): set them back or start a new run in "
            "another out_dir")


#: autocast dtype of each ``precision``
AMP_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


# ----------------------------------------------------------------------------
# optimiser / scheduler
# ----------------------------------------------------------------------------
def _make_optimizer(cfg: TrainConfig, params, device: torch.device, capturable: bool = False):
    """The configured optimiser; ``capturable`` (Adam/AdamW, for CUDA graphs):
    its step count and learning rate live on the device as tensors, so a
    replayed step sees the scheduler's changes."""
    o = cfg.optimizer
    fused = None
    if o.name in ("adam", "adamw"):
        fused = o.implementation == "fused" or (o.implementation == "auto"
                                                and device.type == "cuda")
        fused = True if fused else None
    kw = {}
    lr: Any = o.lr
    if capturable:
        kw["capturable"] = True
        lr = torch.tensor(float(o.lr), device=device)
    if o.name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=o.weight_decay, fused=fused, **kw)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=o.weight_decay, fused=fused, **kw)
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
    def __init__(self, cfg: TrainConfig, dist: D.DistInfo, resume_ckpt=None):
        self.cfg = cfg
        self.dist = dist
        self.device = dist.device
        self.out_dir = cfg.resolved_out_dir()
        self.main = dist.is_main
        self.ckpt, self.ckpt_path = resume_ckpt or (None, None)
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
        self.sampling = None
        if bundle.kind == "full" and cfg.data.loader == "neighbor":
            from .sampling import SampledNodeTraining  # the graph stays on the CPU
            self.sampling = SampledNodeTraining(self)
        elif bundle.kind == "full":
            self.full = bundle.data.to(self.device)

    def _train_loader(self, epoch: int):
        ds = self.bundle.train
        if self.dist.enabled:
            from torch.utils.data.distributed import DistributedSampler
            sampler = DistributedSampler(ds, num_replicas=self.dist.world_size,
                                         rank=self.dist.rank, shuffle=True, seed=self.cfg.seed)
            sampler.set_epoch(epoch)
        else:
            g = torch.Generator().manual_seed(_epoch_seed(self.cfg.seed, epoch, 0))
            sampler = torch.utils.data.RandomSampler(ds, generator=g)
        return self._loader(ds, sampler)

    def _eval_loader(self, ds):
        idx = list(range(self.dist.rank, len(ds), self.dist.world_size))  # disjoint shards
        return self._loader(ds, idx)

    def _loader(self, ds, sampler):
        store = self.stores.get(id(ds))
        if store is not None:  # same batches as PyG's DataLoader with this sampler
            from ..data.batching import GraphBatchLoader
            return GraphBatchLoader(store, self.cfg.batch_size, sampler=sampler,
                                    device=self.device)
        from torch_geometric.loader import DataLoader
        workers = self.cfg.data.num_workers
        kw = dict(batch_size=self.cfg.batch_size, sampler=sampler, num_workers=workers,
                  pin_memory=self.pin_memory)
        if self.prepare is not None:
            from ..data.prepare import PreparedDataLoader
            return PreparedDataLoader(ds, prepare=self.prepare, **kw)
        return DataLoader(ds, **kw)

    def _to_device(self, batch):
        """The batch on the training device; its prepared graphs (if any) handed
        to the layers' graph cache (no host-device sync)."""
        if self.stores:  # GraphBatchLoader: made on the device, views attached
            return batch
        batch = batch.to(self.device, non_blocking=self.pin_memory)
        if self.prepare is not None:
            from ..data.prepare import attach_prepared
            attach_prepared(batch)
        return batch

    def _autocast(self):
        """``torch.autocast`` for ``precision`` bf16 / fp16 (a no-op for fp32)."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    # ---------------------------------------------------------------- model
    def build(self):
        cfg, b = self.cfg, self.bundle
        _seed_all(cfg.seed)  # identical initial weights on every rank and for both backends
        model = build_model(cfg.model, b.in_dim, b.num_classes, b.categorical, cfg.backend)
        model = model.to(self.device)
        self.net = model  # the plain module: state_dict, evaluation
        self.num_params = count_parameters(model)
        self.log(f"model {cfg.model.name} (backend={cfg.backend}): {self.num_params:,} "
                 f"parameters; conv layers from "
                 f"{'pyg_dfgnn.nn' if cfg.backend == 'fused' else 'torch_geometric.nn'}")
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DDP(model, device_ids=ids)
        # graph preparation in the DataLoader (fused layers, batched graphs)
        # (only with worker processes: in this process, the CPU conversion would
        # sit on the step's critical path and cost more than the device's)
        self.prepare = None
        self.stores = {}
        workers = cfg.data.num_workers
        if b.kind == "graphs" and cfg.data.batcher != "pyg":
            self._build_stores()
        if (cfg.backend == "fused" and cfg.data.prepare_graphs and b.kind == "graphs"
                and not self.stores):
            from ..data.prepare import PrepareGraphs
            if workers > 0:
                self.prepare = PrepareGraphs.for_model(self.net)
                self.log(f"graph preparation: each batch's CSR is built in the {workers} "
                         f"DataLoader workers ({self.prepare!r})")
            else:
                self.log("graph preparation: off with data.num_workers=0 (it would run in "
                         "this process, on the step's critical path); set "
                         "data.num_workers >= 2 to build each batch's CSR in the workers")
        self.pin_memory = self.device.type == "cuda" and workers > 0 and b.kind == "graphs"
        # mixed precision
        self.amp_dtype = AMP_DTYPES[cfg.precision]
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.precision == "fp16")
        if self.amp_dtype is not None:
            self.log(f"precision {cfg.precision}: torch.autocast({self.device.type!r}, "
                     f"dtype={self.amp_dtype})"
                     + (" + GradScaler" if self.scaler.is_enabled() else ""))
        # torch.compile
        self.eval_model = self.net
        c = cfg.compile
        if c.enabled:
            opts = dict(dynamic=c.dynamic, backend=c.backend, fullgraph=c.fullgraph,
                        mode=None if c.mode == "default" else c.mode)
            model = torch.compile(model, **opts)
            # evaluation runs the plain module (no DDP), compiled alike
            self.eval_model = torch.compile(self.net, **opts) if self.dist.enabled else model
            self.log(f"torch.compile({', '.join(f'{k}={v!r}' for k, v in opts.items())})")
        self.model = model
        #: why ``cuda_graphs: auto`` runs eager steps (None: it does not)
        self.cuda_graphs_off: Optional[str] = None
        graphs = cfg.cuda_graphs
        if graphs == "auto":
            self.cuda_graphs_off = self._cuda_graphs_blocker()
            graphs = self.cuda_graphs_off is None
        capture = bool(graphs) and self.device.type == "cuda"
        self.opt = _make_optimizer(cfg, model.parameters(), self.device, capturable=capture)
        self.sched = _make_scheduler(cfg, self.opt)
        self.graphed = None
        if graphs:
            try:
                self.graphed = self._build_graphed()
            except ConfigError as e:
                if cfg.cuda_graphs is True:
                    raise
                # auto: what the device, DDP or the data rule out
                self.cuda_graphs_off = str(e).replace("cuda_graphs: ", "", 1)
                self.opt = _make_optimizer(cfg, model.parameters(), self.device,
                                           capturable=False)
                self.sched = _make_scheduler(cfg, self.opt)
        if self.cuda_graphs_off is not None:
            self.log(f"cuda_graphs: auto -> eager steps ({self.cuda_graphs_off})")
        # before the first step's GEMMs (torch 2.11 reads the size at the
        # process's first cuBLAS call)
        from .memory import cublas_workspace_for, set_cublas_workspace
        msg = set_cublas_workspace(
            cublas_workspace_for(cfg.cublas_workspace_kib, self.graphed is not None),
            self.device)
        if msg:
            self.log(msg + (f" [cublas_workspace_kib: auto, "
                            f"{'captured' if self.graphed is not None else 'eager'} steps]"
                            if cfg.cublas_workspace_kib == "auto" else ""))

    def _cuda_graphs_blocker(self) -> Optional[str]:
        """``cuda_graphs: auto``: why this run takes eager steps, as far as the
        config tells (``None``: it tries the captured steps; the device, DDP
        and the data can still rule them out, see :meth:`_build_graphed`)."""
        from .config import cuda_graphs_blocker
        cfg = self.cfg
        reason = cuda_graphs_blocker(cfg)
        if reason is None and cfg.backend != "fused":
            reason = (f"backend={cfg.backend}: auto captures the fused layers only; "
                      f"cuda_graphs=true tries it with this backend")
        return reason

    #: run ``cuda_graphs: true`` on a CPU device as the same padded steps without
    #: capture (the CPU tests of the trainer integration set this)
    cuda_graphs_on_cpu = False

    def _build_graphed(self):
        """``cuda_graphs: true``: the padded static batches and the captured
        steps (pyg_dfgnn/train/graphed.py); ConfigError for what a replay
        cannot do with this data or setup."""
        from ..schedule import MIN_SPLIT
        from .graphed import WARMUP_STEPS, GraphedSteps, StaticBatches
        from .metrics import masked_cross_entropy
        b, cfg = self.bundle, self.cfg
        if self.device.type != "cuda" and not self.cuda_graphs_on_cpu:
            raise ConfigError(f"cuda_graphs: needs a CUDA device; the run is on {self.device}")
        if b.kind != "graphs":
            raise ConfigError(f"cuda_graphs: needs a data set of many small graphs; "
                              f"{b.name} is one graph")
        if self.dist.enabled:
            raise ConfigError("cuda_graphs: not with DDP (several processes); run one "
                              "process or cuda_graphs=false")
        if not self.stores:
            raise ConfigError("cuda_graphs: the graphs cannot be packed by the graph store "
                              "(see the 'batches:' log line); use cuda_graphs=false")
        stores = [self.stores[id(ds)] for ds in (b.train, b.val, b.test)]
        keys = stores[0].node_attrs
        if "x" not in keys or "y" not in keys:
            raise ConfigError(f"cuda_graphs: needs node-level 'x' and 'y' (node "
                              f"classification); the graphs have node attributes "
                              f"{sorted(keys)}")
        views = ()
        if cfg.backend == "fused":
            from ..data.prepare import PrepareGraphs
            prep = PrepareGraphs.for_model(self.net)
            views = prep.views if prep is not None else ()
        static = StaticBatches(stores, cfg.batch_size, self.device, views,
                               buckets=cfg.cuda_graph_buckets)
        for v, (din, dout) in static.max_deg.items():
            if max(din, dout) > MIN_SPLIT:
                raise ConfigError(f"cuda_graphs: a graph has a node of degree "
                                  f"{max(din, dout)} > {MIN_SPLIT}, which the fused "
                                  f"schedule splits per batch on the host; use "
                                  f"cuda_graphs=false")
        C, weighted = b.num_classes, bool(b.weighted_loss)

        def loss_fn(out, y, mask):
            return masked_cross_entropy(out.float(), y, mask, C, weighted)

        amp = self.amp_dtype
        dev = self.device.type

        def autocast():   # no weight-cast cache inside a capture
            return (torch.autocast(dev, dtype=amp, cache_enabled=False) if amp is not None
                    else contextlib.nullcontext())

        capture = self.device.type == "cuda"
        K = len(static.buckets)
        self.log(f"cuda_graphs: batches padded to the smallest of {K} size bucket"
                 f"{'s' if K > 1 else ''} that holds them: "
                 + ", ".join(f"{n + 1}/{e}" for n, e, _ in static.buckets)
                 + " nodes/edges; the training step and the evaluation forward are "
                 + (f"captured per bucket after {WARMUP_STEPS} eager steps (all buckets "
                    f"below the worst case at once; the worst case when a batch needs it)"
                    if capture else "run eagerly (no CUDA device)"))
        return GraphedSteps(self.model, self.opt, static, loss_fn, autocast, capture)

    def _graphed_summary(self) -> Dict[str, Any]:
        """results.json ``training.cuda_graphs``: the worst-case capacity, the
        graphs captured (each at most once), the dry runs before captures and,
        per bucket, its capacity, its batches and whether its graphs are
        captured at the end."""
        g = self.graphed
        s = g.static
        cap = g.captured
        return {"captured": g.capture, "num_nodes": s.num_nodes, "num_edges": s.e_cap,
                "captures": g.captures, "dry_runs": g.dry_runs,
                "cuda_graph_buckets": [
                    {"num_nodes": n + 1, "num_edges": e, "train_steps": g.train_counts[i],
                     "eval_batches": g.eval_counts[i],
                     "captured_train": i in cap["train"], "captured_eval": i in cap["eval"]}
                    for i, (n, e, _) in enumerate(s.buckets)]}

    def _build_stores(self) -> None:
        """``data.batcher`` store/auto: one :class:`~pyg_dfgnn.data.GraphBatcher`
        per split (validated and target-sorted once; with the fused backend the
        layers' CSR views are built per batch on the device, without a sync)."""
        from ..data.batching import GraphBatcher
        from ..data.prepare import PrepareGraphs
        b, cfg = self.bundle, self.cfg
        prep = PrepareGraphs.for_model(self.net) if cfg.backend == "fused" else None
        views = prep.views if prep is not None else ()
        t0 = time.perf_counter()
        try:
            for ds in (b.train, b.val, b.test):
                if id(ds) not in self.stores:
                    self.stores[id(ds)] = GraphBatcher(ds, views, build_device=self.device)
        except ValueError as e:
            self.stores = {}
            if cfg.data.batcher == "store":
                raise ConfigError(f"data.batcher=store: {e}") from None
            self.log(f"batches: PyG's DataLoader ({e})")
            return
        self.log(f"batches: pyg_dfgnn.data.GraphBatcher (built in "
                 f"{time.perf_counter() - t0:.1f}s"
                 + (f"; CSR views {list(views)} made on the device per batch" if views
                    else "") + ")")

    def _check_memory(self) -> None:
        """Log the peak-memory estimate of one step; refuse (ConfigError, exit 2) a
        run that would not fit, on every rank alike (see memory.py)."""
        from .memory import check_fits, estimate_for_config
        b = self.bundle
        if b.kind == "graphs":  # one mini-batch: batch_size graphs of the largest size
            sizes = sorted(((int(g.num_nodes), int(g.num_edges)) for g in b.train),
                           reverse=True)[:self.cfg.batch_size]
            n, e = sum(s[0] for s in sizes), sum(s[1] for s in sizes)
        else:
            n, e = int(b.data.num_nodes), int(b.data.num_edges)
        est = estimate_for_config(self.cfg, b.in_dim, b.num_classes, self.num_params, n, e,
                                  b.categorical, device=self.device)
        fits, msg = check_fits(est, self.device)
        self.memory_estimate = est.total
        refuse = D.any_flag(not fits and self.cfg.memory_check, self.device)
        if refuse:
            raise ConfigError(f"memory_check: {msg}" if not fits else
                              "memory_check: another rank's device would not fit the run")
        self.log(msg if fits else f"warning (memory_check=false): {msg}")

    def _loss(self, out, y):
        out = out.float()  # autocast: the loss in fp32
        if self.bundle.weighted_loss:
            return weighted_cross_entropy(out, y, self.bundle.num_classes)
        return F.cross_entropy(out, y)

    def _forward(self, model, batch):
        return model(batch.x, batch.edge_index, lap_pe=getattr(batch, "lap_pe", None))

    def optimize(self, forward, y):
        """One optimiser step: ``forward()`` and the loss against ``y`` under the
        run's precision (autocast; GradScaler for fp16); returns ``(out, loss)``.
        Every training loop (graph batches, sampled subgraphs) goes through here."""
        with self._autocast():
            out = forward()
            loss = self._loss(out, y)
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return out, loss

    # ---------------------------------------------------------------- epochs
    def train_epoch_graphs(self, epoch: int) -> Dict[str, float]:
        self.model.train()
        counter = ConfusionCounter(self.bundle.num_classes, self.device)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=self.device)  # [sum, batches]
        loader = self._train_loader(epoch)
        steps_full = len(loader)
        cap = self.cfg.max_steps_per_epoch
        steps = steps_full if cap is None else min(cap, steps_full)
        g = self.graphed
        it = loader.id_batches() if g is not None else loader
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = it = tqdm(it, desc=f"epoch {epoch}/{self.cfg.epochs}", leave=False,
                            dynamic_ncols=True, file=sys.stderr, total=steps)
        for i, batch in enumerate(it):
            if i >= steps:   # max_steps_per_epoch (the same on every rank)
                break
            if g is not None:   # batch: graph ids; out: the padded batch's logits
                out, loss, n = g.train_step(loader.store, batch)
                out, y = out[:n], g.static.node_attr("y")[:n]
            else:
                batch = self._to_device(batch)
                out, loss = self.optimize(lambda: self._forward(self.model, batch), batch.y)
                y = batch.y
            loss_sum[0] += loss.detach().double()
            loss_sum[1] += 1
            counter.update(out.detach(), y)
            if bar is not None and i % 10 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
        if bar is not None:
            bar.close()
        return pass_summary(loss_sum, counter, self.metric_name, steps=steps,
                            steps_full=steps_full)

    @torch.no_grad()
    def eval_graphs(self, ds) -> Dict[str, float]:
        model = self.eval_model
        self.net.eval()
        counter = ConfusionCounter(self.bundle.num_classes, self.device)
        loss_sum = torch.zeros(2, dtype=torch.float64, device=self.device)
        g = self.graphed
        loader = self._eval_loader(ds)
        for batch in (loader.id_batches() if g is not None else loader):
            if g is not None:
                out, loss, n = g.eval_step(loader.store, batch)
                out, y = out[:n], g.static.node_attr("y")[:n]
            else:
                batch = self._to_device(batch)
                with self._autocast():
                    out = self._forward(model, batch)
                    loss = self._loss(out, batch.y)
                y = batch.y
            loss_sum[0] += loss.double()
            loss_sum[1] += 1
            counter.update(out, y)
        return pass_summary(loss_sum, counter, self.metric_name)

    def train_epoch_full(self, epoch: int) -> Dict[str, float]:
        # full batch: every rank computes the same step (DDP just replicates)
        self.model.train()
        d = self.full
        y = d.y[d.train_mask]
        out, loss = self.optimize(lambda: self.model(d.x, d.edge_index)[d.train_mask], y)
        c = ConfusionCounter(self.bundle.num_classes, self.device)
        c.update(out.detach(), y)
        return {"loss": float(loss.detach()), "metric": c.metric(self.metric_name),
                "steps": 1, "steps_full": 1}

    @torch.no_grad()
    def eval_full(self) -> Dict[str, Dict[str, float]]:
        model = self.eval_model
        self.net.eval()
        d = self.full
        with self._autocast():
            out = model(d.x, d.edge_index).float()
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
            "model": self.net.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict() if self.sched is not None else None,
            "best": self.best,
            "history": self.history,
            "early_stop_bad_epochs": self.bad_epochs,
            "config": config_to_dict(self.cfg),
            "elapsed_train_s": self.train_time,
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
        }

    # Crash consistency.  ``checkpoint_last.pt`` is the authoritative state of
    # the run: besides the weights, optimizer and history of its epoch it embeds,
    # as bytes, the complete ``checkpoint_best.pt`` that belongs to it
    # (``best_checkpoint``).  Each epoch writes, each file atomically
    # (temporary file + os.replace):
    #     1. checkpoint_best.pt   (only when the epoch improved)
    #     2. checkpoint_last.pt   (embedding the best file of step 1 or the older one)
    #     3. results.json         (only at the end of the run)
    # A kill after any prefix of these writes leaves a consistent state:
    #   * nothing written: the previous epoch's pair, as before;
    #   * after 1: checkpoint_best.pt is the best of all *finished* epochs (one
    #     ahead of checkpoint_last.pt); resuming from checkpoint_last.pt restores
    #     checkpoint_best.pt from the copy embedded in it, then re-runs the epoch
    #     (resume is exact), so best weights and best epoch never disagree;
    #   * after 2: both files describe this epoch.
    # results.json is written last and names the epochs of the two files it
    # refers to (``checkpoints``); it is never written for an epoch whose
    # checkpoints were not written.
    def _write_checkpoints(self, epoch: int, improved: bool) -> None:
        state = self._state(epoch)
        if improved:
            buf = io.BytesIO()
            torch.save(state, buf)
            self.best_file = buf.getvalue()
            self._write_bytes(os.path.join(self.out_dir, "checkpoint_best.pt"), self.best_file)
            self.best_file_epoch = epoch
        state["best_checkpoint"] = self.best_file
        _atomic_save(state, os.path.join(self.out_dir, "checkpoint_last.pt"))
        self.last_file_epoch = epoch

    @staticmethod
    def _write_bytes(path: str, data: bytes) -> None:
        with atomic_write(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)

    def _best_bytes(self, ckpt: Dict[str, Any], path: str) -> Optional[bytes]:
        """The checkpoint_best.pt content that belongs to ``ckpt`` (None: no best yet)."""
        if ckpt.get("best_checkpoint") is not None:
            return bytes(ckpt["best_checkpoint"])
        be = (ckpt.get("best") or {}).get("epoch")
        if be is None:
            return None
        with open(path, "rb") as f:
            if be == ckpt["epoch"]:  # this file is the state of the best epoch itself
                return f.read()
        # a checkpoint of an older version: its best model is a separate file
        bp = os.path.join(os.path.dirname(path), "checkpoint_best.pt")
        found = "missing"
        if os.path.isfile(bp):
            with open(bp, "rb") as f:
                data = f.read()
            try:
                found = "epoch " + str(torch.load(io.BytesIO(data), map_location="cpu",
                                                  weights_only=True)["epoch"])
            except Exception as e:
                found = f"unreadable: {short_error(e)}"
            if found == f"epoch {be}":
                return data
        raise TrainingError(f"resume: {path} records best epoch {be}, but {bp} does not hold "
                            f"it ({found}); the best model cannot be restored consistently")

    def maybe_resume(self) -> int:
        """Returns the first epoch to run (1 when starting fresh).

        The checkpoint was read and its config checked (:func:`train`) before
        any data was loaded; here its state is put into the built model.
        """
        if self.ckpt is None:
            return 1
        ckpt, path = self.ckpt, self.ckpt_path
        try:
            self.net.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise TrainingError(f"resume: checkpoint {path} does not match the model of this "
                                f"config ({e})") from e
        try:
            self.opt.load_state_dict(ckpt["optimizer"])
            if self.sched is not None and ckpt.get("scheduler") is not None:
                self.sched.load_state_dict(ckpt["scheduler"])
            if self.scaler.is_enabled() and ckpt.get("scaler"):
                self.scaler.load_state_dict(ckpt["scaler"])
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise TrainingError(f"resume: the optimizer / scheduler state in {path} does not "
                                f"match this config ({short_error(e)})") from e
        self.best = ckpt.get("best") or self.best
        self.history = list(ckpt.get("history") or [])
        self.bad_epochs = int(ckpt.get("early_stop_bad_epochs", 0))
        self.train_time = float(ckpt.get("elapsed_train_s", 0.0))
        best_bytes = self._best_bytes(ckpt, path)
        if best_bytes is not None:
            best = torch.load(io.BytesIO(best_bytes), map_location=self.device,
                              weights_only=True)
            self.best_state = best["model"]
            self.best_file, self.best_file_epoch = best_bytes, int(best["epoch"])
            bp = os.path.join(self.out_dir, "checkpoint_best.pt")
            if self.main and self.cfg.checkpoint.enabled:
                on_disk = None
                if os.path.isfile(bp):
                    with open(bp, "rb") as f:
                        on_disk = f.read()
                if on_disk != best_bytes:  # killed between the two writes, or a new out_dir
                    self._write_bytes(bp, best_bytes)
                    self.log(f"restored {bp} to epoch {self.best_file_epoch}, the best epoch "
                             f"of {path}")
        same_dir = os.path.dirname(os.path.abspath(path)) == os.path.abspath(self.out_dir)
        if not same_dir and self.main:
            try:
                same_dir = os.path.samefile(os.path.dirname(os.path.abspath(path)),
                                            self.out_dir)
            except OSError:
                pass
        # the out_dir's own checkpoint_last.pt, until this run writes one
        self.last_file_epoch = int(ckpt["epoch"]) if same_dir else None
        self.resumed_from = os.path.abspath(path)
        self.log(f"resumed from {path} (epoch {ckpt['epoch']})")
        self.ckpt = None  # free the memory
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
        self._check_memory()
        self.best: Dict[str, Any] = {}
        self.best_state = None
        self.history: List[Dict[str, Any]] = []
        self.bad_epochs = 0
        self.train_time = 0.0
        self.resumed_from = None
        self.best_file: Optional[bytes] = None
        self.best_file_epoch: Optional[int] = None
        self.last_file_epoch: Optional[int] = None
        start = self.maybe_resume()
        graphs = self.bundle.kind == "graphs"
        stop_reason = "max epochs"
        diverged = None
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
            elif self.sampling is not None:
                tr = self.sampling.train_epoch(epoch)
                t_train = time.perf_counter() - t0
                ev = self.sampling.evaluate_all(
                    test=bool(cfg.eval_test_every and epoch % cfg.eval_test_every == 0))
                va, te = ev["val"], ev["test"]
            else:
                tr = self.train_epoch_full(epoch)
                t_train = time.perf_counter() - t0
                ev = self.eval_full()
                va, te = ev["val"], ev["test"]
            if cuda:
                torch.cuda.synchronize(self.device)
            epoch_time = time.perf_counter() - t0
            # a NaN / inf loss: the weights are no longer usable.  Stop before this
            # epoch is recorded or checkpointed (the checkpoints keep the last good
            # epoch); the losses are all-reduced, so every rank decides the same.
            bad = [f"{what} is {v}" for what, v in (("training loss", tr["loss"]),
                                                    ("validation loss", va["loss"]))
                   if not math.isfinite(v)]
            if D.any_flag(bool(bad), self.device):
                diverged = (f"training diverged: the {' and the '.join(bad) or 'loss'} in "
                            f"epoch {epoch} (non-finite); try a lower optimizer.lr")
                stop_reason = diverged
                self.log(f"stopping: {diverged}")
                break
            self.train_time += epoch_time
            peak = torch.cuda.max_memory_allocated(self.device) if cuda else None
            lr = float(self.opt.param_groups[0]["lr"])
            rec = {"epoch": epoch, "train_loss": tr["loss"], "train_metric": tr["metric"],
                   "val_loss": va["loss"], "val_metric": va["metric"],
                   "test_loss": te["loss"] if te else None,
                   "test_metric": te["metric"] if te else None,
                   "lr": lr, "epoch_time_s": epoch_time, "train_time_s": t_train,
                   "steps": tr.get("steps"), "steps_per_epoch": tr.get("steps_full"),
                   "capped": tr.get("steps") != tr.get("steps_full"),
                   "first_batch_s": tr.get("first_batch_s"),
                   "peak_gpu_mem_bytes": peak}
            self.history.append(rec)

            improved = self._improved(va)
            if improved:
                self.best = {"epoch": epoch, "val_loss": va["loss"], "val_metric": va["metric"],
                             "test_loss": rec["test_loss"], "test_metric": rec["test_metric"]}
                self.best_state = copy.deepcopy(self.net.state_dict())

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
                if rec["capped"]:
                    line += (f" | {rec['steps']} of {rec['steps_per_epoch']} steps "
                             "(max_steps_per_epoch)")
                line += (f" | lr {lr:.2e} | {epoch_time:6.2f}s | peak mem {_fmt_mem(peak)}"
                         + (" *" if improved else ""))
                self.log(line)

            if self.main and cfg.checkpoint.enabled:
                self._write_checkpoints(epoch, improved)

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
            new_lr = float(self.opt.param_groups[0]["lr"])
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
        final = self._final_eval(last=diverged is None)
        total = time.perf_counter() - t_start
        results = self._results(final, stop_reason, total)
        results["status"] = "diverged" if diverged else "completed"
        if self.main:
            path = os.path.join(self.out_dir, "results.json")
            with atomic_write(path) as tmp:
                with open(tmp, "w") as f:
                    json.dump(results, f, indent=2, default=str)
            m = results["metrics"]

            def num(v):
                return "n/a" if v is None else f"{v:.2f}"
            self.log(f"{'stopped' if diverged else 'done'} ({stop_reason}) in {total:.1f}s: "
                     f"best epoch {m['best_epoch']}, val {num(m['best_val_metric'])}, test "
                     f"{num(m['test_metric'])} ({self.metric_name}) -> {path}")
        self.log.close()
        if diverged:
            kept = ((results["checkpoints"] or {}).get("last") or {}).get("epoch")
            raise TrainingDiverged(
                diverged + (f"; {os.path.join(self.out_dir, 'checkpoint_last.pt')} keeps "
                            f"epoch {kept}" if kept else "") + "; see results.json", results)
        return results

    def _final_eval(self, last: bool = True) -> Dict[str, Any]:
        """Evaluate the last model (unless ``last=False``: its weights diverged) and
        the best one (None when there is none)."""
        graphs = self.bundle.kind == "graphs"
        model = self.net

        def evaluate():
            if graphs:
                return {"val": self.eval_graphs(self.bundle.val),
                        "test": self.eval_graphs(self.bundle.test)}
            if self.sampling is not None:
                return self.sampling.evaluate_all()
            ev = self.eval_full()
            return {"val": ev["val"], "test": ev["test"]}

        last = evaluate() if last else None
        # the best epoch is the last one: its weights are the current ones, so a
        # deterministic evaluation (all but sampled inference) would repeat itself
        sampled_eval = self.sampling is not None and self.sampling.eval_mode == "sampled"
        if last is not None and not sampled_eval and self.history \
                and self.best.get("epoch") == self.history[-1]["epoch"]:
            best = last
        elif self.best_state is not None:
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

        def get(which, split, key):  # None where that model was not evaluated
            ev = final[which]
            return None if ev is None else ev[split][key]
        metrics = {
            "metric": self.metric_name,
            "best_epoch": self.best.get("epoch"),
            "best_val_metric": get("best", "val", "metric"),
            "best_val_loss": get("best", "val", "loss"),
            "test_metric": get("best", "test", "metric"),   # test at the best val epoch
            "test_loss": get("best", "test", "loss"),
            "final_epoch": last_h.get("epoch"),
            "final_train_loss": last_h.get("train_loss"),
            "final_train_metric": last_h.get("train_metric"),
            "final_val_metric": get("last", "val", "metric"),
            "final_test_metric": get("last", "test", "metric"),
            "final_test_loss": get("last", "test", "loss"),
        }
        ckpts = None
        if self.cfg.checkpoint.enabled:
            # only files this run's directory really holds, with the epoch of each
            ckpts = {"last": {"file": "checkpoint_last.pt", "epoch": self.last_file_epoch}
                     if self.last_file_epoch is not None else None,
                     "best": {"file": "checkpoint_best.pt", "epoch": self.best_file_epoch}
                     if self.best_file_epoch is not None else None}
        return {
            "name": self.cfg.name,
            "config": config_to_dict(self.cfg),
            "dataset": {"name": self.bundle.name, "source": self.bundle.source,
                        "num_classes": self.bundle.num_classes, "stats": self.bundle.stats},
            "model": {"name": self.cfg.model.name, "backend": self.cfg.backend,
                      "parameters": self.num_params},
            "training": {"max_steps_per_epoch": self.cfg.max_steps_per_epoch,
                         "capped": any(h.get("capped") for h in self.history),
                         "precision": self.cfg.precision,
                         "attention_backward": self.cfg.attention_backward,
                         "autocast_dtype": None if self.amp_dtype is None
                         else str(self.amp_dtype).replace("torch.", ""),
                         "grad_scaler": self.scaler.is_enabled(),
                         "compile": (config_to_dict(self.cfg.compile)
                                     if self.cfg.compile.enabled else False),
                         "prepared_graphs": (None if self.prepare is None
                                             else list(self.prepare.views)),
                         "batcher": "store" if self.stores else "pyg",
                         "cuda_graphs": (None if self.graphed is None else
                                         self._graphed_summary()),
                         "cuda_graphs_requested": self.cfg.cuda_graphs,
                         "cuda_graphs_off": self.cuda_graphs_off},
            "metrics": metrics,
            "stop_reason": stop_reason,
            "resumed_from": self.resumed_from,
            "checkpoints": ckpts,
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
    # before anything is loaded: the machine (device, writable out_dir) and the
    # checkpoint to resume from (readable, its config compatible) -- ConfigError /
    # TrainingError naming the key or file
    check_environment(cfg, probe_out_dir=int(os.environ.get("RANK", "0")) == 0)
    resume_ckpt = None
    if cfg.resume not in (None, False):
        path = (os.path.join(cfg.resolved_out_dir(), "checkpoint_last.pt")
                if cfg.resume is True else cfg.resume)
        ckpt = _read_checkpoint(path)
        _check_resume_config(cfg, ckpt, path)
        resume_ckpt = (ckpt, path)
    dist = D.setup(cfg.device)
    # the fused backward's column-pass mode for this run (auto: not forced, so
    # PYG_DFGNN_BACKWARD still applies); restored afterwards
    mode = None if cfg.backend != "fused" or cfg.attention_backward == "auto" \
        else cfg.attention_backward
    try:
        with backward_mode(mode):
            result = _Run(cfg, dist, resume_ckpt).run()
        # every rank finished before the process group goes away: a rank that
        # destroyed its gloo group while the other was still writing the results
        # aborted ("terminate called without an active exception") about 1 run in 10
        D.barrier()
        return result
    finally:
        D.cleanup()
