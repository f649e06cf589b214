"""Training from YAML configs: ``dfgnn train configs/X.yaml [key=value ...]``.

>>> from pyg_dfgnn.train import load_config, train
>>> cfg = load_config("configs/pattern_gat_quick.yaml", ["epochs=1", "backend=pyg"])
>>> results = train(cfg)          # also writes out_dir/results.json
"""
from __future__ import annotations

from .config import ConfigError, TrainConfig, config_to_dict, load_config  # noqa: F401


def train(cfg):
    """See :func:`pyg_dfgnn.train.trainer.train`."""
    from .trainer import train as _train
    return _train(cfg)


def build_model(*args, **kwargs):
    """See :func:`pyg_dfgnn.train.models.build_model`."""
    from .models import build_model as _build
    return _build(*args, **kwargs)


__all__ = ["load_config", "train", "build_model", "ConfigError", "TrainConfig",
           "config_to_dict"]
