"""The held-out evaluation set for the goal mode (issue 19, item 5).

Written before any tuning of the goal mode, and never used for tuning: new wordings (colour synonyms,
"block" for cube, region names said differently, verbs the suite does not use) and compositions that
are neither suite tasks nor examples in the retrieval bank (`planners.examples.BANK`). Start states and
goal atoms follow the OGBench evaluation tasks, like `planners.tasks.TASKS`; `steps` is the shortest plan.

The ten adversarial instructions added by issue 19 are `planners.tasks.ADVERSARIAL_EXTRA` (part of
`planners.tasks.ADVERSARIAL`).
"""
from __future__ import annotations

from planners.tasks import T, Task

HELDOUT: tuple[Task, ...] = (
    # paraphrases: synonyms for objects, colours, places and verbs
    T("h-cs1-slide-left", "cube-single", 1, "slide the red block over to the left side", ["at(cube_0,target_0)"], 2),
    T("h-cs4-crimson", "cube-single", 4, "relocate the crimson cube to the front-right corner", ["at(cube_0,target_0)"], 2),
    T("h-cs2-front", "cube-single", 2, "bring the scarlet block toward the front edge of the table", ["at(cube_0,target_0)"], 2),
    T("h-cs3-far", "cube-single", 3, "carry the red cube to the far side of the table", ["at(cube_0,target_0)"], 2),
    T("h-cs5-near-left", "cube-single", 5, "drop the red block off at the near left corner", ["at(cube_0,target_0)"], 2),
    T("h-cd1-navy-right", "cube-double", 1, "shift the navy block to the right-hand side", ["at(cube_1,target_1)"], 2),
    T("h-cd5-azure-on-crimson", "cube-double", 5, "set the crimson block on top of the azure one", ["on(cube_0,cube_1)"], 2),
    T("h-sc2-hide", "scene", 2, "hide the red cube inside the drawer", ["in(cube_0,drawer)"], 2),
    T("h-sc3-window-shut", "scene", 3, "make sure the window is shut", ["closed(window)"], 2),
    T("h-sc1-secure-drawer", "scene", 1, "secure the drawer with its lock", ["locked(drawer)"], 1),
    # compositions not in the bank or the suite
    T("h-cd3-blue-then-red", "cube-double", 3, "first send the blue block to the right, after that the red block to the left",
      ["at(cube_1,target_1)", "at(cube_0,target_0)"], 4),
    T("h-cd4-swap-words", "cube-double", 4, "the blue cube belongs on the left and the red cube on the right",
      ["at(cube_1,target_1)", "at(cube_0,target_0)"], 6),
    T("h-sc1-open-window-cube-back", "scene", 1, "open up the window, then carry the red block to the back of the table",
      ["open(window)", "at(cube_0,target_0)"], 1),  # the cube starts at the back already
    T("h-sc4-unlock-both", "scene", 4, "unlock the window and the drawer", ["unlocked(window)", "unlocked(drawer)"], 2),
    T("h-sc3-close-lock-drawer", "scene", 3, "lock the drawer, then shut the window and lock it",
      ["locked(drawer)", "closed(window)", "locked(window)"], 4),
    T("h-sc5-stash-close", "scene", 5, "stash the red block in the drawer and shut the drawer afterwards",
      ["in(cube_0,drawer)", "closed(drawer)"], 5),
)
