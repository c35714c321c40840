"""The evaluator's cache of slow-to-build manipulation envs stays bounded: every variation and task of
a suite is its own kind of env (~100 MB each), so an unbounded cache grew past 11 GB in one eval-sets run."""
from __future__ import annotations

import pytest

from embodied import evaluation

pytestmark = pytest.mark.slow  # builds manipulation envs: seconds each on 2 cores


def test_the_env_cache_closes_the_least_recently_used_kinds_beyond_its_bound(monkeypatch):
    monkeypatch.setattr(evaluation, "_ENV_CACHE", type(evaluation._ENV_CACHE)())
    monkeypatch.setattr(evaluation, "ENV_CACHE_MAX", 2)
    first = evaluation.eval_envs("cube-single", 2, {"task_id": 1})
    assert evaluation.eval_envs("cube-single", 2, {"task_id": 1}) == first          # reused, not rebuilt
    closed = []
    for env in first:
        real_close = env.close
        monkeypatch.setattr(env, "close", lambda real_close=real_close, env=env: (closed.append(env), real_close()))
    second = evaluation.eval_envs("cube-single", 2, {"task_id": 2})
    assert list(evaluation._ENV_CACHE) == [("cube-single", repr(sorted({"task_id": 2}.items())))]
    assert closed == first                                                       # evicted envs are closed
    assert sum(len(v) for v in evaluation._ENV_CACHE.values()) == 2 and second[0].reset(seed=0)[0] is not None
    third = evaluation.eval_envs("cube-single", 3, {"task_id": 3})     # a wave wider than the bound still runs
    assert len(third) == 3 and list(evaluation._ENV_CACHE)[-1][1] == repr(sorted({"task_id": 3}.items()))
    for envs in evaluation._ENV_CACHE.values():
        for env in envs:
            env.close()


def test_a_vla_evaluation_renders_only_the_frames_its_policy_reads(monkeypatch):
    """Mid-chunk frames are skipped (`sims.skip_next_frames`); every chunk call still gets its frames, and the
    episodes are step for step those of an evaluation that renders everything."""
    import numpy as np

    import sims
    from embodied.constants import STATE_KEY, image_key

    def run(skip: bool):
        if not skip:
            monkeypatch.setattr(sims, "skip_next_frames", lambda env: None)
        calls = []

        def chunk_policy(obs):
            calls.append(obs[image_key("front")].shape)   # a missing frame would raise KeyError here
            rng = np.random.default_rng(int(1000 * obs[STATE_KEY][0, 0]) % 2**32)
            return rng.uniform(-1, 1, (len(obs[STATE_KEY]), 3, 5)).astype(np.float32)

        result = evaluation.evaluate("cube-single", None, 2, seed=5, chunk_policy=chunk_policy, execute_horizon=3,
                                     full_obs=True, env_kwargs=dict(images=("front",), image_size=32,
                                                                    max_episode_steps=10))
        monkeypatch.undo()
        return result, calls

    skipped, calls = run(skip=True)
    rendered, all_calls = run(skip=False)
    assert len(calls) == len(all_calls) == 4 and all(shape == (2, 32, 32, 3) for shape in calls)   # steps 0, 3, 6, 9
    np.testing.assert_array_equal(skipped.states, rendered.states)
    np.testing.assert_array_equal(skipped.returns, rendered.returns)


def test_a_vla_video_renders_only_the_frames_its_policy_reads(monkeypatch, tmp_path):
    """record_video skips mid-chunk camera frames for a policy that says when it wants its next chunk
    (`dict_step_policy`, VLARunner's video policy); it still gets frames at every chunk, and acts as with all."""
    import numpy as np

    import sims
    from embodied.constants import STATE_KEY, image_key
    real_skip = sims.skip_next_frames

    def run(skip: bool):
        skips, calls, actions = [], [], []
        monkeypatch.setattr(sims, "skip_next_frames", lambda env: (skips.append(1), skip and real_skip(env)))

        def chunk_fn(obs):
            calls.append(obs[image_key("front")].shape)   # a skipped frame here would raise KeyError
            rng = np.random.default_rng(int(1000 * abs(obs[STATE_KEY][0, 0])) % 2**32)
            return rng.uniform(-1, 1, (1, 3, 5)).astype(np.float32)
        step_policy = evaluation.dict_step_policy(chunk_fn, execute_horizon=3)   # what VLARunner._task_policy is

        def policy(obs):
            actions.append(step_policy(obs)[0])
            return actions[-1][None]
        policy.wants_chunk_next = step_policy.wants_chunk_next
        path = evaluation.record_video("cube-single", policy, tmp_path / f"skip{skip}.mp4", episodes=1, seed=3,
                                       size=32, max_steps=10, full_obs=True,
                                       env_kwargs=dict(task_id=1, images=("front",), image_size=32))
        monkeypatch.undo()
        assert path is not None and path.stat().st_size > 0
        return skips, calls, np.stack(actions)

    skips, calls, actions = run(skip=True)
    _, all_calls, all_actions = run(skip=False)
    assert len(calls) == len(all_calls) == 4 and all(shape == (1, 32, 32, 3) for shape in calls)   # steps 0, 3, 6, 9
    assert len(skips) == 7                # the frames of steps 1, 2, 4, 5, 7, 8 and 10 (after the last): nobody reads them
    np.testing.assert_array_equal(actions, all_actions)
