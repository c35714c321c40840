import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # worlds.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(scope="session")
def smollm2():
    """The local SmolLM2 back end, loaded once per test session (~20-40 s)."""
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    from planners.backends.local import LocalBackend

    return LocalBackend()


@pytest.fixture(scope="session")
def grounder():
    from planners.grounding import TextGrounder

    return TextGrounder(threshold=0.8)
