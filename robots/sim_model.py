"""The simulated arm's model: the UR5e + Robotiq 2F-85 from the `ogbench` package's MJCF assets, and
the kinematics around it (`ArmModel.fk`, `ArmModel.ik`) that the sim server, the sim arm client and the
UR driver's optional FK use.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

UR5E_HOME_RAD = [-1.5708, -1.5708, 1.5708, -1.5708, -1.5708, 0.0]
GRIPPER_OPEN_M = 0.085          # Robotiq 2F-85 stroke
PAD_OFFSET_M = 0.0133           # pad-centre distance minus finger gap (measured on the model)


def build_model():
    """UR5e with a Robotiq 2F-85 on its flange, from ogbench's MJCF files (as ogbench assembles them)."""
    import mujoco
    import ogbench.manipspace as manipspace
    from dm_control import mjcf
    from ogbench.manipspace import mjcf_utils

    desc = Path(manipspace.__file__).parent / "descriptions"
    arena = mjcf.RootElement()
    arena.model = "arena"
    arena.option.timestep = 0.002
    arena.option.integrator = "implicitfast"
    arm = mjcf.from_path(str(desc / "universal_robots_ur5e" / "ur5e.xml"), escape_separators=True)
    arm.model = "ur5e"
    for light in arm.find_all("light"):
        light.remove()
    gripper = mjcf.from_path(str(desc / "robotiq_2f85" / "2f85.xml"), escape_separators=True)
    gripper.model = "robotiq"
    mjcf_utils.attach(arm, gripper, "attachment_site")
    mjcf_utils.attach(arena, arm)
    return mujoco.MjModel.from_xml_string(mjcf_utils.to_string(arena), mjcf_utils.get_assets(arena))


class ArmModel:
    """Indices and kinematics helpers around the compiled model."""

    def __init__(self, model=None):
        import mujoco

        self.mj = mujoco
        self.model = model if model is not None else build_model()
        self.data = mujoco.MjData(self.model)
        self._ik_data = mujoco.MjData(self.model)
        self.dof = 6
        self.site = self.model.site("ur5e/robotiq/pinch").id
        self.left = self.model.body("ur5e/robotiq/left_pad").id
        self.right = self.model.body("ur5e/robotiq/right_pad").id
        self.joint_range = self.model.jnt_range[: self.dof].copy()

    def fk(self, q: np.ndarray) -> np.ndarray:
        self.data.qpos[: self.dof] = q
        self.mj.mj_kinematics(self.model, self.data)
        return self.data.site_xpos[self.site].copy()

    def ik(self, q_start: np.ndarray, goal_p: np.ndarray, rot_delta: np.ndarray, iterations: int = 3) -> np.ndarray:
        """Joint positions that bring the pinch site to `goal_p` with the orientation at `q_start` turned
        by `rot_delta` (base frame), by damped least squares from `q_start`, within the model's joint range.
        Not clipped to any speed: the safety chain's joint filters do that to the result."""
        mj, m = self.mj, self.model
        d = self._ik_data
        d.qpos[:] = 0
        d.qpos[: self.dof] = q_start
        mj.mj_kinematics(m, d)
        mj.mj_comPos(m, d)
        site = self.site
        goal_q, cur_q, turn = np.zeros(4), np.zeros(4), np.zeros(4)
        mj.mju_mat2Quat(cur_q, d.site_xmat[site])
        angle = float(np.linalg.norm(rot_delta))
        mj.mju_axisAngle2Quat(turn, rot_delta / (angle or 1.0), angle)
        mj.mju_mulQuat(goal_q, turn, cur_q)
        jac_p, jac_r = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        lo, hi = self.joint_range[:, 0], self.joint_range[:, 1]
        q = np.asarray(q_start, np.float64).copy()
        for _ in range(iterations):
            mj.mju_mat2Quat(cur_q, d.site_xmat[site])
            rot_err = np.zeros(3)
            mj.mju_subQuat(rot_err, goal_q, cur_q)               # in the site's frame ...
            rot_err = d.site_xmat[site].reshape(3, 3) @ rot_err  # ... the Jacobian wants the world frame
            err = np.concatenate([goal_p - d.site_xpos[site], rot_err])
            mj.mj_jacSite(m, d, jac_p, jac_r, site)
            jac = np.vstack([jac_p[:, : self.dof], jac_r[:, : self.dof]])
            q = np.clip(q + jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(6), err), lo, hi)
            d.qpos[: self.dof] = q
            mj.mj_kinematics(m, d)
            mj.mj_comPos(m, d)
        return q

    def gripper_width(self, data) -> float:
        gap = np.linalg.norm(data.xpos[self.left] - data.xpos[self.right]) - PAD_OFFSET_M
        return float(np.clip(gap, 0.0, GRIPPER_OPEN_M))
