"""Scripted experts for the manipulation tasks: OGBench's own oracles (`ogbench.manipspace.oracles`)
and `TaskOracle`, which drives them through a named task's sub-goals.

`make_oracles` builds OGBench's set for a task family: plan oracles (pre-computed keyframe plans) for
play data, Markov (closed-loop) ones otherwise. `TaskOracle` is a small planner on top: it picks the
next skill from the live state (unlock before opening, the lower cube before the stacked one, a
Lights-Out solve for the puzzle, `lights_out_presses`) and writes the privileged target that skill's
Markov oracle reads. `embodied.data.ogbench_gen` records datasets with them; tests drive envs with them.
"""
from __future__ import annotations

import numpy as np

from embodied.errors import DatasetError
from sims.predicates import DRAWER_OPEN_M


def make_oracles(env, kind: str, quality: str, spec) -> dict:
    """OGBench's oracle set for a task family: plan oracles for play data, Markov ones otherwise;
    `spec` (an `ogbench_gen.GenSpec`) gives their noise, noise_smoothing and min_norm."""
    from ogbench.manipspace.oracles.markov.button_markov import ButtonMarkovOracle
    from ogbench.manipspace.oracles.markov.cube_markov import CubeMarkovOracle
    from ogbench.manipspace.oracles.markov.drawer_markov import DrawerMarkovOracle
    from ogbench.manipspace.oracles.markov.window_markov import WindowMarkovOracle
    from ogbench.manipspace.oracles.plan.button_plan import ButtonPlanOracle
    from ogbench.manipspace.oracles.plan.cube_plan import CubePlanOracle
    from ogbench.manipspace.oracles.plan.drawer_plan import DrawerPlanOracle
    from ogbench.manipspace.oracles.plan.window_plan import WindowPlanOracle

    closed = kind == "puzzle"  # puzzle buttons are pressed with a closed gripper
    if quality == "play":
        kw = dict(env=env, noise=spec.noise, noise_smoothing=spec.noise_smoothing)
        return {"cube": CubePlanOracle(**kw), "button": ButtonPlanOracle(gripper_always_closed=closed, **kw),
                "drawer": DrawerPlanOracle(**kw), "window": WindowPlanOracle(**kw)}
    kw = dict(env=env, min_norm=spec.min_norm)
    return {"cube": CubeMarkovOracle(max_step=100 if kind == "scene" else 200, **kw),
            "button": ButtonMarkovOracle(gripper_always_closed=closed, **kw),
            "drawer": DrawerMarkovOracle(**kw), "window": WindowMarkovOracle(**kw)}


def lights_out_presses(current, target, rows: int, cols: int) -> list[int]:
    """Buttons to press (each once) so `current` becomes `target`: solve A x = current ^ target over GF(2)."""
    n = rows * cols
    a = np.zeros((n, n), np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        for dr, dc in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < rows and 0 <= cc < cols:
                a[rr * cols + cc, i] = 1
    b = (np.asarray(current).reshape(-1) ^ np.asarray(target).reshape(-1)).astype(np.uint8)
    m = np.concatenate([a, b[:, None]], axis=1)
    pivots, row = [], 0
    for col in range(n):
        hit = next((r for r in range(row, n) if m[r, col]), None)
        if hit is None:
            continue
        m[[row, hit]] = m[[hit, row]]
        for r in range(n):
            if r != row and m[r, col]:
                m[r] ^= m[row]
        pivots.append(col)
        row += 1
    if any(m[r, -1] for r in range(row, n)):
        raise DatasetError("this Lights-Out target is unreachable from the current buttons")
    x = np.zeros(n, np.uint8)
    for r, col in enumerate(pivots):
        x[col] = m[r, -1]
    return [int(i) for i in np.flatnonzero(x)]


class TaskOracle:
    """Closed-loop expert for the single task of a `sims.make(<manip task>)` env: picks the next skill
    from the live state, feeds OGBench's Markov oracle for it the privileged target it needs;
    `spec` (an `ogbench_gen.GenSpec`) gives the oracles' options (min_norm)."""

    def __init__(self, env, kind: str, spec):
        self.env, self.base, self.kind = env, env.unwrapped, kind
        self.oracles = make_oracles(self.base, kind, "task", spec)
        self.skill = None
        self.target: dict = {}

    def reset(self) -> None:
        self.skill, self.target = None, {}

    def _next_skill(self):
        base, data = self.base, self.base._data
        truths = self.env.get_wrapper_attr("subgoal_truths")()
        if self.kind == "puzzle":
            presses = lights_out_presses(np.asarray(base._cur_button_states).reshape(-1),
                                         np.asarray(base._target_button_states).reshape(-1), base._num_rows, base._num_cols)
            return ("button", presses[0]) if presses else None
        cubes = int(getattr(base, "_num_cubes", 0))
        pos = [np.asarray(data.joint(f"object_joint_{i}").qpos[:3]) for i in range(cubes)]
        goal = [np.asarray(data.mocap_pos[base._cube_target_mocap_ids[i]]) for i in range(cubes)]
        if self.kind == "scene":
            buttons = np.asarray(base._cur_button_states).reshape(-1)
            target_buttons = np.asarray(base._target_button_states).reshape(-1)
            drawer = float(data.joint("drawer_slide").qpos[0])
            # a cube goal inside the drawer is given for the closed drawer: put the cube into the open
            # drawer, then closing the drawer carries it to the goal
            goal_in_drawer = goal[0][2] > 0.04 and goal[0][1] < -0.2
            cube_in_drawer = bool(base._is_in_drawer(pos[0]))
            unlock_and_open = ("button", 0) if buttons[0] == 0 else ("drawer", DRAWER_OPEN_M)
            if not truths[0]:
                if goal_in_drawer and not cube_in_drawer:
                    return unlock_and_open if drawer > -0.12 else ("cube", (0, np.asarray(base._drawer_center, float)))
                if not goal_in_drawer:
                    return unlock_and_open if cube_in_drawer and drawer > -0.12 else ("cube", (0, goal[0]))
            if not truths[3] or (goal_in_drawer and not truths[0]):
                return ("button", 0) if buttons[0] == 0 else ("drawer", base._target_drawer_pos)
            if not truths[4]:
                return ("button", 1) if buttons[1] == 0 else ("window", base._target_window_pos)
            for i in range(2):
                if buttons[i] != target_buttons[i]:
                    return ("button", i)
            return None
        pending = [i for i in range(cubes) if not truths[i]]
        if not pending:
            return None
        free = []
        for i in sorted(pending, key=lambda k: goal[k][2]):  # lower targets first (stacks)
            blocked = any(j != i and np.linalg.norm(pos[j][:2] - goal[i][:2]) < 0.045
                          and abs(pos[j][2] - goal[i][2]) < 0.02 for j in range(cubes))  # another cube sits there
            below_ok = goal[i][2] < 0.04 or any(truths[j] for j in range(cubes) if j != i)
            if not blocked and below_ok:
                return ("cube", (i, goal[i]))
            free.append(i)
        i = free[0]  # every pending cube is blocked (a swap): park the blocker somewhere free
        blocker = next((j for j in range(cubes) if j != i and np.linalg.norm(pos[j][:2] - goal[i][:2]) < 0.045
                        and abs(pos[j][2] - goal[i][2]) < 0.02), i)
        spot = self._free_spot([p for p in pos] + goal)
        return ("cube", (blocker, spot))

    def _free_spot(self, occupied) -> np.ndarray:
        candidates = [np.array([x, y, 0.02]) for x in (0.35, 0.425, 0.5) for y in (-0.25, -0.15, 0.0, 0.15, 0.25)]
        best = max(candidates, key=lambda c: min(np.linalg.norm(c[:2] - o[:2]) for o in occupied))
        return best

    def _privileged(self, info: dict) -> dict:
        base, data = self.base, self.base._data
        info = dict(info)
        skill, arg = self.skill
        if skill == "cube":
            i, goal = arg
            info.update({"privileged/target_task": "cube", "privileged/target_block": i,
                         "privileged/target_block_pos": np.asarray(goal, float),
                         "privileged/target_block_yaw": np.zeros(1)})
        elif skill == "button":
            state = np.asarray(base._cur_button_states).reshape(-1)
            if "button_state" not in self.target:  # fixed when the skill starts: one press
                self.target["button_state"] = (int(state[arg]) + 1) % 2
            info.update({"privileged/target_task": "button", "privileged/target_button": arg,
                         "privileged/target_button_top_pos": data.site_xpos[base._button_site_ids[arg]].copy(),
                         "privileged/target_button_state": self.target["button_state"],
                         f"privileged/button_{arg}_state": int(state[arg])})
        else:
            joint = "drawer_slide" if skill == "drawer" else "window_slide"
            handle = base._drawer_site_id if skill == "drawer" else base._window_site_id
            jid = base._model.joint(joint).id
            cur = float(data.joint(joint).qpos[0])
            target = data.site_xpos[handle] + (arg - cur) * data.xaxis[jid]
            info[f"privileged/target_{skill}_handle_pos"] = target
            info[f"privileged/target_{skill}_pos"] = np.array([arg])
        return info

    def __call__(self, ob, info) -> np.ndarray:
        if self.skill is None or self.oracles[self.skill[0]].done:
            nxt = self._next_skill()
            if nxt is None:  # everything holds: hover in place
                return np.zeros(5)
            self.skill, self.target = nxt, {}
            self.oracles[nxt[0]].reset(ob, self._privileged(info))
        return np.asarray(self.oracles[self.skill[0]].select_action(ob, self._privileged(info)), float)
