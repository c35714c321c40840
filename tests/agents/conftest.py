import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny networks: one thread is fastest, and two threads on a busy 2-core machine stall for ~100x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
