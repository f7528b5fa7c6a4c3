# AUC, average precision and logistic regression against values computed by hand.
import math

import numpy as np
import pytest

from cadence.lstm_node2vec import LogisticRegression, average_precision, roc_auc


def test_auc_and_ap_match_hand_computed_values():
    y, s = [0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]
    # positives 0.35 and 0.8 beat 1 and 2 of the 2 negatives: 3 / 4
    assert roc_auc(y, s) == pytest.approx(0.75)
    # ranked 0.8(+) 0.4(-) 0.35(+) 0.1(-): precision 1 at recall 1/2, 2/3 at recall 1
    assert average_precision(y, s) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)


def test_ties_count_one_half_in_auc_and_form_one_threshold_in_ap():
    assert roc_auc([0, 1], [0.3, 0.3]) == pytest.approx(0.5)
    assert roc_auc([1, 0, 1, 0], [0.9, 0.5, 0.5, 0.1]) == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    # threshold 0.5 takes two items (one positive): P=1/2 R=1/2; threshold 0.2: P=2/3 R=1
    assert average_precision([1, 0, 1], [0.5, 0.5, 0.2]) == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3)


def test_perfect_and_reversed_rankings():
    y = np.array([0, 1, 0, 1, 1])
    assert roc_auc(y, y * 2.0) == 1.0 and roc_auc(y, -y) == 0.0
    assert average_precision(y, y * 2.0) == 1.0
    with pytest.raises(ValueError):
        roc_auc([1, 1], [0.1, 0.2])


def test_auc_equals_the_brute_force_pair_count():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = rng.integers(0, 10, 200).astype(float)  # many ties
    pos, neg = s[y == 1], s[y == 0]
    brute = np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg])
    assert roc_auc(y, s) == pytest.approx(brute)


def test_logistic_regression_solves_the_hand_derived_optimum():
    # x = [-1, 1], y = [0, 1], l2 = 1: standardised z = x; by symmetry the bias is 0 and the
    # gradient -sigma(-w) - sigma(-w) + w = 0 gives w = 2 sigma(-w)
    lo, hi = 0.0, 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mid < 2 / (1 + math.exp(mid)) else (lo, mid)
    clf = LogisticRegression(l2=1.0).fit(np.array([[-1.0], [1.0]]), np.array([0.0, 1.0]))
    assert clf.w_[0] == pytest.approx(lo, abs=1e-8)
    assert clf.w_[1] == pytest.approx(0.0, abs=1e-10)
    assert clf.predict_proba(np.array([[1.0]]))[0] == pytest.approx(1 / (1 + math.exp(-lo)))


def test_logistic_regression_separates_a_linear_problem():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 3))
    y = (x @ np.array([2.0, -1.0, 0.0]) + 0.3 * rng.normal(size=400) > 0).astype(float)
    clf = LogisticRegression(l2=0.1).fit(x[:200], y[:200])
    assert roc_auc(y[200:], clf.decision_function(x[200:])) > 0.95
