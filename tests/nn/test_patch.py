"""pyg_dfgnn.nn.patch: patch_pyg / unpatch_pyg / patched()."""
import pytest
import torch
import torch_geometric.nn as tnn
import torch_geometric.nn.conv as tconv

import pyg_dfgnn
from pyg_dfgnn import nn as dnn
from pyg_dfgnn.nn import is_patched, patch_pyg, patched, unpatch_pyg

NAMES = ["GATConv", "GATv2Conv", "TransformerConv", "AGNNConv"]
ORIGINAL = {name: getattr(tnn, name) for name in NAMES}


@pytest.fixture(autouse=True)
def _restore():
    unpatch_pyg()
    yield
    unpatch_pyg()
    for name, cls in ORIGINAL.items():
        assert getattr(tnn, name) is cls and getattr(tconv, name) is cls


def _assert_state(patched_now: bool):
    for name in NAMES:
        want = getattr(dnn, name) if patched_now else ORIGINAL[name]
        assert getattr(tnn, name) is want, name
        assert getattr(tconv, name) is want, name
    assert is_patched() == patched_now


def test_patch_unpatch_idempotent():
    _assert_state(False)
    patch_pyg()
    patch_pyg()
    _assert_state(True)
    unpatch_pyg()
    _assert_state(False)
    unpatch_pyg()
    _assert_state(False)


def test_top_level_aliases():
    pyg_dfgnn.patch_pyg()
    _assert_state(True)
    pyg_dfgnn.unpatch_pyg()
    _assert_state(False)


def test_context_manager_nesting_and_errors():
    with patched():
        _assert_state(True)
        with patched():
            _assert_state(True)
        _assert_state(True)  # inner exit keeps the outer patch
    _assert_state(False)
    with pytest.raises(KeyError):
        with patched():
            raise KeyError("boom")
    _assert_state(False)
    patch_pyg()
    with patched():
        pass
    _assert_state(True)  # patched before entering: stays patched


def test_patched_model_is_ours_and_equivalent():
    def build():
        from torch_geometric.nn import GATConv  # looked up at call time
        torch.manual_seed(0)
        return GATConv(6, 4, heads=2)
    ref = build()
    with patched():
        ours = build()
    assert type(ours) is dnn.GATConv and type(ref) is ORIGINAL["GATConv"]
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(7, 6)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 0]])
    torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-5, atol=1e-6)


def test_warns_about_names_bound_before_patching():
    import sys
    import types
    import warnings
    mod = types.ModuleType("user_model_module")
    mod.GATConv = ORIGINAL["GATConv"]          # as after `from torch_geometric.nn import GATConv`
    sys.modules[mod.__name__] = mod
    try:
        with pytest.warns(UserWarning, match=r"user_model_module\.GATConv.*still refer"):
            patch_pyg()
        assert mod.GATConv is ORIGINAL["GATConv"]  # documented: not patched
        unpatch_pyg()
        mod.GATConv = dnn.GATConv                   # bound to ours: nothing to warn about
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            patch_pyg()
        assert not any("user_model_module" in str(w.message) for w in caught)
    finally:
        del sys.modules[mod.__name__]
