"""Chunk executors: index = step - obs_step, late chunks dropped, ensembling and blending weights."""
import numpy as np
import pytest

from embodied.errors import UserError
from policies import executors
from policies.executors import BlendingExecutor, ChunkExecutor, OpenLoopExecutor, TemporalEnsembleExecutor


def ramp(obs_step: int, horizon: int = 6, act_dim: int = 2, offset: float = 0.0) -> np.ndarray:
    """Row i holds the value obs_step + i (+ offset): the step it is meant for."""
    values = np.arange(obs_step, obs_step + horizon, dtype=np.float32) + offset
    return np.repeat(values[:, None], act_dim, axis=1)


def test_make_and_protocol():
    for name in executors.names():
        kw = {"open_loop": {"execute_horizon": 4}, "blend": {"blend_steps": 2}}.get(name, {})
        assert isinstance(executors.make(name, **kw), ChunkExecutor)
    with pytest.raises(UserError, match="valid: blend, open_loop, temporal_ensemble"):
        executors.make("nope")
    with pytest.raises(UserError):
        executors.make("open_loop", execute_horizon=0)
    with pytest.raises(UserError, match=r"\[H, A\]"):
        OpenLoopExecutor(2).push(np.zeros((1, 2, 3)), 0)


def test_open_loop_runs_first_k_actions_then_requests():
    ex = OpenLoopExecutor(execute_horizon=3)
    requests, served = [], []
    for step in range(9):
        if ex.wants_chunk(step):
            requests.append(step)
            assert ex.push(ramp(step), step)
        served.append(ex.next_action(step)[0])
    assert requests == [0, 3, 6]
    np.testing.assert_array_equal(served, np.arange(9))  # every action was meant for its step
    assert ex.last_delay_steps == 0


def test_open_loop_delay_is_counted_in_actions_consumed():
    ex = OpenLoopExecutor(execute_horizon=4)
    assert ex.wants_chunk(0) and ex.push(ramp(0), 0)
    for step in range(4):
        ex.next_action(step)
    assert ex.wants_chunk(4)
    # the chunk for the observation of step 4 arrives only at step 6: rows 0, 1 are in the past
    assert ex.next_action(4)[0] == 4 and ex.next_action(5)[0] == 5  # old chunk keeps serving
    assert ex.push(ramp(4, offset=100.0), 4)
    action = ex.next_action(6)
    assert action[0] == 106.0 and ex.last_delay_steps == 2
    assert not ex.wants_chunk(7) and ex.wants_chunk(8)  # cadence counts from the observation step


def test_late_and_out_of_order_chunks_are_dropped():
    ex = OpenLoopExecutor(execute_horizon=2)
    ex.push(ramp(10, horizon=4), 10)
    for step in range(10, 14):
        ex.next_action(step)
    assert not ex.push(ramp(8, horizon=4), 8)       # rows cover 8..11, all served already
    assert ex.dropped == 1
    assert ex.next_action(14) is None               # chunk exhausted: nothing to execute
    assert ex.push(ramp(12, horizon=4), 12)         # rows 14, 15 still ahead
    assert ex.next_action(14)[0] == 14
    assert not ex.push(ramp(11, horizon=8), 11)     # older than the chunk in use
    ex.reset()
    assert ex.next_action(0) is None and ex.wants_chunk(0)


def test_temporal_ensemble_matches_act_weights():
    w = 0.5
    ex = TemporalEnsembleExecutor(weight=w)
    chunks = {s: ramp(s, horizon=4, act_dim=1, offset=10.0 * s) for s in range(6)}
    for step in range(6):
        assert ex.wants_chunk(step)
        ex.push(chunks[step], step)
        got = ex.next_action(step)[0]
        covering = [s for s in range(step + 1) if s + 4 > step]  # oldest first
        weights = np.exp(-w * np.arange(len(covering)))
        values = np.array([chunks[s][step - s, 0] for s in covering])
        assert got == pytest.approx(float((weights * values).sum() / weights.sum()), rel=1e-6)
    assert len(ex._chunks) <= 4  # chunks that no longer cover a future step are forgotten


def test_temporal_ensemble_single_chunk_is_identity():
    ex = TemporalEnsembleExecutor()
    ex.push(ramp(0), 0)
    np.testing.assert_allclose(ex.next_action(2), ramp(0)[2])


def test_blending_cross_fades_linearly():
    ex = BlendingExecutor(blend_steps=3, execute_horizon=4)
    old = np.zeros((8, 1), np.float32)
    new = np.ones((8, 1), np.float32)
    ex.push(old, 0)
    assert [ex.next_action(s)[0] for s in range(4)] == [0, 0, 0, 0]
    ex.push(new, 4)
    got = [float(ex.next_action(s)[0]) for s in range(4, 9)]
    np.testing.assert_allclose(got, [0.25, 0.5, 0.75, 1.0, 1.0])
    # without an overlapping old chunk the new one is used as is
    ex2 = BlendingExecutor(blend_steps=3)
    ex2.push(new, 0)
    assert ex2.next_action(0)[0] == 1.0


def test_single_step_actions_are_chunks_of_one():
    ex = OpenLoopExecutor(1)
    for step in range(3):
        assert ex.wants_chunk(step)
        ex.push(np.full(2, step, np.float32), step)
        assert ex.next_action(step)[0] == step
