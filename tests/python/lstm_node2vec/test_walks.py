# Temporal walks and node2vec walks: sampling distributions against exact values, determinism, edge cases.
import numpy as np
import pytest

from cadence.lstm_node2vec import CSRGraph, Snapshots, evolving_sbm, node2vec_walks, skipgram_pairs, temporal_walks


def snaps(n, *edge_lists):
    graphs = [CSRGraph.from_edges(n, [a for a, _ in e], [b for _, b in e]) for e in edge_lists]
    return Snapshots(graphs, [g.degree() > 0 for g in graphs], n)


def test_an_anchored_walk_samples_the_nodes_neighbours_uniformly_in_each_snapshot():
    s = snaps(5, [(1, 2)], [(0, 1), (0, 2), (0, 3)], [(0, 4)])
    walks, owner = temporal_walks(s, t_end=2, lookback=3, walks_per_node=30000, seed=1, nodes=[0])
    assert walks.shape == (30000, 3) and (owner == 0).all()
    assert (walks[:, 0] == 5).all()          # node 0 absent from snapshot 0: padding token n
    assert (walks[:, 2] == 4).all()          # its only neighbour in snapshot 2
    freq = np.bincount(walks[:, 1], minlength=6)[1:4] / 30000
    assert np.allclose(freq, 1 / 3, atol=0.015)  # 3 sigma of a binomial with 30000 draws is 0.008


def test_steps_before_the_first_snapshot_and_absent_steps_follow_the_absent_rule():
    s = snaps(3, [(0, 1)], [(1, 2)])
    pad, _ = temporal_walks(s, t_end=1, lookback=3, walks_per_node=1, seed=0)
    assert pad.tolist() == [[3, 1, 3], [3, 0, 2], [3, 3, 1]]
    own, _ = temporal_walks(s, t_end=1, lookback=3, walks_per_node=1, seed=0, absent="self")
    assert own.tolist() == [[0, 1, 0], [1, 0, 2], [2, 2, 1]]


def test_a_chained_walk_moves_through_the_graph_as_it_moves_through_time():
    s = snaps(3, [(0, 1)], [(1, 2)])
    w, _ = temporal_walks(s, t_end=1, lookback=2, walks_per_node=1, seed=0, nodes=[0], mode="chained")
    assert w.tolist() == [[1, 2]]
    w, _ = temporal_walks(s, t_end=1, lookback=2, walks_per_node=1, seed=0, nodes=[0], mode="anchored")
    assert w.tolist() == [[1, 3]]


def test_walks_are_deterministic_under_a_seed():
    s = evolving_sbm(n=100, snapshots=4, seed=3)
    a, _ = temporal_walks(s, 3, 4, 5, seed=7)
    b, _ = temporal_walks(s, 3, 4, 5, seed=7)
    c, _ = temporal_walks(s, 3, 4, 5, seed=8)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    g = s.graphs[3]
    x = node2vec_walks(g, 8, 3, p=0.5, q=2.0, seed=7)
    y = node2vec_walks(g, 8, 3, p=0.5, q=2.0, seed=7)
    assert np.array_equal(x, y)


def test_every_walk_step_is_an_edge_of_its_snapshot():
    s = evolving_sbm(n=80, snapshots=4, seed=1)
    w, owner = temporal_walks(s, 3, 4, 3, seed=0)
    for j in range(4):
        real = w[:, j] != 80
        assert s.graphs[j].has_edge(owner[real], w[real, j]).all()
    nw = node2vec_walks(s.graphs[3], 10, 2, p=2.0, q=0.5, seed=0)
    assert s.graphs[3].has_edge(nw[:, :-1].ravel(), nw[:, 1:].ravel()).all()


def test_node2vec_walks_follow_the_p_q_transition_probabilities():
    # from 1 having come from 0: back to 0 has weight 1/p, to 2 (a neighbour of 0) weight 1, to 3 and 4 weight 1/q
    g = CSRGraph.from_edges(5, [0, 0, 1, 1, 1], [1, 2, 2, 3, 4])
    w = node2vec_walks(g, 3, 40000, p=0.5, q=2.0, seed=2, start_nodes=[0])
    via1 = w[w[:, 1] == 1]
    assert abs(len(via1) / len(w) - 0.5) < 0.015
    freq = np.bincount(via1[:, 2], minlength=5) / len(via1)
    assert np.allclose(freq, [0.5, 0.0, 0.25, 0.125, 0.125], atol=0.015)


def test_isolated_nodes_start_no_node2vec_walk_and_are_never_visited():
    g = CSRGraph.from_edges(6, [0, 1, 2], [1, 2, 0])  # 3, 4, 5 isolated
    w = node2vec_walks(g, 5, 4, seed=0)
    assert w.shape == (12, 5) and w.max() <= 2
    assert node2vec_walks(CSRGraph.from_edges(3, [], []), 5, 4, seed=0).shape == (0, 5)


def test_skipgram_pairs_cover_each_window_offset_in_both_directions():
    pairs = skipgram_pairs(np.array([[0, 1, 2]]), window=2)
    assert sorted(map(tuple, pairs.tolist())) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]


def test_bad_walk_arguments_are_rejected():
    s = snaps(2, [(0, 1)])
    with pytest.raises(ValueError):
        temporal_walks(s, 0, 1, 1, mode="sideways")
    with pytest.raises(ValueError):
        temporal_walks(s, 0, 1, 1, absent="skip")
    with pytest.raises(ValueError):
        temporal_walks(s, 1, 1, 1)
