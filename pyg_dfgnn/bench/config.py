"""Benchmark configuration: built-in defaults, YAML loading, ``--quick``.

A config is a nested dict; a YAML file only needs the keys it changes
(they are deep-merged over :data:`BASE`).  ``configs/bench_default.yaml`` is
the full GPU suite and ``configs/bench_quick.yaml`` the CPU smoke run
(:data:`QUICK` is its built-in copy, used when the file is not around, e.g.
for an installed package).
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, Optional

BASE: Dict[str, Any] = {
    "name": "bench",
    "device": "auto",            # auto | cuda | cuda:N | cpu
    "dtypes": ["float32"],
    "seed": 0,
    "time_budget_s": None,       # no new case starts after this many seconds (skipped rows)
    "cpu_threads": None,         # torch.set_num_threads for the run (None: unchanged)
    "timing": {
        "warmup": 3,
        "repeats": 15,
        "max_measure_s": 5.0,    # fewer repeats (>= min_repeats) when one call is slow
        "min_repeats": 3,
    },
    "check": {
        # max |out - ref| / max |ref| (also for the input and parameter gradients)
        "tolerance": {"float64": 1e-6, "float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2},
        "fp64_max_elements": 250_000_000,  # fp64 reference when E * H * F is at most this
        "cpu_fallback": True,    # reference on the CPU (forward only) if the GPU one OOMs
        "grads": True,           # compare input/parameter gradients as well
        "floor": 0.01,           # error denominator >= floor * largest gradient of its group
    },
    "graphs": [],
    "layers": {
        "enabled": True,
        "names": ["gat", "gatv2", "transformer", "agnn"],
        "heads": 4,
        "channels": 64,          # per head; AGNN is single-head with F = channels
        "in_channels": 64,
        "contenders": ["fused", "pyg", "pyg_sparse", "pyg_compile"],
        "kwargs": {},            # per layer: extra constructor arguments
    },
    "compile": {
        "enabled": True,
        "graphs": None,          # graph names that get the pyg_compile contender (None: all)
        "dynamic": False,
        "mode": None,
        "budget_s": 180.0,       # total compile time; later compile contenders are skipped
    },
    "ops": {
        "enabled": False,
        "names": ["gat", "gatv2", "dot"],
        "heads": 4,
        "channels": 64,
        "contenders": ["fused", "naive"],
        "graphs": None,          # None: all graphs
    },
    "train": {
        "enabled": False,
        "backends": ["fused", "pyg"],
        "epochs": 3,             # timed epochs (after warm-up epochs)
        "warmup_epochs": 1,
        "runs": [],              # list of training configs (dicts or YAML paths)
    },
    "plots": True,
}

QUICK: Dict[str, Any] = {
    "name": "quick",
    "device": "cpu",
    "timing": {"warmup": 1, "repeats": 3, "max_measure_s": 1.0, "min_repeats": 2},
    "graphs": [
        {"name": "uniform_1k", "kind": "uniform", "num_nodes": 1000, "num_edges": 8000,
         "seed": 0},
        {"name": "powerlaw_1k", "kind": "powerlaw", "num_nodes": 1000, "num_edges": 8000,
         "max_degree": 800, "seed": 2},
        {"name": "pattern_4", "kind": "pattern", "num_graphs": 4, "seed": 0},
    ],
    "layers": {"heads": 2, "channels": 16, "in_channels": 16},
    "compile": {"enabled": False},
    "ops": {"enabled": True, "heads": 2, "channels": 16},
    "train": {"enabled": True, "epochs": 1, "warmup_epochs": 0},
}

#: what ``--quick`` changes in an explicitly given config
QUICK_OVERRIDES: Dict[str, Any] = {
    "timing": {"warmup": 1, "repeats": 3, "max_measure_s": 1.0, "min_repeats": 2},
    "compile": {"enabled": False},
    "train": {"epochs": 1, "warmup_epochs": 0},
}


def deep_merge(base: Dict[str, Any], over: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_config(name: str) -> Optional[str]:
    """``configs/bench_<name>.yaml`` relative to the CWD or the checkout."""
    for base in (os.getcwd(), repo_root()):
        p = os.path.join(base, "configs", f"bench_{name}.yaml")
        if os.path.isfile(p):
            return p
    return None


def load_yaml(path: str) -> Dict[str, Any]:
    import yaml
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a benchmark config must be a mapping, got "
                         f"{type(data).__name__}")
    return data


def load_config(path: Optional[str] = None, quick: bool = False) -> Dict[str, Any]:
    """Resolve the config: ``path`` (merged over :data:`BASE`), else the quick
    or default config file, else the built-in quick config."""
    if path is None:
        found = find_config("quick" if quick else "default")
        if found is not None:
            cfg = deep_merge(BASE, load_yaml(found))
            cfg["_source"] = found
            return cfg
        if not quick:
            raise FileNotFoundError("configs/bench_default.yaml not found; pass a config "
                                    "path or --quick")
        cfg = deep_merge(BASE, QUICK)
        cfg["_source"] = "built-in quick config"
        return cfg
    if not os.path.isfile(path):
        alt = find_config(path)  # allow `dfgnn bench quick`
        if alt is None:
            raise FileNotFoundError(f"benchmark config {path!r} not found")
        path = alt
    cfg = deep_merge(BASE, load_yaml(path))
    if quick:
        cfg = deep_merge(cfg, QUICK_OVERRIDES)
    cfg["_source"] = path
    return cfg
