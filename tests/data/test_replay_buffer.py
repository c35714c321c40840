import numpy as np
import pytest

from embodied.data.dataset import Dataset
from embodied.data.replay import MixedReplay, ReplayBuffer
from embodied.errors import CheckpointError, ConfigError

from data_helpers import make_episodes

OBS, ACT = 3, 2


class Reference:
    """Every transition ever added, in order, with the episode it belongs to (the brute-force model)."""

    def __init__(self):
        self.obs, self.next_obs, self.actions, self.rewards = [], [], [], []
        self.terminal, self.timeout, self.end, self.episode = [], [], [], []
        self.episode_counter, self.open = 0, False

    def add(self, t, terminal, timeout, buf):
        obs, nxt = np.full(OBS, t, np.float32), np.full(OBS, t + 0.5, np.float32)
        buf.add(obs, np.full(ACT, t / 100), float(t), nxt, terminal, timeout)
        self._record(obs, nxt, np.full(ACT, t / 100, np.float32), float(t), terminal, timeout, terminal or timeout)

    def add_dataset(self, ds, buf):
        buf.add_dataset(ds)
        if self.open:
            self.episode_counter += 1
            self.open = False
        for i, end in enumerate(ds.episode_ends()):
            self._record(ds.observations[i], ds.next_observations[i], ds.actions[i], ds.rewards[i],
                         ds.terminals[i], ds.timeouts[i], end)

    def _record(self, obs, nxt, action, reward, terminal, timeout, end):
        for name, value in zip(("obs", "next_obs", "actions", "rewards", "terminal", "timeout", "end", "episode"),
                               (obs, nxt, action, reward, terminal, timeout, end, self.episode_counter)):
            getattr(self, name).append(value)
        if end:
            self.episode_counter += 1
        self.open = not end

    def chunk(self, t, horizon):
        """valid mask and the (padded) source step of every chunk position, by brute force."""
        total = len(self.rewards)
        valid = [True]
        for i in range(1, horizon):
            ok = (valid[-1] and not self.end[t + i - 1] and t + i < total
                  and self.episode[t + i] == self.episode[t + i - 1])
            valid.append(ok)
        last = sum(valid) - 1
        return np.array(valid), [t + min(i, last) for i in range(horizon)]


def absolute_index(slot, total, capacity):
    return slot if total <= capacity else total - 1 - ((total - 1 - slot) % capacity)


def check_all_chunks(buf, ref, horizon):
    total = len(ref.rewards)
    slots = np.arange(len(buf))
    batch = buf.chunks_at(slots, horizon)
    for slot in slots:
        t = absolute_index(slot, total, buf.capacity)
        valid, src = ref.chunk(t, horizon)
        np.testing.assert_array_equal(batch["valid"][slot], valid.astype(np.float32), err_msg=f"slot {slot} step {t}")
        np.testing.assert_array_equal(batch["observations"][slot], ref.obs[t])
        np.testing.assert_array_equal(batch["actions"][slot], np.array([ref.actions[s] for s in src]))
        np.testing.assert_array_equal(batch["next_observations"][slot], np.array([ref.next_obs[s] for s in src]))
        np.testing.assert_array_equal(batch["rewards"][slot], np.array([ref.rewards[s] for s in src]) * valid)
        np.testing.assert_array_equal(batch["terminals"][slot], [float(ref.terminal[s]) for s in src])
        np.testing.assert_array_equal(batch["timeouts"][slot], [float(ref.timeout[s]) for s in src])


def toy_dataset(start):
    return Dataset.from_episodes(make_episodes([3, 2], ["terminal", "timeout"], OBS, ACT, start=start))


@pytest.mark.parametrize("capacity", [5, 7, pytest.param(64, marks=pytest.mark.slow)])
def test_chunk_valid_masks_match_brute_force(capacity):
    rng = np.random.default_rng(capacity)
    buf, ref = ReplayBuffer(OBS, ACT, capacity, seed=0), Reference()
    t = 0
    for step in range(120):
        if step % 37 == 20:  # offline data arriving while an online episode is open
            ref.add_dataset(toy_dataset(1000 + step), buf)
        elif 60 <= step < 75:  # one episode longer than the ring: the head meets its own tail
            ref.add(t, False, False, buf)
            t += 1
        else:
            u = rng.random()
            ref.add(t, u < 0.15, 0.15 <= u < 0.25, buf)
            t += 1
        check_all_chunks(buf, ref, horizon=4)
    assert len(buf) == min(capacity, len(ref.rewards))


def test_open_episode_and_write_head():
    buf, ref = ReplayBuffer(OBS, ACT, 4), Reference()
    for t in range(6):  # one open episode of 6 steps in a ring of 4: slots hold steps 4, 5, 2, 3
        ref.add(t, False, False, buf)
    batch = buf.chunks_at(np.arange(4), 3)
    # step 2 -> 3 -> 4 continue; step 5 is the newest: nothing after it; step 3 -> 4 -> 5
    np.testing.assert_array_equal(batch["valid"], [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    check_all_chunks(buf, ref, 3)


def test_chunks_stop_at_terminal_and_timeout():
    buf = ReplayBuffer(OBS, ACT, 16)
    buf.add_dataset(toy_dataset(0))  # episode A: 3 steps ending terminal; B: 2 steps ending timeout
    batch = buf.chunks_at(np.array([0, 1, 2, 3, 4]), 3)
    np.testing.assert_array_equal(batch["valid"], [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
    np.testing.assert_array_equal(batch["terminals"][:, -1], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch["timeouts"][:, -1], [0, 0, 0, 1, 1])


def test_n_step_targets_from_chunks_match_hand_computation():
    gamma, n = 0.9, 3
    buf, ref = ReplayBuffer(OBS, ACT, 10), Reference()
    rng = np.random.default_rng(0)
    for t in range(23):
        u = rng.random()
        ref.add(t, u < 0.2, 0.2 <= u < 0.3, buf)

    def q(state):
        return state.sum(axis=-1)

    batch = buf.sample_chunks(64, n)
    valid = batch["valid"]
    target = (batch["rewards"] * gamma ** np.arange(n)).sum(1) + gamma ** valid.sum(1) * (
        1 - batch["terminals"][:, -1]) * q(batch["next_observations"][:, -1])
    for row in range(64):
        t = int(batch["observations"][row, 0])  # online observations encode their step
        expected, discount, k = 0.0, 1.0, t
        while True:  # hand n-step return: stop at an end, after n steps, or at the newest step
            expected += discount * ref.rewards[k]
            discount *= gamma
            if ref.terminal[k]:
                break
            if ref.timeout[k] or k - t + 1 == n or k + 1 == len(ref.rewards):
                expected += discount * q(ref.next_obs[k])
                break
            k += 1
        np.testing.assert_allclose(target[row], expected, rtol=1e-5)


def test_sample_shapes_and_mc_returns():
    buf = ReplayBuffer(OBS, ACT, 32)
    ds = toy_dataset(0)
    buf.add_dataset(ds, mc_returns=ds.mc_returns(0.99))
    buf.add(np.zeros(OBS), np.zeros(ACT), 0.0, np.zeros(OBS), False, False)
    batch = buf.sample(8)
    assert {k: v.shape for k, v in batch.items()} == {
        "observations": (8, OBS), "actions": (8, ACT), "rewards": (8,), "next_observations": (8, OBS),
        "terminals": (8,), "timeouts": (8,), "mc_returns": (8,)}
    assert all(v.dtype == np.float32 for v in batch.values())
    chunks = buf.sample_chunks(8, 4)
    assert {k: v.shape for k, v in chunks.items()} == {
        "observations": (8, OBS), "actions": (8, 4, ACT), "rewards": (8, 4), "next_observations": (8, 4, OBS),
        "terminals": (8, 4), "timeouts": (8, 4), "valid": (8, 4), "mc_returns": (8,)}
    assert (chunks["valid"][:, 0] == 1).all()
    assert np.isnan(buf.mc_returns[len(ds)])  # the online step has no MC return
    assert "mc_returns" not in filled(0.0).sample(2)


def test_dataset_larger_than_capacity_keeps_newest_rows():
    buf = ReplayBuffer(OBS, ACT, 4)
    ds = toy_dataset(0)  # 5 rows
    buf.add_dataset(ds)
    assert len(buf) == 4 and buf.ptr == 1
    np.testing.assert_array_equal(buf.rewards, ds.rewards[[4, 1, 2, 3]])


def filled(value, capacity=50, seed=0):
    buf = ReplayBuffer(OBS, ACT, capacity, seed=seed)
    for t in range(capacity):
        buf.add(np.zeros(OBS), np.zeros(ACT), value, np.zeros(OBS), False, t % 10 == 9)
    return buf


@pytest.mark.parametrize("ratio,batch,expected_offline", [(0.5, 10, 5), (0.3, 256, 77), (0.0, 9, 0), (1.0, 9, 9)])
def test_mixing_ratio(ratio, batch, expected_offline):
    mixed = MixedReplay(filled(1.0), filled(0.0), offline_ratio=ratio, seed=1)
    assert mixed.sample(batch)["rewards"].sum() == expected_offline
    chunks = mixed.sample_chunks(batch, 3)
    assert chunks["actions"].shape == (batch, 3, ACT)
    assert chunks["rewards"][:, 0].sum() == expected_offline


def test_mixing_edge_cases():
    online = filled(0.0)
    assert len(MixedReplay(None, online, 0.0).sample(4)["rewards"]) == 4
    with pytest.raises(ConfigError, match="offline_ratio=0.5 needs offline data"):
        MixedReplay(None, online, 0.5)
    with pytest.raises(ConfigError, match=r"within \[0, 1\]"):
        MixedReplay(filled(1.0), online, 1.5)
    with pytest.raises(ValueError, match="online buffer is empty"):
        MixedReplay(filled(1.0), ReplayBuffer(OBS, ACT, 4), 0.5).sample(4)
    assert MixedReplay(filled(1.0), ReplayBuffer(OBS, ACT, 4), 1.0).sample(4)["rewards"].sum() == 4
    with pytest.raises(ValueError, match="offline buffer is empty"):
        MixedReplay(ReplayBuffer(OBS, ACT, 4), online, 0.5).sample_chunks(4, 2)
    offline = ReplayBuffer(OBS, ACT, 8)
    offline.add_dataset(toy_dataset(0), mc_returns=np.arange(5, dtype=np.float32))
    batch = MixedReplay(offline, online, 0.5).sample(6)
    assert np.isfinite(batch["mc_returns"][:3]).all() and np.isnan(batch["mc_returns"][3:]).all()


def test_state_dict_round_trip(tmp_path):
    buf = filled(2.0, capacity=20, seed=3)
    for t in range(7):  # wrap the ring and leave an open episode
        buf.add(np.full(OBS, t), np.zeros(ACT), t, np.full(OBS, t + 1), False, False, mc_return=1.0)
    np.savez(tmp_path / "replay.npz", **buf.state_dict())
    with np.load(tmp_path / "replay.npz", allow_pickle=False) as f:
        state = dict(f)
    again = ReplayBuffer(OBS, ACT, 20, seed=99)
    again.load_state_dict(state)
    for key in ("observations", "rewards", "terminals", "episode_ids", "mc_returns"):
        np.testing.assert_array_equal(getattr(again, key), getattr(buf, key))
    assert (again.ptr, again.size, again.episode_open, again.has_mc_returns) == (buf.ptr, buf.size, True, True)
    a, b = buf.sample_chunks(16, 3), again.sample_chunks(16, 3)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])  # same sampler state: same batches
    with pytest.raises(CheckpointError, match="capacity"):
        ReplayBuffer(OBS, ACT, 21).load_state_dict(state)

    mixed = MixedReplay(filled(1.0), buf, 0.5, seed=0)
    np.savez(tmp_path / "mixed.npz", **mixed.state_dict())
    restored = MixedReplay(ReplayBuffer(OBS, ACT, 50), ReplayBuffer(OBS, ACT, 20), 0.0)
    with np.load(tmp_path / "mixed.npz", allow_pickle=False) as f:
        restored.load_state_dict(dict(f))
    assert restored.offline_ratio == 0.5 and len(restored) == len(mixed)
    np.testing.assert_array_equal(restored.sample(32)["rewards"], mixed.sample(32)["rewards"])
