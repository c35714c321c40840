import pytest

from planners.base import SubGoal
from planners.grounding import UngroundedSubGoal, candidates, require_grounded, split_steps
from planners.skills import manipulation_skills
from worlds import cube_world, scene_world


def test_candidates_are_skills_times_type_valid_bindings():
    world = scene_world()
    lib = manipulation_skills(world.controls)
    keys = sorted(c.key for c in candidates(world, lib))
    # 1 cube: pick 1, place_in 1, place_at 2 spots, open/close 2+2 articulated, press 2 buttons; no place_on
    assert keys == sorted([
        "pick(cube_0)", "place_in(cube_0,drawer)", "place_at(cube_0,left_spot)", "place_at(cube_0,right_spot)",
        "open(drawer)", "open(window)", "close(drawer)", "close(window)", "press(button_0)", "press(button_1)"])
    two = {c.key for c in candidates(cube_world(2), manipulation_skills())}
    assert "place_on(cube_0,cube_1)" in two and "place_on(cube_0,cube_0)" not in two
    assert not any(k.startswith(("open", "press")) for k in two)  # no drawer or button in the cube scene


def test_candidate_carries_text_success_and_goal_encoding():
    world = scene_world(drawer_open=True, drawer_locked=False, holding="cube_0")
    lib = manipulation_skills(world.controls)
    place = next(c for c in candidates(world, lib) if c.key == "place_in(cube_0,drawer)")
    assert place.text == "put the red cube in the drawer"
    assert [str(p) for p in place.success] == ["in(cube_0,drawer)"]
    assert place.goal["skill"] == "place_in" and place.goal["args"] == ["cube_0", "drawer"]
    assert len(place.goal["target_pos_m"]) == 2


@pytest.mark.parametrize("goal, why", [
    (SubGoal("pick", ("sphere_0",)), "not a skill x object binding"),
    (SubGoal("teleport", ("cube_0",)), "not registered"),
    (SubGoal("pick", ("drawer",)), "not a skill x object binding"),  # wrong kind
    (SubGoal("place_in", ("cube_0", "cube_0")), "not a skill x object binding"),
])
def test_gate_rejects_everything_outside_the_grounded_set(goal, why):
    world = scene_world()
    with pytest.raises(UngroundedSubGoal, match=why):
        require_grounded(goal, world, manipulation_skills(world.controls))


def test_gate_accepts_a_candidate():
    world = scene_world()
    lib = manipulation_skills(world.controls)
    assert "press(button_0)" in {c.key for c in candidates(world, lib)}
    require_grounded(SubGoal("press", ("button_0",)), world, lib)   # returns without raising


def test_split_steps_reads_numbered_and_bulleted_lines_until_done():
    text = "1. press the drawer button\n2) open the drawer\n - pick up the red cube\n\n4. done\n5. close it"
    assert split_steps(text) == ["press the drawer button", "open the drawer", "pick up the red cube"]


@pytest.mark.slow
def test_embedding_grounding_maps_paraphrases_and_rejects_unknown_objects(grounder):
    world = scene_world()
    cands = candidates(world, manipulation_skills(world.controls))
    assert grounder.ground("Open the drawer.", cands).subgoal.key == "open(drawer)"
    assert grounder.ground("push the window button", cands).subgoal.key == "press(button_1)"
    assert grounder.ground("grab the red cube", cands).subgoal.key == "pick(cube_0)"
    for text in ("pick up the purple sphere", "send joint torques to the robot", "fly to the moon"):
        match = grounder.ground(text, cands)
        assert match.subgoal is None and match.similarity < grounder.threshold, (text, match)


def test_world_description_lists_ids_names_attributes_and_poses():
    text = scene_world().describe()
    assert "cube_0: red cube (cube, red) at (0.350, 0.050, 0.020) m" in text
    assert "drawer: drawer (drawer) at (0.330, -0.300, 0.060) m, locked=True, open=False" in text
    assert text.endswith("gripper: empty")
