import pytest


@pytest.fixture(autouse=True)
def _agents_run_on_one_thread(one_thread):
    yield
