"""A/B of the padded steps' masked BatchNorm: ``dfgnn train`` with the
``masked_batch_norm`` of another ``models.py`` (e.g. session 9's, written as
autograd ops) patched in, or the current one.

    python scripts/ab_masked_norm.py OLD_MODELS_PY|current CONFIG [OVERRIDES...]

``git show db645d4:pyg_dfgnn/train/models.py > old.py`` gives session 9's file.
The ELU that the current ``norm(..., elu=True)`` fuses is applied after the
old function's output, as session 9's models did.
"""
import importlib.util
import sys

import torch.nn.functional as F

from pyg_dfgnn.train import models
from pyg_dfgnn.train.cli import main

if __name__ == "__main__":
    which, args = sys.argv[1], sys.argv[2:]
    if which != "current":
        spec = importlib.util.spec_from_file_location("old_models", which)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)

        def masked_batch_norm(bn, x, mask, elu=False):
            y = old.masked_batch_norm(bn, x, mask)
            return F.elu(y) if elu else y
        models.masked_batch_norm = masked_batch_norm
    sys.exit(main(args))
