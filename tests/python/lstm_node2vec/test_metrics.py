# AUC, average precision, macro-F1, logistic regression and the 95% intervals against values computed by hand.
import math

import numpy as np
import pytest

from cadence.lstm_node2vec import LogisticRegression, OneVsRest, average_precision, macro_f1, mean_ci, paired_difference, roc_auc


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


def test_macro_f1_matches_a_hand_computed_value():
    # class 0: TP 2 FP 1 FN 0 -> 4/5; class 1: TP 1 FP 0 FN 1 -> 2/3; class 2: TP 0 FP 0 FN 1 -> 0;
    # class 3 only predicted: TP 0 FP 1 FN 0 -> 0
    y_true = [0, 0, 1, 1, 2, 5]
    y_pred = [0, 0, 1, 0, 3, 5]
    # class 5: TP 1 -> 1
    assert macro_f1(y_true, y_pred) == pytest.approx((4 / 5 + 2 / 3 + 0 + 0 + 1) / 5)
    assert macro_f1([1, 2, 3], [1, 2, 3]) == 1.0


def test_one_vs_rest_separates_three_clusters():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 4.0], [4.0, 0.0], [-4.0, -4.0]])
    y = np.repeat([0, 1, 2], 100)
    x = centres[y] + rng.normal(size=(300, 2))
    idx = rng.permutation(300)
    clf = OneVsRest(l2=1.0).fit(x[idx[:150]], y[idx[:150]])
    assert macro_f1(y[idx[150:]], clf.predict(x[idx[150:]])) > 0.95
    assert clf.decision_function(x[:5]).shape == (5, 3)


def test_the_95_interval_matches_a_hand_computed_t_interval():
    # 1..5: mean 3, sd sqrt(2.5), t(0.975, 4) = 2.776
    m, h = mean_ci([1, 2, 3, 4, 5])
    assert m == 3.0 and h == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5))
    assert math.isnan(mean_ci([0.7])[1])
    # a difference that is the same on every seed is outside the noise; one that flips sign is not
    assert paired_difference([0.8, 0.7, 0.9], [0.6, 0.5, 0.7])["outside_noise"]
    assert not paired_difference([0.8, 0.5, 0.9], [0.6, 0.7, 0.7])["outside_noise"]
