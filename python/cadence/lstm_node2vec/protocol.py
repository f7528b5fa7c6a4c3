"""The evaluation sets of docs/lstm-node2vec.md's protocol: link-prediction pairs (four negative sets), injected anomalies, the node split.

Everything here is drawn once per seed, so every method is scored on the same pairs and the
same anomalies. Pairs are undirected and stored canonically (u < v); every set is unique.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .data import Snapshots
from .graph import CSRGraph

#: The link-prediction columns, in table order: name -> JSON key.
LINK_COLUMNS = {"uniform": "link_auc", "hard": "link_auc_hard", "dist2": "link_auc_dist2", "new": "link_auc_new"}


def canonical(pairs: np.ndarray) -> np.ndarray:
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return np.stack([pairs.min(axis=1), pairs.max(axis=1)], axis=1)


def _collect(propose, count: int, n: int, exclude=None, rounds: int = 100) -> np.ndarray:
    """Up to ``count`` unique canonical pairs from ``propose(size) -> (u, v)`` (already filtered).

    Keeps the order of first appearance (so the draw stays random and seeded); pairs whose key
    is in ``exclude`` are skipped. Stops early after ``rounds`` proposals when candidates run out.
    """
    keys = np.zeros(0, dtype=np.int64)
    for _ in range(rounds):
        need = count - keys.size
        if need <= 0:
            break
        u, v = propose(2 * need + 16)
        k = np.minimum(u, v) * n + np.maximum(u, v)
        k = k[~np.isin(k, keys)]
        if exclude is not None:
            k = k[~np.isin(k, exclude)]
        _, first = np.unique(k, return_index=True)
        keys = np.concatenate([keys, k[np.sort(first)][:need]])
    return np.stack([keys // n, keys % n], axis=1)


def _any_edge(graphs, u, v) -> np.ndarray:
    hit = np.zeros(np.shape(u), dtype=bool)
    for g in graphs:
        hit |= g.has_edge(u, v)
    return hit


def active_nodes(snapshots: Snapshots, t_end: int, lookback: int) -> np.ndarray:
    """Nodes with at least one edge in snapshots t_end-lookback+1..t_end (the LSTM's window)."""
    deg = np.zeros(snapshots.n, dtype=np.int64)
    for t in range(max(0, t_end - lookback + 1), t_end + 1):
        deg += snapshots.graphs[t].degree()
    return np.flatnonzero(deg > 0)


@dataclass
class LinkColumn:
    """One link-prediction column: disjoint classifier-training and test pairs with labels."""

    train_pairs: np.ndarray
    train_y: np.ndarray
    test_pairs: np.ndarray
    test_y: np.ndarray

    @property
    def sizes(self) -> dict:
        return {"train_pos": int(self.train_y.sum()), "train_neg": int((self.train_y == 0).sum()),
                "test_pos": int(self.test_y.sum()), "test_neg": int((self.test_y == 0).sum())}


def _column(pos, pos_train, neg) -> LinkColumn:
    """Positives keep their half (``pos_train``); negatives fill each half in the same proportion."""
    k = int(round(len(neg) * pos_train.mean())) if len(pos) else 0
    tr = np.concatenate([pos[pos_train], neg[:k]])
    te = np.concatenate([pos[~pos_train], neg[k:]])
    ytr = np.concatenate([np.ones(int(pos_train.sum())), np.zeros(k)])
    yte = np.concatenate([np.ones(int((~pos_train).sum())), np.zeros(len(neg) - k)])
    return LinkColumn(tr, ytr, te, yte)


def node_split(labels: np.ndarray, seed: int = 0):
    """The fixed node-classification split: per class, half of its nodes (rounded down) to test, the rest to training.

    ``labels`` < 0 means unlabelled (in neither half). Returns (train nodes, test nodes).
    """
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels[labels >= 0]):
        nodes = rng.permutation(np.flatnonzero(labels == c))
        half = len(nodes) // 2
        test.append(nodes[:half])
        train.append(nodes[half:])
    if not train:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


class Tasks:
    """The protocol's evaluation sets for embeddings at ``t_cur`` and the target snapshot ``t_cur + 1``.

    ``link``: {column: LinkColumn} for the columns of LINK_COLUMNS. ``injected``: the snapshot
    sequence with anomalies added to snapshot ``t_cur`` (what every method embeds again for the
    anomaly task); ``anomalies``: the injected pairs; ``anomaly_clf`` / ``anomaly_heldout``:
    (pairs, labels) halves of the injected snapshot's edges, label 1 = injected. ``node_train``
    / ``node_test`` / ``node_labels``: the fixed node split, or None when the data has no labels.
    """

    def __init__(self, snapshots: Snapshots, t_cur: int, cfg, seed=None):
        if not 0 <= t_cur < len(snapshots) - 1:
            raise ValueError(f"Tasks: t_cur {t_cur} needs a next snapshot (0..{len(snapshots) - 2})")
        seed = cfg.seed if seed is None else seed
        self.seed = seed
        self.t_cur = t_cur
        rng = np.random.default_rng([seed, 24])
        n = snapshots.n
        g = snapshots.graphs[t_cur]
        target = snapshots.graphs[t_cur + 1]
        lo = max(0, t_cur - cfg.lookback + 1)
        window = snapshots.graphs[lo:t_cur + 1]
        self.active = active_nodes(snapshots, t_cur, cfg.lookback)

        # ---- link prediction ----
        pos = target.edge_list()
        if len(pos) > cfg.max_pairs:
            pos = pos[np.sort(rng.choice(len(pos), cfg.max_pairs, replace=False))]
        if len(pos) < 4:
            raise ValueError(f"snapshot {t_cur + 1} has {len(pos)} edges: too few to evaluate link prediction")
        pos = pos[rng.permutation(len(pos))]
        pos_train = np.zeros(len(pos), dtype=bool)
        pos_train[:len(pos) // 2] = True
        in_active = np.zeros(n, dtype=bool)
        in_active[self.active] = True
        both_active = in_active[pos[:, 0]] & in_active[pos[:, 1]]
        new = ~_any_edge(window, pos[:, 0], pos[:, 1])
        self.recurring_fraction = float(1.0 - new.mean())

        def uniform(size):
            u, v = rng.integers(0, n, size), rng.integers(0, n, size)
            ok = (u != v) & ~target.has_edge(u, v)
            return u[ok], v[ok]

        def hard(size):
            u = self.active[rng.integers(0, len(self.active), size)]
            v = self.active[rng.integers(0, len(self.active), size)]
            ok = (u != v) & ~target.has_edge(u, v)
            return u[ok], v[ok]

        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.indptr))

        def dist2(size):
            if g.indices.size == 0:
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
            e = rng.integers(0, g.indices.size, size)
            u, w = rows[e], g.indices[e]
            start = g.indptr[w]
            deg = g.indptr[w + 1] - start  # >= 1: u is a neighbour of w
            v = g.indices[start + (rng.random(size) * deg).astype(np.int64)]
            ok = (u != v) & ~g.has_edge(u, v) & ~target.has_edge(u, v)
            return u[ok], v[ok]

        def new_neg(size):
            u, v = rng.integers(0, n, size), rng.integers(0, n, size)
            ok = (u != v) & ~target.has_edge(u, v) & ~_any_edge(window, u, v)
            return u[ok], v[ok]

        self.link = {}
        for name, keep, propose in (("uniform", np.ones(len(pos), dtype=bool), uniform),
                                    ("hard", both_active, hard),
                                    ("dist2", both_active, dist2),
                                    ("new", new, new_neg)):
            p, ptr = pos[keep], pos_train[keep]
            neg = _collect(propose, len(p), n) if len(p) else np.zeros((0, 2), np.int64)
            self.link[name] = _column(p, ptr, neg)

        # ---- anomaly detection: injected into the embedded snapshot ----
        normal = g.edge_list()
        k = max(1, int(round(cfg.anomaly_ratio * len(normal))))
        present_t = np.flatnonzero(g.degree() > 0)
        avoid = list(window) + [target]
        if len(present_t) < 2:
            raise ValueError(f"snapshot {t_cur} has fewer than 2 nodes with an edge: nothing to inject anomalies between")

        def anomaly(size):
            u = present_t[rng.integers(0, len(present_t), size)]
            v = present_t[rng.integers(0, len(present_t), size)]
            ok = (u != v) & ~_any_edge(avoid, u, v)
            return u[ok], v[ok]

        self.anomalies = _collect(anomaly, k, n)
        g_inj = CSRGraph.from_edges(n, np.concatenate([normal[:, 0], self.anomalies[:, 0]]),
                                    np.concatenate([normal[:, 1], self.anomalies[:, 1]]))
        graphs = list(snapshots.graphs)
        graphs[t_cur] = g_inj
        present = list(snapshots.present)
        present[t_cur] = present[t_cur].copy()
        present[t_cur][self.anomalies.ravel()] = True
        self.injected = Snapshots(graphs, present, n, name=snapshots.name, labels=snapshots.labels,
                                  bounds=snapshots.bounds)
        halves = []
        for pairs, label in ((normal, 0.0), (self.anomalies, 1.0)):
            pairs = pairs[rng.permutation(len(pairs))]
            h = len(pairs) // 2
            halves.append(((pairs[:h], np.full(h, label)), (pairs[h:], np.full(len(pairs) - h, label))))
        self.anomaly_clf = (np.concatenate([halves[0][0][0], halves[1][0][0]]),
                            np.concatenate([halves[0][0][1], halves[1][0][1]]))
        self.anomaly_heldout = (np.concatenate([halves[0][1][0], halves[1][1][0]]),
                                np.concatenate([halves[0][1][1], halves[1][1][1]]))

        # ---- node classification: a fixed split, independent of the seed ----
        self.node_labels = snapshots.labels[t_cur] if snapshots.labels else None
        if self.node_labels is not None:
            self.node_train, self.node_test = node_split(self.node_labels)
        else:
            self.node_train = self.node_test = None

    def sizes(self) -> dict:
        out = {f"link_{name}": col.sizes for name, col in self.link.items()}
        out["anomalies"] = int(len(self.anomalies))
        out["anomaly_heldout"] = int(len(self.anomaly_heldout[1]))
        out["recurring_fraction"] = round(self.recurring_fraction, 4)
        if self.node_test is not None:
            out["node_train"], out["node_test"] = int(len(self.node_train)), int(len(self.node_test))
        return out
