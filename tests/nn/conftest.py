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


@pytest.fixture
def deterministic():
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` for one test:
    the CUDA backward then takes its stored, bit-reproducible modes (no atomic
    sums), so two paths running the same kernels and GEMMs agree bit for bit."""
    old, warn = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(old, warn_only=warn)
