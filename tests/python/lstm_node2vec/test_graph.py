# CSR snapshot graphs: symmetric, deduplicated, no self-loops, membership without a dense matrix.
import numpy as np

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
