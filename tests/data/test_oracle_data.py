"""Oracle datasets (OGBench's recipe): labels agree with the env, task data succeeds, files carry
sub-goals, instructions and images, and bad requests fail before any work."""
import h5py
import numpy as np
import pytest

from embodied.data import catalog, ogbench_gen
from embodied.data.d4rl import load_extras, load_hdf5
from embodied.data.ogbench_gen import GenSpec, check_spec, generate
from embodied.data.ogbench_oracles import lights_out_presses
from embodied.errors import DatasetError
from sims.manip_scene import task_truths

pytestmark = [pytest.mark.filterwarnings("ignore:.*precision lowered"),
              pytest.mark.filterwarnings("ignore:.*Box observation space m")]


@pytest.fixture(scope="module")
def task_data():
    return generate(GenSpec("cube-single", "task", size=400, seed=0), progress=False)


@pytest.mark.slow
def test_task_data_is_solved_by_the_oracle(task_data):
    ds, extras = task_data
    meta = ds.metadata
    complete = int(ds.terminals.sum() + ds.timeouts[:-1].sum())  # the last episode is cut by the size
    assert meta["success_episodes"] >= 0.9 * complete and meta["success_episodes"] >= 4
    assert set(np.unique(ds.rewards)) <= {-1.0, 0.0}
    subgoals = extras["infos/subgoals"]
    np.testing.assert_array_equal(ds.rewards, subgoals.sum(1) - subgoals.shape[1])
    np.testing.assert_array_equal(ds.terminals, subgoals.all(1))  # the episode ends exactly at success
    assert meta["subgoal_names"] == ["at(cube_0,target_0)"]
    ids = extras["infos/instruction_id"]
    assert ids.min() == 0 and ids.max() == len(meta["instructions"]) - 1
    assert all("red cube" in text for text in meta["instructions"])
    assert len(set(meta["instructions"])) >= 2  # paraphrase variety across episodes
    np.testing.assert_array_equal(ds.observations[1:][~(ds.terminals | ds.timeouts)[:-1]],
                                  ds.next_observations[:-1][~(ds.terminals | ds.timeouts)[:-1]])


@pytest.mark.slow
def test_play_data_relabels_like_the_single_task_env():
    ds, extras = generate(GenSpec("cube-single", "play", size=120, seed=1, episode_steps=60), progress=False)
    assert len(ds) == 120 and ds.timeouts.sum() == 2 and ds.metadata["episodes"] == 2
    np.testing.assert_array_equal(ds.rewards, extras["infos/subgoals"].sum(1) - 1)
    assert extras["infos/qpos"].shape == (120, 21)
    # the relabelling criterion equals OGBench's own success test in the task env
    import sims

    env = sims.make("cube-single", seed=0)
    env.reset(seed=0)
    base = env.unwrapped
    for _ in range(3):
        env.step(env.action_space.sample())
        np.testing.assert_array_equal(task_truths(base, "cube", base.cur_task_info),
                                      env.get_wrapper_attr("subgoal_truths")())
    env.close()


def test_lights_out_solver():
    rng = np.random.default_rng(0)
    for rows, cols in ((3, 3), (4, 4)):
        for _ in range(20):
            cur, tgt = rng.integers(0, 2, rows * cols), rng.integers(0, 2, rows * cols)
            try:
                presses = lights_out_presses(cur, tgt, rows, cols)
            except DatasetError:
                assert (rows, cols) == (4, 4)  # 4x4 Lights Out has unreachable states; 3x3 has none
                continue
            state = cur.copy()
            for i in presses:
                r, c = divmod(i, cols)
                for dr, dc in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
                    if 0 <= r + dr < rows and 0 <= c + dc < cols:
                        state[(r + dr) * cols + c + dc] ^= 1
            np.testing.assert_array_equal(state, tgt)


@pytest.mark.parametrize("bad, match", [
    (dict(size=-5), "positive integer"),
    (dict(quality="expert"), "play, noisy, task"),
    (dict(env="hopper"), "cube-single"),
    (dict(env="cube-single-goal"), "cube-single"),
    (dict(seed=-1), "non-negative"),
    (dict(images=("top",)), "front"),
    (dict(task_id=6), "1..5"),
    (dict(p_random_action=1.5), "probability"),
])
def test_impossible_specs_fail_before_any_work(bad, match, monkeypatch):
    import sims.manip

    def boom(*args, **kwargs):
        raise AssertionError("an env was built for a request that should have been rejected")

    monkeypatch.setattr(sims.manip, "make_base", boom)
    monkeypatch.setattr(ogbench_gen, "_generate_task", boom)
    monkeypatch.setattr(ogbench_gen, "_generate_play", boom)
    spec = dict(env="cube-single", quality="play", size=100, seed=0) | bad
    with pytest.raises(DatasetError, match=match):
        generate(GenSpec(**spec))
    if "env" not in bad and "images" not in bad and "task_id" not in bad and "p_random_action" not in bad:
        with pytest.raises(DatasetError, match=match):
            catalog.check_request(spec["env"], spec["quality"], spec["size"], spec["seed"])


def test_defaults_follow_ogbench():
    play = check_spec(GenSpec("cube-double", "play"))
    assert play.size == 1000 * 1001 and play.noise == 0.1 and play.episode_steps == 1001 and play.task_id == 2
    noisy = check_spec(GenSpec("puzzle-3x3", "noisy"))
    assert noisy.p_random_action == 0.2 and noisy.task_id == 4
    assert check_spec(GenSpec("scene", "noisy")).p_random_action == 0.1


@pytest.mark.slow
def test_catalog_caches_and_files_carry_extras(tmp_path, monkeypatch):
    ds = catalog.load_dataset("cube-single", "task", 60, seed=2, cache_dir=tmp_path, progress=False)
    path = catalog.dataset_path("cube-single", "task", 60, 2, tmp_path)
    assert path.is_file() and len(ds) == 60
    monkeypatch.setattr(ogbench_gen, "generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("regenerated")))
    again = catalog.load_dataset("cube-single", "task", 60, seed=2, cache_dir=tmp_path, progress=False)
    np.testing.assert_array_equal(again.observations, ds.observations)
    extras = load_extras(path)
    assert extras["infos/subgoals"].shape == (60, 1) and "infos/instruction_id" in extras
    assert load_hdf5(path).metadata["instructions"]


@pytest.mark.slow
def test_images_are_chunked_and_compressed(tmp_path):
    from embodied.data.d4rl import save_hdf5

    ds, extras = generate(GenSpec("cube-single", "task", size=12, seed=0, images=("front",), image_size=32),
                          progress=False)
    frames = extras["images/front"]
    assert frames.shape == (12, 32, 32, 3) and frames.dtype == np.uint8 and frames.std() > 0
    path = save_hdf5(ds, tmp_path / "img.hdf5", extras=extras)
    with h5py.File(path) as f:
        assert f["images/front"].chunks[1:] == (32, 32, 3) and f["images/front"].compression == "gzip"
    np.testing.assert_array_equal(load_extras(path, ["images/front"])["images/front"], frames)
    assert len(load_hdf5(path)) == 12  # D4RL readers are unaffected by the extra groups
