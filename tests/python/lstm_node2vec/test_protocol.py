# The evaluation protocol's sets (docs/lstm-node2vec.md): negatives are what they claim to be, splits are
# disjoint, anomalies are in the embedded snapshot, no method sees the target snapshot.
import dataclasses
from collections import deque

import numpy as np
import pytest

from cadence.lstm_node2vec import CSRGraph, Config, Snapshots, Tasks, embeddings, evolving_sbm, node_split

CFG = Config(dim=8, token_dim=4, lookback=3, temporal_walks=3, ae_epochs=1, ae_batch=128, walk_length=8,
             walks_per_node=3, window=3, n2v_batch=1024)


@pytest.fixture(scope="module")
def sbm():
    # sparse (average degree 3), so distance-2 pairs, new edges and inactive nodes all exist
    return evolving_sbm(n=200, communities=4, snapshots=6, avg_degree=3, seed=3)


def edge_set(g):
    return {(int(u), int(v)) for u, v in g.edge_list()}


def pair_set(pairs):
    return {(int(u), int(v)) for u, v in pairs}


def bfs_distance(g, src, dst):
    seen, todo = {src: 0}, deque([src])
    while todo:
        x = todo.popleft()
        if x == dst:
            return seen[x]
        for y in g.neighbors(x):
            if int(y) not in seen:
                seen[int(y)] = seen[x] + 1
                todo.append(int(y))
    return None


def test_every_column_has_disjoint_unique_canonical_train_and_test_pairs(sbm):
    tasks = Tasks(sbm, 4, CFG)
    target = edge_set(sbm.graphs[5])
    for name, col in tasks.link.items():
        tr, te = pair_set(col.train_pairs), pair_set(col.test_pairs)
        assert len(tr) == len(col.train_pairs) and len(te) == len(col.test_pairs), name  # unique
        assert not tr & te, name
        for pairs, y in ((col.train_pairs, col.train_y), (col.test_pairs, col.test_y)):
            assert np.all(pairs[:, 0] < pairs[:, 1])
            for (u, v), label in zip(pairs.tolist(), y):
                assert ((u, v) in target) == bool(label), (name, u, v)  # positives are target edges, negatives are not
        assert col.train_y.sum() > 0 and (col.test_y == 0).sum() > 0, name
    # a positive keeps its half in every column
    uni = tasks.link["uniform"]
    uni_train = pair_set(uni.train_pairs[uni.train_y == 1])
    for col in tasks.link.values():
        assert pair_set(col.train_pairs[col.train_y == 1]) <= uni_train
        assert not pair_set(col.test_pairs[col.test_y == 1]) & uni_train


def test_hard_and_distance_two_columns_use_only_nodes_active_in_the_window(sbm):
    tasks = Tasks(sbm, 4, CFG)  # window: snapshots 2, 3, 4
    active = set()
    for t in (2, 3, 4):
        for u, v in sbm.graphs[t].edge_list():
            active |= {int(u), int(v)}
    assert set(tasks.active.tolist()) == active and len(active) < sbm.n  # some nodes are inactive
    for name in ("hard", "dist2"):
        col = tasks.link[name]
        for pairs in (col.train_pairs, col.test_pairs):
            assert all(int(u) in active and int(v) in active for u, v in pairs), name


def test_distance_two_negatives_are_at_distance_exactly_two_in_the_current_snapshot(sbm):
    tasks = Tasks(sbm, 4, CFG)
    g = sbm.graphs[4]
    col = tasks.link["dist2"]
    neg = np.concatenate([col.train_pairs[col.train_y == 0], col.test_pairs[col.test_y == 0]])
    assert len(neg) > 50
    assert all(bfs_distance(g, int(u), int(v)) == 2 for u, v in neg)


def test_the_new_column_tests_only_ties_absent_from_every_embedded_graph(sbm):
    tasks = Tasks(sbm, 4, CFG)
    embedded = set()
    for t in (2, 3, 4):
        embedded |= edge_set(sbm.graphs[t]) | edge_set(tasks.injected.graphs[t])
    col = tasks.link["new"]
    for pairs in (col.train_pairs, col.test_pairs):  # positives and negatives alike
        assert not pair_set(pairs) & embedded
    assert 0.0 < tasks.recurring_fraction < 1.0


def test_injected_anomalies_are_in_the_embedded_snapshot_and_nowhere_else(sbm):
    tasks = Tasks(sbm, 4, CFG)
    g, g_inj = sbm.graphs[4], tasks.injected.graphs[4]
    anomalies = pair_set(tasks.anomalies)
    assert len(anomalies) == round(0.1 * g.num_edges)
    assert edge_set(g_inj) == edge_set(g) | anomalies  # the real edges plus the injected ones
    assert not anomalies & (edge_set(sbm.graphs[2]) | edge_set(sbm.graphs[3]) | edge_set(g) | edge_set(sbm.graphs[5]))
    deg = g.degree()
    assert all(deg[u] > 0 and deg[v] > 0 for u, v in anomalies)  # between nodes active in snapshot t
    assert all(tasks.injected.graphs[t] is sbm.graphs[t] for t in (0, 1, 2, 3, 5))
    # the held-out half and the classifier half partition the injected snapshot's edges
    clf, held = pair_set(tasks.anomaly_clf[0]), pair_set(tasks.anomaly_heldout[0])
    assert not clf & held and clf | held == edge_set(g_inj)
    for pairs, y in (tasks.anomaly_clf, tasks.anomaly_heldout):
        assert all(((u, v) in anomalies) == bool(label) for (u, v), label in zip(pairs.tolist(), y))
        assert y.sum() > 0


def test_the_sets_are_seeded():
    s = evolving_sbm(n=120, snapshots=5, avg_degree=4, seed=1)
    a, b, c = Tasks(s, 3, CFG), Tasks(s, 3, CFG), Tasks(s, 3, dataclasses.replace(CFG, seed=1))
    assert np.array_equal(a.link["hard"].test_pairs, b.link["hard"].test_pairs)
    assert np.array_equal(a.anomalies, b.anomalies)
    assert not np.array_equal(a.link["uniform"].test_pairs, c.link["uniform"].test_pairs)


def test_no_embedding_reads_the_target_snapshot(sbm):
    # the same history with a scrambled target snapshot gives the same vectors, method by method
    other = evolving_sbm(n=200, communities=4, snapshots=6, avg_degree=3, seed=99).graphs[5]
    scrambled = Snapshots(sbm.graphs[:5] + [other], sbm.present[:5] + [other.degree() > 0], sbm.n)
    methods = ["lstm-node2vec", "lstm-ae", "node2vec", "node2vec-union", "dynnode2vec", "activity"]
    a = embeddings(sbm, 4, CFG, methods)
    b = embeddings(scrambled, 4, CFG, methods)
    for m in methods:
        assert np.array_equal(a[m][0], b[m][0]), m


def test_the_node_split_is_fixed_stratified_and_disjoint():
    labels = np.array([0] * 10 + [1] * 7 + [2] * 1 + [-1] * 4)
    train, test = node_split(labels)
    train2, test2 = node_split(labels)
    assert np.array_equal(train, train2) and np.array_equal(test, test2)
    assert not set(train) & set(test) and set(train) | set(test) == set(range(18))
    assert [int((labels[test] == c).sum()) for c in (0, 1, 2)] == [5, 3, 0]


def test_union_graph_is_the_union_of_edge_sets():
    s = evolving_sbm(n=60, snapshots=3, avg_degree=3, seed=2)
    u = CSRGraph.union(s.graphs)
    assert edge_set(u) == edge_set(s.graphs[0]) | edge_set(s.graphs[1]) | edge_set(s.graphs[2])
    assert np.array_equal(u.keys, np.sort(u.keys))
