import pytest
import torch

from planners.backends.local import continuation_logprobs
from planners.llm_planner import LLMPlanner, LLMPlannerConfig
from planners.grounding import candidates
from planners.skills import manipulation_skills
from worlds import scene_world

pytestmark = pytest.mark.slow  # loads SmolLM2 (tens of seconds once per session)


def test_generate_one_short_prompt(smollm2):
    out = smollm2.generate("Robot plan for 'open the window':\n1.", max_new_tokens=8)
    assert out.text.strip()
    assert out.usage.prompt_tokens > 5 and 0 < out.usage.completion_tokens <= 8 and out.usage.latency_s > 0


def test_score_matches_a_full_forward_pass(smollm2):
    prompt = "Instruction: open the drawer\nPlan:\n1."
    options = [" open the drawer\n", " press the window lock button\n"]
    scores, usage = smollm2.score(prompt, options)
    for text, got in zip(options, scores):
        p_ids, c_ids = smollm2._ids(prompt), smollm2._ids(text)
        ids = torch.tensor(p_ids + c_ids)
        with torch.no_grad():
            logits = smollm2.model(ids[None]).logits[0]
        assert abs(got - float(continuation_logprobs(logits, ids, len(p_ids)).sum())) < 1e-3
    assert scores[0] > scores[1]  # the instruction's own words are likelier


def test_constrained_choice_is_always_a_candidate(smollm2):
    world = scene_world()
    lib = manipulation_skills(world.controls)
    options = [f" {c.text}\n" for c in candidates(world, lib)]
    index, usage = smollm2.choose("Instruction: open the window\nPlan:\n1.", options)
    assert 0 <= index < len(options) and usage.completion_tokens >= 1


def test_llm_planner_modes_return_only_grounded_subgoals(smollm2):
    world = scene_world()
    lib = manipulation_skills(world.controls)
    keys = {c.key for c in candidates(world, lib)}
    for mode in ("saycan", "constrained"):
        planner = LLMPlanner(smollm2, lib, LLMPlannerConfig(mode=mode, max_steps=2))
        result = planner.plan("open the window", world)
        assert result.subgoals and all(g.key in keys for g in result.subgoals), mode
        assert result.usage.calls >= 1 and result.scores
