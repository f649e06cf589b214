"""CUDA cache validation modes (pyg_dfgnn.graph.strict_cache): by default a
CUDA hit is fingerprinted only for unversioned (inference) tensors; strict mode
fingerprints every hit, catching writes through ``.data``."""
import pytest
import torch

from pyg_dfgnn import graph as G

pytestmark = pytest.mark.cuda


def test_strict_cache_catches_data_writes_on_cuda():
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]], device="cuda")
    old = G.strict_cache(True)
    try:
        G.clear_cache()
        g1 = G.get_graph(ei, (4, 4))
        ei.data[0, 0] = 2                  # bypasses the version counter
        g2 = G.get_graph(ei, (4, 4))
        assert g2 is not g1
        assert G.cache_info()["stale"] >= 1
        assert 2 in g2.col.tolist()
    finally:
        G.strict_cache(old)


def test_default_mode_still_checks_inference_tensors_on_cuda():
    with torch.inference_mode():
        ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]], device="cuda")
    G.clear_cache()
    g1 = G.get_graph(ei, (4, 4))
    with torch.inference_mode():
        ei[0, 0] = 2
    g2 = G.get_graph(ei, (4, 4))
    assert g2 is not g1


def test_strict_cache_returns_previous_setting():
    old = G.strict_cache(True)
    assert G.strict_cache(old) is True


def test_default_mode_hits_on_the_version_counter_on_cuda():
    """The default mode's hit on a CUDA edge_index tensor (the layers' every
    call) returns the cached graph while the tensor's version counter is the
    conversion's, converts again after an in-place write, and keys apart sizes
    and self-loop counts."""
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]], device="cuda")
    G.clear_cache()
    g1 = G.get_graph(ei, (4, 4))
    hits = G.cache_info()["hits"]
    assert G.get_graph(ei, (4, 4)) is g1
    assert G.cache_info()["hits"] == hits + 1
    assert G.get_graph(ei, (5, 5)) is not g1                 # another key
    looped = G.get_graph(ei, (4, 4), 4)
    assert looped is not g1 and looped.num_edges == 8
    assert G.get_graph(ei, (4, 4), 4) is looped
    ei[0, 0] = 2                                              # bumps the version counter
    g2 = G.get_graph(ei, (4, 4))
    assert g2 is not g1 and 2 in g2.col.tolist()
    assert G.get_graph(ei, (4, 4)) is g2
    other = ei.clone()                                        # another object, same content
    assert G.get_graph(other, (4, 4)) is not g2
