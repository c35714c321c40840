"""Bootstrap CIs, the seed-level t-test and the post-switch dip, checked on data whose answer is known."""
import numpy as np
import pytest

from embodied.stats import bootstrap_ci, post_switch_dip, seed_t_test


def test_constant_values_give_zero_width():
    assert bootstrap_ci([42.0] * 5) == (42.0, 42.0, 42.0)


def test_single_value_gives_point_interval():
    assert bootstrap_ci([3.5]) == (3.5, 3.5, 3.5)


def test_empty_values_rejected():
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_normal_samples_ci_contains_mean_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    widths = []
    for n in (5, 50, 500):
        mean, low, high = bootstrap_ci(rng.normal(10.0, 2.0, size=n), n_resamples=2000)
        assert low <= mean <= high
        assert low < 10.0 < high
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]


def test_ci_is_reproducible_and_seed_dependent():
    values = np.random.default_rng(0).normal(size=12)
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci(values, seed=3) != bootstrap_ci(values, seed=4)


def test_wider_confidence_gives_wider_interval():
    values = [1.0, 5.0, 2.0, 8.0, 4.0]
    _, low90, high90 = bootstrap_ci(values, confidence=0.90)
    _, low99, high99 = bootstrap_ci(values, confidence=0.99)
    assert low99 <= low90 and high99 >= high90


def test_dip_is_worst_early_online_eval_minus_offline_score():
    # switch at total step 1000, 10_000 online steps -> window (1000, 2000]
    scores = {1000: 60.0, 1500: 40.0, 2000: 55.0, 2500: 10.0, 9000: 90.0}
    dip = post_switch_dip(scores, switch_step=1000, online_steps=10_000, end_of_offline_score=60.0)
    assert dip == pytest.approx(40.0 - 60.0)  # 2500 is outside the first 10%, 1000 is the switch


def test_dip_positive_when_policy_only_improves_and_accepts_pairs():
    dip = post_switch_dip([(0, 50.0), (100, 55.0), (200, 70.0)], switch_step=0,
                          online_steps=2000, end_of_offline_score=50.0)
    assert dip == pytest.approx(5.0)


def test_dip_none_when_no_eval_in_window():
    assert post_switch_dip({0: 1.0, 5000: 2.0}, 0, 10_000, 1.0) is None


def test_seed_t_test_matches_a_hand_computed_student_t():
    # five seeds' success: mean 0.25, sd sqrt(0.13 / 4), so t against 0.10 is 0.15 / (sd / sqrt 5) = 1.861 on
    # 4 degrees of freedom, whose 97.5% quantile is 2.776
    result = seed_t_test([0.30, 0.00, 0.50, 0.20, 0.25], reference=0.10)
    sem = (0.13 / 4) ** 0.5 / 5 ** 0.5
    assert result["mean"] == 0.25 and result["df"] == 4
    assert result["t"] == pytest.approx(0.15 / sem, abs=1e-3)
    assert result["ci95"] == pytest.approx([0.25 - 2.7764 * sem, 0.25 + 2.7764 * sem], abs=1e-3)
    assert 0.10 < result["p"] < 0.15          # two-sided, t = 1.86 on 4 df
    assert result["ci95"][0] < 0.10 < result["ci95"][1]   # the interval and the test agree


def test_seed_t_test_without_spread_or_with_one_seed_has_no_test():
    assert seed_t_test([0.4, 0.4, 0.4])["t"] is None and seed_t_test([0.7])["p"] is None
    assert seed_t_test([0.7])["ci95"] == [0.7, 0.7]
    with pytest.raises(ValueError):
        seed_t_test([])


def test_seed_t_test_on_paired_differences_rejects_a_consistent_gain():
    result = seed_t_test([0.20, 0.25, 0.15, 0.30, 0.20])   # after - before per seed, all positive
    assert result["ci95"][0] > 0 and result["p"] < 0.01
