"""A VLA on the arm: the task-scene sim arm (OGBench's cube-single model, its front camera rendered in the
arm's own process), images and the instruction over the real policy server on 127.0.0.1, size limits on
image messages, the OGBench action map, and the recorded episode (HDF5 frames and a LeRobotDataset)."""
from __future__ import annotations

import threading
import time

import h5py
import numpy as np
import pytest

import policies
import robots
from embodied.errors import ConfigError
from policies.vla import hash_text_encoder
from robots.client import PolicyClient
from robots.deploy import check_policy_spec, run
from robots.server import ActionMap, PolicyServer
from robots.types import RobotConfig
from tests.robots.test_deploy import compose_deploy

FRONT = "observation.images.front"
SMALL = dict(dim=32, depth=1, num_heads=2, channels=[8, 16, 16], pool=2, chunk=4)


def tiny_vla(**kw):
    import torch

    torch.manual_seed(0)
    return policies.make("vla", obs_dim=28, act_dim=5, cameras=["front"], image_size=64,
                         text_encoder=hash_text_encoder(), **{**SMALL, **kw})


@pytest.fixture()
def vla_server():
    srv = PolicyServer(tiny_vla(), action_map=ActionMap("ogbench", dof=6, mode="ee_delta"))
    thread = threading.Thread(target=srv.serve, daemon=True)
    thread.start()
    yield srv
    srv.stop()
    thread.join(timeout=2)
    srv.close()


def vla_obs(frame=None, task="move the red cube to the left of the table"):
    obs = {"observation.state": np.zeros(28, np.float32), "joint_pos_rad": np.zeros(6, np.float32),
           FRONT: np.zeros((64, 64, 3), np.uint8) if frame is None else frame, "timestamp_s": time.monotonic()}
    if task is not None:
        obs["task"] = task
    return obs


def test_ogbench_action_map_reads_its_actions_as_end_effector_deltas():
    am = ActionMap("ogbench", dof=6, mode="ee_delta")
    out = am(np.array([[1.0, -0.5, 0.2, 1.0, 1.0], [0.0, 0.0, 0.0, -1.0, -1.0]]), {})
    assert out.shape == (2, 7) and am.in_dim == 5
    assert np.allclose(out[0, :3], [0.05, -0.025, 0.01]) and np.allclose(out[:, 3:5], 0)  # 5 cm per unit
    assert np.allclose(out[:, 5], [0.3, -0.3])                   # yaw, 0.3 rad per unit
    assert out[0, 6] == 0.0 and np.isclose(out[1, 6], 0.085)     # +1 closes the gripper, -1 opens it
    with pytest.raises(ConfigError, match="ee_delta"):
        ActionMap("ogbench", dof=6, mode="joint_position")


@pytest.mark.slow  # a few seconds on 2 cores
def test_images_and_the_instruction_reach_the_policy_and_bad_frames_are_named(vla_server):
    client = PolicyClient(vla_server.address)
    spec = client.spec()
    assert spec["cameras"] == ["front"] and spec["image_shape"] == [64, 64, 3] and FRONT in spec["required_obs"]
    a = client.infer(vla_obs(), obs_step=1).chunk
    b = client.infer(vla_obs(np.full((64, 64, 3), 200, np.uint8)), obs_step=2).chunk
    c = client.infer(vla_obs(task="pick up the cube"), obs_step=3).chunk
    assert a.shape == (4, 7) and not np.allclose(a, b) and not np.allclose(a, c)  # the frame and the words count
    for frame, pattern in ((np.zeros((32, 32, 3), np.uint8), r"observation\.images\.front.*shape \[32, 32, 3\]"),
                           (np.zeros((64, 64, 3), np.float32), r"observation\.images\.front.*dtype float32")):
        with pytest.raises(Exception, match=pattern):
            client.infer(vla_obs(frame), obs_step=4, timeout_ms=3000)
    missing = vla_obs()
    del missing[FRONT]
    client.request({k: v for k, v in missing.items()}, 5)  # the client sends only what obs has
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and "missing" not in (client.last_error or ""):
        client.poll(50)
    assert "observation.images.front" in client.last_error and "missing" in client.last_error
    with pytest.raises(Exception, match="at most 1000 printable"):
        client.infer(vla_obs(task="x" * 1001), obs_step=6, timeout_ms=3000)
    client.close()


@pytest.mark.slow  # a few seconds on 2 cores
def test_an_oversized_image_message_is_refused_and_the_server_stays_up(vla_server):
    client = PolicyClient(vla_server.address)
    client.spec()
    with pytest.raises(Exception, match="oversized.*over the 1048576-byte limit"):
        client.infer(vla_obs(np.zeros((1024, 1024, 3), np.uint8)), obs_step=1, timeout_ms=5000)
    assert vla_server.stats["oversized"] == 1
    assert client.infer(vla_obs(), obs_step=2).chunk.shape == (4, 7)  # still serving
    client.close()


def test_a_camera_policy_is_refused_on_an_arm_without_its_camera_before_arming(vla_server):
    client = PolicyClient(vla_server.address)
    bare = RobotConfig.from_dict({k: v for k, v in robots.load_config("sim_ur5e").items() if k != "type"})
    with pytest.raises(ConfigError, match=r"camera\(s\) \['front'\].*no cameras"):
        check_policy_spec(client, bare, "vla")
    scene = robots.load_config("sim_ur5e_cube")
    scene["sim"]["scene"]["image_size"] = 96
    with pytest.raises(ConfigError, match="image_size=64"):
        check_policy_spec(client, RobotConfig.from_dict({k: v for k, v in scene.items() if k != "type"}), "vla")
    client.close()


@pytest.mark.slow
def test_the_scene_arm_renders_its_camera_and_resets_its_task():
    with robots.make("sim_ur5e_cube") as arm:
        obs = arm.observe()
        assert obs["observation.state"].shape == (28,) and obs[FRONT].shape == (64, 64, 3)
        assert obs[FRONT].dtype == np.uint8 and obs[FRONT].std() > 5 and obs["success"] is False
        assert "cube" in arm.scene_instruction()
        arm.arm()
        start = arm.observe()["ee_pos_m"].copy()
        for _ in range(10):
            arm.send_action(np.array([0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.085]))  # up 3 cm a step
        moved = arm.observe()
        assert moved["ee_pos_m"][2] > start[2] + 0.05            # OGBench's controller executed the deltas
        assert not np.array_equal(moved[FRONT], obs[FRONT])      # and the camera saw it
        arm.reset_scene(5)
        again = arm.observe()
        assert arm.state.value == "connected" and not np.allclose(again["observation.state"], moved["observation.state"])


@pytest.mark.slow
def test_deploy_a_vla_on_the_scene_arm_with_images_over_the_policy_server(tmp_path):
    policy_dir = tmp_path / "vla"
    tiny_vla().save(policy_dir)
    cfg = compose_deploy(["robot=sim_ur5e_cube", f"policy={policy_dir}", "episode_s=1.5", "episodes=2",
                          "executor.execute_horizon=3", "task=put the red cube on the left"])
    summary = run(cfg, tmp_path / "out")
    assert summary["status"] == "ok", summary["status"]
    assert summary["task"] == "put the red cube on the left" and len(summary["success"]) == 2
    assert summary["actions_sent"] > 20 and summary["client"]["errors"] == 0
    with h5py.File(summary["dataset"]) as f:
        n = len(f["actions"])
        assert f["images/front"].shape == (n, 64, 64, 3) and f["images/front"].dtype == np.uint8
        assert f["observations"].shape[1] == 28 and f["infos/policy_action"].shape == (n, 7)
    from embodied.data.lerobot import load_lerobot

    data = load_lerobot(summary["lerobot_dataset"], images=True)
    assert data.dataset.num_episodes == 2 and data.tasks == ["put the red cube on the left"] * 2
    (frames,) = data.images.values()
    assert len(frames) == 2 and frames[0].shape[1:] == (64, 64, 3) and frames[0].dtype == np.uint8
