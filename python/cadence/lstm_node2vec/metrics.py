"""AUC, average precision and an L2-regularised logistic regression, in numpy (no scikit-learn)."""

from __future__ import annotations

import numpy as np


def _rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(x.size, dtype=np.float64)
    # boundaries of runs of equal values
    starts = np.concatenate([[0], np.flatnonzero(xs[1:] != xs[:-1]) + 1])
    ends = np.concatenate([starts[1:], [x.size]])
    avg = (starts + ends + 1) / 2.0  # mean of ranks starts+1..ends
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def roc_auc(y_true, score) -> float:
    """Area under the ROC curve (Mann-Whitney; ties count one half)."""
    y = np.asarray(y_true).astype(bool)
    s = np.asarray(score, dtype=np.float64)
    npos, nneg = int(y.sum()), int((~y).sum())
    if npos == 0 or nneg == 0:
        raise ValueError("roc_auc: needs at least one positive and one negative")
    r = _rankdata(s)
    return float((r[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def average_precision(y_true, score) -> float:
    """AP = sum over thresholds of (R_k - R_{k-1}) * P_k (scikit-learn's definition; tied scores form one threshold)."""
    y = np.asarray(y_true).astype(bool)
    s = np.asarray(score, dtype=np.float64)
    npos = int(y.sum())
    if npos == 0:
        raise ValueError("average_precision: needs at least one positive")
    order = np.argsort(-s, kind="mergesort")
    ys, ss = y[order], s[order]
    last = np.concatenate([np.flatnonzero(ss[1:] != ss[:-1]), [s.size - 1]])  # last index of each threshold
    tp = np.cumsum(ys)[last]
    k = last + 1
    precision = tp / k
    recall = tp / npos
    prev_recall = np.concatenate([[0.0], recall[:-1]])
    return float(np.sum((recall - prev_recall) * precision))


class LogisticRegression:
    """Binary logistic regression with an L2 penalty ``l2 * |w|^2 / 2`` (bias unpenalised), fitted by Newton's method.

    Features are standardised with the training mean and deviation, so ``l2`` means the same
    on every embedding scale.
    """

    def __init__(self, l2: float = 1.0, iters: int = 50, tol: float = 1e-8):
        self.l2, self.iters, self.tol = l2, iters, tol

    def _design(self, x):
        z = (np.asarray(x, dtype=np.float64) - self.mean_) / self.scale_
        return np.hstack([z, np.ones((z.shape[0], 1))])

    def fit(self, x, y):
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        self.mean_ = x.mean(axis=0)
        self.scale_ = x.std(axis=0)
        self.scale_[self.scale_ == 0] = 1.0
        a = self._design(x)
        d = a.shape[1]
        w = np.zeros(d)
        reg = np.full(d, self.l2)
        reg[-1] = 0.0
        for _ in range(self.iters):
            p = 1.0 / (1.0 + np.exp(-(a @ w)))
            g = a.T @ (p - y) + reg * w
            h = (a * (p * (1 - p))[:, None]).T @ a + np.diag(reg) + 1e-10 * np.eye(d)
            step = np.linalg.solve(h, g)
            w -= step
            if np.max(np.abs(step)) < self.tol:
                break
        self.w_ = w
        return self

    def decision_function(self, x):
        return self._design(x) @ self.w_

    def predict_proba(self, x):
        return 1.0 / (1.0 + np.exp(-self.decision_function(x)))


class OneVsRest:
    """Multi-class logistic regression: one binary ``LogisticRegression`` per class, the class with the largest decision value wins."""

    def __init__(self, l2: float = 1.0):
        self.l2 = l2

    def fit(self, x, y):
        y = np.asarray(y)
        self.classes_ = np.unique(y)
        self.models_ = [LogisticRegression(l2=self.l2).fit(x, (y == c).astype(np.float64)) for c in self.classes_]
        return self

    def decision_function(self, x):
        return np.stack([m.decision_function(x) for m in self.models_], axis=1)

    def predict(self, x):
        return self.classes_[np.argmax(self.decision_function(x), axis=1)]


def macro_f1(y_true, y_pred) -> float:
    """Unweighted mean of per-class F1 = 2TP / (2TP + FP + FN) over the classes in ``y_true`` or ``y_pred`` (scikit-learn's macro average)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if y_true.size == 0:
        raise ValueError("macro_f1: no labels")
    f1 = []
    for c in np.union1d(y_true, y_pred):
        tp = np.sum((y_pred == c) & (y_true == c))
        fp = np.sum((y_pred == c) & (y_true != c))
        fn = np.sum((y_pred != c) & (y_true == c))
        f1.append(2.0 * tp / (2.0 * tp + fp + fn))
    return float(np.mean(f1))
