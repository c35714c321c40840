import pytest

from embodied.data.dataset import Dataset

from data_helpers import make_episodes


@pytest.fixture
def small_dataset():
    """Three episodes: terminal (4 steps), timeout (3 steps), timeout (2 steps)."""
    return Dataset.from_episodes(make_episodes([4, 3, 2], ["terminal", "timeout", "timeout"]), metadata={"env": "toy"})
