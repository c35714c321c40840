"""MT10 demos from Meta-World's scripted policies: cached files with frames and instructions, read
through the same suite loader as the OGBench suites, and bad requests that fail before any work."""
import numpy as np
import pytest

from embodied.data import mt10_gen
from embodied.data.d4rl import load_extras
from embodied.data.suite import load_suite
from embodied.errors import DatasetError
from sims import mt10

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.slow  # a few seconds on 2 cores
def test_two_tasks_of_demos_load_as_one_suite(tmp_path):
    suite = load_suite("mt10", [1, 7], 150, 0, ("front",), 32, progress=False, cache_dir=tmp_path)
    assert len(suite) == 300 and suite.states.shape == (300, 39) and suite.actions.shape == (300, 4)
    assert suite.images["front"].shape == (300, 32, 32, 3) and suite.images["front"].dtype == np.uint8
    np.testing.assert_array_equal(np.unique(suite.task_ids), [1, 7])
    assert set(suite.instructions[:150]) <= set(mt10.instructions(1))
    assert set(suite.instructions[150:]) <= set(mt10.instructions(7))
    assert np.abs(suite.actions).max() <= 1.0
    batch = suite.sample_chunks(4, 8)
    assert batch["actions"].shape == (4, 8, 4) and batch["observation.images.front"].shape == (4, 32, 32, 3)
    # the scripted policy solves reach in well under 150 steps: the file has a terminal at its success
    spec = mt10_gen.GenSpec("mt10", "task", 150, 0, task_id=1, images=("front",), image_size=32)
    path = mt10_gen.cache_path(spec, tmp_path)
    assert path.is_file()
    ds = mt10_gen.load_or_generate(spec, cache_dir=tmp_path)   # read back from the cache, not regenerated
    assert ds.metadata["success_episodes"] >= 1 and ds.terminals.any()
    assert ds.metadata["generator_version"] == mt10_gen.GENERATOR_VERSION
    assert load_extras(path, ["images/front"])["images/front"].shape == (150, 32, 32, 3)


@pytest.mark.parametrize("change,needle", [({"quality": "play"}, "only 'task'"), ({"task_id": 12}, "task_id=12"),
                                           ({"size": 0}, "size=0"), ({"images": ("side",)}, "unknown camera"),
                                           ({"env": "cube-single"}, "mt10 data only")])
def test_bad_requests_fail_before_any_env_is_built(change, needle):
    fields = dict(env="mt10", quality="task", size=10, seed=0, task_id=1)
    fields.update(change)
    with pytest.raises(DatasetError, match=needle):
        mt10_gen.check_spec(mt10_gen.GenSpec(**fields))


def test_env_options_pick_the_task_and_relabel_the_reward(tmp_path):
    from embodied.data import catalog

    dense = catalog.load_dataset("mt10", "task", 120, options={"task_id": 6}, cache_dir=tmp_path, progress=False)
    sparse = catalog.load_dataset("mt10", "task", 120, options={"task_id": 6, "reward": "success"},
                                  cache_dir=tmp_path, progress=False)
    assert dense.metadata["task_id"] == 6 and dense.metadata["task_name"] == "drawer-close-v3"
    assert dense.terminals.any() and len(set(dense.rewards.tolist())) > 2   # drawer-close succeeds within 120 steps
    np.testing.assert_array_equal(sparse.observations, dense.observations)   # the same cached demos
    np.testing.assert_array_equal(sparse.rewards, dense.terminals.astype(np.float32))
    with pytest.raises(DatasetError, match="env option task_id"):
        catalog.load_dataset("hopper", "medium", 10, options={"task_id": 2}, cache_dir=tmp_path, progress=False)
