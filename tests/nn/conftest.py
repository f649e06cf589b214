"""tests/nn: tiny problems, so run single-threaded -- intra-op threads only add
synchronisation cost here, which explodes when the CPU is oversubscribed."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
