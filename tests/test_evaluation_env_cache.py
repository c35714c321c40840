"""The evaluator's cache of slow-to-build manipulation envs stays bounded: every variation and task of
a suite is its own kind of env (~100 MB each), so an unbounded cache grew past 11 GB in one eval-sets run."""
from __future__ import annotations

from embodied import evaluation


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
