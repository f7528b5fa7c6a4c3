# CSR snapshot graphs: symmetric, deduplicated, no self-loops, membership without a dense matrix.
import numpy as np
import pytest

from cadence.lstm_node2vec import CSRGraph


def test_csr_is_symmetric_deduplicated_and_drops_self_loops():
    g = CSRGraph.from_edges(5, [0, 1, 0, 2, 3], [1, 0, 2, 2, 4])
    assert g.num_edges == 3
    assert list(g.neighbors(0)) == [1, 2]
    assert list(g.neighbors(2)) == [0]
    assert list(g.degree()) == [2, 1, 1, 1, 1]
    assert g.edge_list().tolist() == [[0, 1], [0, 2], [3, 4]]


def test_has_edge_matches_a_brute_force_set():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 40, 100), rng.integers(0, 40, 100)
    g = CSRGraph.from_edges(40, src, dst)
    truth = {(int(a), int(b)) for a, b in zip(src, dst) if a != b} | {(int(b), int(a)) for a, b in zip(src, dst) if a != b}
    u, v = rng.integers(0, 40, 2000), rng.integers(0, 40, 2000)
    assert g.has_edge(u, v).tolist() == [(int(a), int(b)) in truth for a, b in zip(u, v)]
    assert not CSRGraph.from_edges(3, [], []).has_edge([0], [1]).any()


def test_memory_grows_with_edges_not_nodes_squared():
    small = CSRGraph.from_edges(1000, np.arange(999), np.arange(1, 1000))
    big = CSRGraph.from_edges(100000, np.arange(999), np.arange(1, 1000))
    # 100x the nodes, same edges: only the n+1 row pointers grow
    assert big.nbytes() - small.nbytes() == (100000 - 1000) * 8


def test_the_scaling_measurement_reports_memory_that_follows_edges():
    from cadence.lstm_node2vec import Config
    from cadence.lstm_node2vec.scaling import measure
    cfg = Config(dim=8, token_dim=4, temporal_walks=2, walks_per_node=2, walk_length=6)
    sparse = measure(400, 4.0, cfg, snapshots=3, train_walks=100, train_pairs=1000)
    dense = measure(400, 16.0, cfg, snapshots=3, train_walks=100, train_pairs=1000)
    assert dense["edges_all_snapshots"] > 3 * sparse["edges_all_snapshots"]
    assert dense["graph_bytes"] > 2.5 * sparse["graph_bytes"]
    assert dense["model_bytes"] == sparse["model_bytes"]  # parameters depend on n, not on edges
    for k in ("temporal_walks_per_s", "node2vec_walks_per_s", "ae_train_walks_per_s", "skipgram_pairs_per_s"):
        assert sparse[k] > 0


def test_link_heuristics_match_brute_force_neighbour_sets():
    from cadence.lstm_node2vec import adamic_adar, common_neighbours, preferential_attachment
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, 30, 120), rng.integers(0, 30, 120)
    g = CSRGraph.from_edges(30, src, dst)
    nb = {v: set(g.neighbors(v).tolist()) for v in range(30)}
    pairs = rng.integers(0, 30, (300, 2))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]  # the protocol never scores a node with itself
    cn = common_neighbours(g, pairs)
    aa = adamic_adar(g, pairs)
    pa = preferential_attachment(g, pairs)
    for k, (u, v) in enumerate(pairs.tolist()):
        common = nb[u] & nb[v]
        assert cn[k] == len(common)
        assert aa[k] == pytest.approx(sum(1 / np.log(len(nb[w])) for w in common))
        assert pa[k] == len(nb[u]) * len(nb[v])


def test_activity_vectors_are_log_degrees_over_the_window():
    from cadence.lstm_node2vec import activity_vectors, evolving_sbm
    s = evolving_sbm(n=50, snapshots=3, avg_degree=3, seed=0)
    a = activity_vectors(s, 2, 4)  # the first column is before snapshot 0
    assert a.shape == (50, 4) and np.all(a[:, 0] == 0)
    for j, t in enumerate((0, 1, 2), start=1):
        assert np.allclose(a[:, j], np.log1p(s.graphs[t].degree()))
