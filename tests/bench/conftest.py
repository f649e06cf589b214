import pytest
import torch


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """The bench tests use tiny tensors: one intra-op thread avoids OpenMP spin
    on small, shared CI machines (restored afterwards)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
