import math

import pytest
import torch

from planners import saycan
from planners.backends.base import log_softmax_row
from planners.backends.local import continuation_logprobs


def test_select_maximises_likelihood_times_value_by_hand():
    # p = exp(loglik): 0.3679, 0.6065, 0.0498; V = 0.5, 0.0, 1.0 -> p*V = 0.1839, 0, 0.0498
    logliks, values = [-1.0, -0.5, -3.0], [0.5, 0.0, 1.0]
    best, scores = saycan.select(logliks, values)
    assert best == 0
    assert scores[0] == pytest.approx(math.log(math.exp(-1.0) * 0.5))
    assert scores[0] == pytest.approx(-1.6931472, abs=1e-6)
    assert scores[1] == float("-inf")
    assert scores[2] == pytest.approx(-3.0)
    # the most likely text loses when its skill cannot run; a likelier feasible one wins
    assert saycan.select([-0.1, -2.0], [0.0, 1.0])[0] == 1
    assert saycan.select([-2.0, -1.0], [1.0, 0.2])[0] == 0  # 0.1353 * 1.0 > 0.3679 * 0.2 = 0.0736
    with pytest.raises(ValueError, match="affordance value must be >= 0"):
        saycan.select([-1.0], [-0.5])


def test_select_tie_goes_to_the_first_candidate():
    assert saycan.select([-1.0, -1.0], [1.0, 1.0])[0] == 0


def test_continuation_loglik_from_logits_by_hand():
    # vocabulary of 3; sequence [0, 2, 1]; the continuation is tokens 1..2 (predicted by rows 0 and 1)
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, math.log(2.0)], [5.0, 5.0, 5.0]])
    ids = torch.tensor([0, 2, 1])
    got = continuation_logprobs(logits, ids, start=1)
    # row 0 -> token 2: 3 - log(e^1 + e^2 + e^3); row 1 -> token 1: 0 - log(1 + 1 + 2) = -log 4
    want0 = 3.0 - math.log(math.e + math.e ** 2 + math.e ** 3)
    assert got.tolist() == pytest.approx([want0, -math.log(4.0)], abs=1e-6)
    assert log_softmax_row([1.0, 2.0, 3.0])[2] == pytest.approx(want0)
    assert float(got.sum()) == pytest.approx(-0.4076059 - 1.3862944, abs=1e-5)
