"""vla_finetune's tables, in process: the seed-level test's pairing and the "before" episode count (fast tier;
the script itself runs end to end in tests/test_benchmarks.py and tests/agents/test_vla_qc.py)."""
import json
from pathlib import Path

import pytest

from benchmarks.vla_finetune import before_episodes, make_tables


def test_vla_finetune_seed_level_pairs_each_seed_with_the_before_on_its_own_slice():
    """A pooled Wilson interval counts episodes as independent; the seed-level test compares each seed with
    the pretrained policy on that seed's own start states, from the before eval's per-episode outcomes."""
    episodes = 4
    before_eval = {"episodes": 12, "task_success": {8: 2 / 12, 1: 0.5},
                   "episode_success": {8: [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0], 1: [1, 1, 0, 0] * 3}}
    jobs = [{"task": 8, "seed": seed, "episodes": episodes, "success_after": after, "success_before": 0.0,
             "other_tasks_before": {"1": 0.5}, "other_tasks_after": {"1": other},
             "action_distance": 0.1, "chain_kl": 1.0}
            for seed, after, other in [(0, 0.25, 0.5), (1, 0.75, 0.25), (2, 0.5, 0.5)]]
    level = make_tables(jobs, [8], "vla_ppo", Path("unused"), before_eval, slices=True)[8]["seed_level"]
    assert level["pairing"] == "slice" and level["task_before_per_seed"] == [0.0, 0.5, 0.0]
    assert level["gain"]["mean"] == pytest.approx((0.25 + 0.25 + 0.5) / 3, abs=1e-4)   # after - own slice
    assert level["other_tasks_change"]["mean"] == pytest.approx(-0.25 / 3, abs=1e-4)
    # an eval from before per-episode outcomes were kept: every seed against its overall mean, labelled so
    legacy = {**before_eval, "episode_success": {}}
    level = make_tables(jobs, [8], "vla_ppo", Path("unused"), legacy, slices=True)[8]["seed_level"]
    assert level["pairing"] == "unpaired" and level["task_before_per_seed"] == [0.167] * 3
    assert level["gain"]["mean"] == pytest.approx(0.5 - 2 / 12, abs=1e-4)


def test_vla_ppo_slices_without_a_before_eval_pair_each_seed_with_its_own_step0_eval():
    """vla_ppo's step-0 eval is the pretrained VLA on the seed's own slice: it is that seed's "before", and
    the pooled "before" counts every slice's episodes (a slice is not the shared first E states)."""
    jobs = [{"task": 2, "seed": seed, "episodes": 10, "success_after": after, "success_before": before,
             "other_tasks_before": {"1": other_before}, "other_tasks_after": {"1": other_after},
             "action_distance": 0.1, "chain_kl": 1.0}
            for seed, before, after, other_before, other_after in
            [(0, 0.2, 0.5, 0.4, 0.4), (1, 0.4, 0.6, 0.6, 0.5), (2, 0.3, 0.3, 0.2, 0.3)]]
    table = make_tables(jobs, [2], "vla_ppo", Path("unused"), None, slices=True)[2]
    assert table["episodes_before"] == 30 and table["before"]["success"] == pytest.approx(0.3)
    assert table["other_tasks_before"]["success"] == pytest.approx(0.4)
    level = table["seed_level"]
    assert level["pairing"] == "own slice" and level["task_before_per_seed"] == [0.2, 0.4, 0.3]
    assert level["gain"]["mean"] == pytest.approx((0.3 + 0.2 + 0.0) / 3, abs=1e-4)
    assert level["other_tasks_change"]["mean"] == pytest.approx((0.0 - 0.1 + 0.1) / 3, abs=1e-4)
    with pytest.raises(SystemExit, match="go together"):   # vla_qc's before is the pretraining's eval
        make_tables(jobs, [2], "vla_qc", Path("unused"), None, slices=True)


def test_vla_finetune_before_episodes_skips_the_final_per_variation_evals(tmp_path):
    """A pretraining with env.variations ends with per-variation evals that do not count their episodes; the
    "before" count read the last of them and fell back to the fine-tune's eval.episodes (10 for 20)."""
    lines = [{"phase": "offline", "kind": "train", "step": 2000},
             {"phase": "offline", "kind": "eval", "step": 2000, "eval/episodes": 20.0, "eval/success": 0.83},
             {"phase": "online", "kind": "switch", "step": 0},
             {"phase": "offline", "kind": "eval", "paraphrase/success": 0.8},
             {"phase": "offline", "kind": "eval", "positions/success": 0.7}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    assert before_episodes("vla_qc", tmp_path, 10) == 20
    assert before_episodes("vla_ppo", tmp_path, 10) == 10   # its before is its own step-0 eval
