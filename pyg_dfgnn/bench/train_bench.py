"""End-to-end training-epoch benchmark: the training side's models, ``backend:
fused`` vs ``backend: pyg``.

For every entry of ``train.runs`` (a training config: an inline mapping
and/or ``config: path.yaml``, a relative path looked up from the working
directory and then from the package checkout, e.g. the shipped
``configs/pattern_gt.yaml``; plus ``overrides:``) and every backend; a row's
``dtype`` is the run's ``precision`` (bf16: ``bfloat16``, autocast):

1. **check** -- the model is built by ``pyg_dfgnn.train.models.build_model``
   once per backend with the same seed (the fused model additionally gets the
   PyG model's ``state_dict``) and their logits on the first training batch
   (eval mode, no grad) are compared; a fused model that disagrees beyond
   the float32 tolerance is reported as ``mismatch`` and not timed;
2. **timing**, ``train.mode``:

   * ``trainer`` (default when ``pyg_dfgnn.train.train`` exists): the real
     trainer runs ``warmup_epochs + epochs`` epochs (checkpoints, scheduler
     and early stopping off, its log captured to ``train/<run>_<backend>/``);
     from its per-epoch history, ``fwdbwd_ms`` = the training pass
     (``train_time_s``: batches, forward, loss, backward, optimizer step,
     metrics), ``fwd_ms`` = the validation pass (``epoch_time_s -
     train_time_s``), ``fwdbwd_peak_mb`` = the largest per-epoch
     ``max_memory_allocated`` (absolute: model, optimizer state and data
     included);
   * ``loop``: a minimal loop of our own over the same model and data --
     fresh ``DataLoader`` batches every epoch (shuffled with a per-epoch
     seed, the same for both backends, moved to the device inside the epoch
     so the fused layers' CSR conversion of each new batch is included),
     forward, cross-entropy, backward, Adam step; ``fwd_ms`` = an inference
     pass over the same batches; ``fwdbwd_peak_mb`` = peak *extra* memory
     over the timed epochs.

   ``first_ms`` is the first (warm-up) epoch.  Times are wall-clock with the
   device synchronised at the end of each measured pass.

If the training stack cannot be imported, the runs are reported as
``skipped: ...``.
"""
from __future__ import annotations

import contextlib
import copy
import io
import os
from typing import Any, Callable, Dict, List, Optional

import torch

from . import timing
from .config import deep_merge, load_yaml
from .runner import Settings, _short, rel_err


def _imports():
    from ..data.datasets import load_data  # noqa: F401
    from ..train.config import config_from_dict  # noqa: F401
    from ..train.models import BackendError, build_model  # noqa: F401
    return load_data, config_from_dict, build_model, BackendError


#: the package's checkout: a run's relative ``config:`` path not found from the
#: working directory is looked up here (``configs/pattern_gt.yaml``)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the training config's ``precision`` -> the row's dtype
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _raw_config(run: Dict[str, Any]) -> Dict[str, Any]:
    raw: Dict[str, Any] = {}
    if run.get("config"):
        path = run["config"]
        if not os.path.isabs(path) and not os.path.exists(path) \
                and os.path.exists(os.path.join(_ROOT, path)):
            path = os.path.join(_ROOT, path)
        raw = load_yaml(path)
    raw = deep_merge(raw, {k: v for k, v in run.items()
                           if k not in ("config", "overrides", "label")})
    return deep_merge(raw, run.get("overrides") or {})


def _row(name: str, graph: str, backend: str, status: str, **kw) -> Dict[str, Any]:
    r = {"section": "train", "graph": graph, "graph_kind": "train", "case": name,
         "dtype": "float32", "contender": backend, "baseline": "pyg", "status": status,
         "check": "", "max_err": None, "note": ""}
    r.update(kw)
    return r


def _forward(model, batch):
    kw = {}
    if getattr(batch, "lap_pe", None) is not None:
        kw["lap_pe"] = batch.lap_pe
    return model(batch.x, batch.edge_index, **kw)


def _trainer_fn():
    """``pyg_dfgnn.train.train`` if the training package exposes it."""
    try:
        from .. import train as T
    except Exception:
        return None
    fn = getattr(T, "train", None)
    return fn if callable(fn) else None


def run_train(cfg: Dict[str, Any], settings: Settings, device: torch.device, out_dir: str,
              on_row: Optional[Callable[[Dict[str, Any]], None]] = None
              ) -> List[Dict[str, Any]]:
    tc = cfg.get("train", {})
    backends = list(tc.get("backends", ["fused", "pyg"]))
    if "pyg" in backends:  # the baseline runs first
        backends = ["pyg"] + [b for b in backends if b != "pyg"]
    rows: List[Dict[str, Any]] = []

    def emit(r):
        rows.append(r)
        if on_row is not None:
            on_row(r)

    runs = tc.get("runs") or []
    try:
        load_data, config_from_dict, build_model, BackendError = _imports()
    except Exception as e:
        for run in runs or [{"label": "-"}]:
            for b in backends:
                emit(_row(run.get("label") or "-", "-", b,
                          f"skipped: pyg_dfgnn.train not ready ({_short(e, 100)})"))
        return rows
    mode = tc.get("mode", "auto")
    trainer = _trainer_fn() if mode in ("auto", "trainer") else None
    if mode == "trainer" and trainer is None:
        for run in runs:
            for b in backends:
                emit(_row(run.get("label") or "-", "-", b,
                          "skipped: pyg_dfgnn.train.train not available (train.mode=trainer)"))
        return rows
    data_root = tc.get("data_root") or os.path.join(out_dir, "train_data")
    for run in runs:
        label = run.get("label") or run.get("name") or "run"
        late = settings.out_of_time()
        if late:
            for b in backends:
                emit(_row(label, "-", b, f"skipped: {late}"))
            continue
        try:
            raw = _raw_config(run)
            # the bench's data root unless the run itself names one (a shipped
            # config's own data.root is the user's training data directory)
            own = [(m.get("data") or {}).get("root") for m in (run, run.get("overrides") or {})]
            raw.setdefault("data", {})["root"] = next((r for r in own if r), data_root)
            raw["device"] = str(device)
            tcfg = config_from_dict(raw)
            bundle = load_data(tcfg.data, seed=tcfg.seed, log=lambda *_: None)
            if getattr(tcfg.model, "lap_pe", False) and bundle.kind == "graphs":
                # as the trainer does (the check and loop mode use the training split)
                from ..data.datasets import add_laplacian_pe
                bundle.train = add_laplacian_pe(bundle.train, tcfg.model.lap_pe_dim)
        except Exception as e:
            for b in backends:
                emit(_row(label, "-", b, f"error: {_short(e)}", note="config / data"))
            continue
        for r in _bench_run(label, raw, tcfg, bundle, backends, build_model, BackendError,
                            config_from_dict, trainer, tc, settings, device, out_dir):
            emit(r)
    return rows


def _bench_run(label, raw, tcfg, bundle, backends, build_model, BackendError,
               config_from_dict, trainer, tc, settings, device, out_dir
               ) -> List[Dict[str, Any]]:
    from torch_geometric.loader import DataLoader
    seed = int(tcfg.seed)
    full = bundle.kind == "full"
    if full:
        data = bundle.data.to(device)
        n_nodes, n_edges = int(data.num_nodes), int(data.edge_index.size(1))
        gname = f"{bundle.name}"
    else:
        ds = bundle.train
        n_nodes = sum(int(d.num_nodes) for d in ds)
        n_edges = sum(int(d.edge_index.size(1)) for d in ds)
        gname = f"{bundle.name}[{len(ds)}]"
    m = tcfg.model
    warm = max(int(tc.get("warmup_epochs", 1)), 0)
    epochs = max(int(tc.get("epochs", 3)), 1)
    amp_dtype = getattr(torch, _DTYPES[tcfg.precision])
    common = dict(graph_kind="train", num_nodes=n_nodes, num_edges=n_edges,
                  heads=getattr(m, "heads", None), channels=getattr(m, "hidden", None),
                  device=str(device), dtype=_DTYPES[tcfg.precision])

    def autocast():   # the loop mode's precision (the trainer sets its own)
        return torch.autocast(device.type, dtype=amp_dtype,
                              enabled=amp_dtype != torch.float32)

    def batches(epoch: int):
        if full:
            yield data
            return
        gen = torch.Generator().manual_seed(seed * 1000 + epoch)
        for b in DataLoader(ds, batch_size=int(tcfg.batch_size), shuffle=True,
                            generator=gen):
            yield b.to(device, non_blocking=True)

    def loss_of(out, b):
        if full:
            return torch.nn.functional.cross_entropy(out[b.train_mask], b.y[b.train_mask])
        return torch.nn.functional.cross_entropy(out, b.y)

    pyg_state = None
    ref_logits = None
    rows = []
    for b in backends:
        how = "pyg_dfgnn.train.train" if trainer is not None else "bench loop"
        row = _row(label, gname, b, "", **common,
                   note=f"{m.name} hidden={m.hidden} layers={m.layers}, timed by {how}; "
                        f"data: {bundle.source}")
        stage = "build"
        model = None
        try:
            torch.manual_seed(seed)
            model = build_model(m, bundle.in_dim, bundle.num_classes, bundle.categorical,
                                b).to(device)
            if b != "pyg" and pyg_state is not None:
                model.load_state_dict(pyg_state)  # identical weights for the check
            stage = "check"
            first = next(iter(batches(0)))
            model.eval()
            with torch.no_grad():
                logits = _forward(model, first).detach().cpu()
            del first
            if b == "pyg":
                ref_logits = logits
                pyg_state = copy.deepcopy(model.state_dict())
                row["check"], row["max_err"] = "pyg", 0.0
            elif ref_logits is None:
                row["check"] = "none"
                row["note"] += "; unchecked: backend pyg did not run"
            else:
                err = rel_err(logits, ref_logits)
                row["check"], row["max_err"] = "pyg", err
                if not err <= settings.tol(torch.float32):
                    row["status"] = "mismatch"
                    row["note"] += f"; logits rel err {err:.3g} vs backend pyg"
                    rows.append(row)
                    continue
            if trainer is not None:
                model = None
                timing.free_memory(device)
                stage = "trainer"
                _time_with_trainer(row, label, b, raw, config_from_dict, trainer, warm,
                                   epochs, device, out_dir)
                row["status"] = "ok"
                continue
            opt = torch.optim.Adam(model.parameters(), lr=float(tcfg.optimizer.lr))

            def train_epoch(epoch: int):
                model.train()
                for bt in batches(epoch):
                    with autocast():
                        out = _forward(model, bt)
                        loss = loss_of(out.float(), bt)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()

            def eval_epoch(epoch: int):
                model.eval()
                with torch.no_grad(), autocast():
                    for bt in batches(epoch):
                        _forward(model, bt)

            stage = "warm-up epochs"
            for e in range(warm):
                t = timing.wall_once(lambda: train_epoch(e), device)
                if e == 0:
                    row["first_ms"] = t
            stage = "timed epochs"
            base = timing.allocated_mb(device)
            if timing.is_cuda(device):
                torch.cuda.reset_peak_memory_stats(device)
            times = [timing.wall_once(lambda: train_epoch(warm + e), device)
                     for e in range(epochs)]
            if timing.is_cuda(device):
                row["fwdbwd_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20 - base
            if "first_ms" not in row:
                row["first_ms"] = times[0]
            row.update(timing.summarize(times).as_dict("fwdbwd_ms"))
            if tc.get("eval", True):
                stage = "eval passes"
                ev = [timing.wall_once(lambda: eval_epoch(e), device) for e in range(epochs)]
                row.update(timing.summarize(ev).as_dict("fwd_ms"))
            row["status"] = "ok"
        except BackendError as e:
            row["status"] = f"n/a: {_short(e, 100)}"
        except Exception as e:
            if timing.is_oom(e):
                row["status"] = "OOM"
                row["note"] += f"; out of memory during {stage}"
            else:
                row["status"] = f"error: {_short(e)}"
                row["note"] += f"; during {stage}"
        finally:
            model = None
            timing.free_memory(device, collect=row["status"] == "OOM"
                               or row["status"].startswith("error"))
            rows.append(row)
    return rows


def _time_with_trainer(row, label, backend, raw, config_from_dict, trainer, warm, epochs,
                       device, out_dir) -> None:
    run_dir = os.path.join(out_dir, "train", f"{label}_{backend}")
    raw_b = deep_merge(raw, {
        "name": f"{label}_{backend}", "backend": backend, "epochs": warm + epochs,
        "out_dir": run_dir, "device": str(device), "resume": None, "time_limit_min": None,
        "eval_test_every": 0, "checkpoint": {"enabled": False},
        "log": {"progress": False, "every": 1},
        "early_stopping": {"patience": 0}, "scheduler": {"name": "none"},
    })
    cfg = config_from_dict(raw_b)
    os.makedirs(run_dir, exist_ok=True)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        res = trainer(cfg)
    with open(os.path.join(run_dir, "bench_stdout.log"), "w") as f:
        f.write(buf.getvalue())
    hist = list(res.get("history") or [])
    if len(hist) < warm + 1:
        raise RuntimeError(f"the trainer ran {len(hist)} epoch(s), expected {warm + epochs} "
                           f"(stop reason: {res.get('stop_reason')})")
    timed = hist[warm:]
    tr = [1e3 * float(h["train_time_s"]) for h in timed]
    va = [1e3 * max(float(h["epoch_time_s"]) - float(h["train_time_s"]), 0.0) for h in timed]
    row["first_ms"] = 1e3 * float(hist[0]["train_time_s"])
    row.update(timing.summarize(tr).as_dict("fwdbwd_ms"))
    row.update(timing.summarize(va).as_dict("fwd_ms"))
    peaks = [h.get("peak_gpu_mem_bytes") for h in timed if h.get("peak_gpu_mem_bytes")]
    if peaks:
        row["fwdbwd_peak_mb"] = max(peaks) / 2**20
    metrics = res.get("metrics") or {}
    if metrics.get("final_train_loss") is not None:
        row["note"] += f"; final train loss {float(metrics['final_train_loss']):.4f}"
