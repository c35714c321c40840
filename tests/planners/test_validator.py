from planners.base import SubGoal
from planners.skills import manipulation_skills
from planners.validator import PRECONDITION, UNGROUNDED, validate
from worlds import cube_world, scene_world


def plan(*keys):
    out = []
    for key in keys:
        name, args = key[:-1].split("(")
        out.append(SubGoal(name, tuple(args.split(","))))
    return out


def test_valid_plan_passes_and_predicts_the_final_state():
    world = scene_world()
    lib = manipulation_skills(world.controls)
    v = validate(world, plan("press(button_0)", "open(drawer)", "pick(cube_0)", "place_in(cube_0,drawer)",
                             "close(drawer)"), lib)
    assert v.ok, v.reason
    assert {"in(cube_0,drawer)", "closed(drawer)", "unlocked(drawer)"} <= v.final_state
    assert not any(a.startswith("holding") for a in v.final_state)


def test_place_into_a_closed_drawer_is_rejected():
    world = scene_world(drawer_locked=False)
    lib = manipulation_skills(world.controls)
    v = validate(world, plan("pick(cube_0)", "place_in(cube_0,drawer)"), lib)
    assert not v.ok and v.index == 1 and v.category == PRECONDITION and "closed" in v.reason


def test_pick_needs_a_free_gripper_and_open_needs_an_unlocked_drawer():
    world = scene_world(holding="cube_0", drawer_locked=False)
    lib = manipulation_skills(world.controls)
    v = validate(world, plan("pick(cube_0)"), lib)
    assert not v.ok and v.category == PRECONDITION
    v = validate(world, plan("open(drawer)"), lib)  # holding the cube: hand not free
    assert not v.ok and "holding" in v.reason
    locked = scene_world()
    v = validate(locked, plan("open(drawer)"), manipulation_skills(locked.controls))
    assert not v.ok and "locked" in v.reason


def test_unknown_objects_and_skills_are_ungrounded():
    world = scene_world()
    lib = manipulation_skills(world.controls)
    v = validate(world, plan("pick(purple_sphere)"), lib)
    assert not v.ok and v.category == UNGROUNDED and "purple_sphere" in v.reason
    v = validate(world, plan("throw(cube_0)"), lib)
    assert not v.ok and v.category == UNGROUNDED


def test_stacking_needs_a_clear_target():
    world = cube_world(2, stacked=True)  # cube_1 sits on cube_0
    lib = manipulation_skills()
    v = validate(world, plan("pick(cube_0)"), lib)
    assert not v.ok and "stacked" in v.reason
    assert validate(world, plan("pick(cube_1)", "place_at(cube_1,left_spot)", "pick(cube_0)"), lib).ok
