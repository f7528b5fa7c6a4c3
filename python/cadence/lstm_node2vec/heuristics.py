"""Link heuristics on one snapshot (common neighbours, Adamic-Adar, preferential attachment) and the activity profile, vectorised over CSR."""

from __future__ import annotations

import numpy as np

from .graph import CSRGraph


def _common(g: CSRGraph, pairs: np.ndarray):
    """For each pair, its common neighbours: (pair index, neighbour) rows, one per common neighbour.

    Expands the neighbours of the endpoint with the smaller degree and tests each against the
    other endpoint with ``has_edge``: cost and memory are the sum of the smaller degrees, never n x n.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    u, v = pairs[:, 0], pairs[:, 1]
    deg = g.degree()
    swap = deg[u] > deg[v]
    a, b = np.where(swap, v, u), np.where(swap, u, v)
    counts = deg[a]
    idx = np.repeat(np.arange(len(pairs)), counts)
    offsets = np.arange(idx.size) - np.repeat(np.cumsum(counts) - counts, counts)
    w = g.indices[np.repeat(g.indptr[a], counts) + offsets] if idx.size else np.zeros(0, dtype=np.int64)
    hit = g.has_edge(w, b[idx]) if idx.size else np.zeros(0, dtype=bool)
    return idx[hit], w[hit]


def common_neighbours(g: CSRGraph, pairs: np.ndarray) -> np.ndarray:
    """|N(u) & N(v)| for each pair (u, v)."""
    idx, _ = _common(g, pairs)
    return np.bincount(idx, minlength=len(pairs)).astype(np.float64)


def adamic_adar(g: CSRGraph, pairs: np.ndarray) -> np.ndarray:
    """Sum over common neighbours w of 1 / log(deg w) (a common neighbour has degree >= 2)."""
    idx, w = _common(g, pairs)
    return np.bincount(idx, weights=1.0 / np.log(g.degree()[w]), minlength=len(pairs))


def preferential_attachment(g: CSRGraph, pairs: np.ndarray) -> np.ndarray:
    """deg(u) * deg(v)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    d = g.degree().astype(np.float64)
    return d[pairs[:, 0]] * d[pairs[:, 1]]


HEURISTICS = {"cn": common_neighbours, "aa": adamic_adar, "pa": preferential_attachment}


def activity_vectors(snapshots, t_end: int, lookback: int) -> np.ndarray:
    """A node's activity profile: log(1 + degree) in each of snapshots t_end-lookback+1..t_end (0 before the first).

    What the LSTM can see of a node's activity, without learning anything: the baseline that
    measures how far "active recently, and how much" gets on its own.
    """
    out = np.zeros((snapshots.n, lookback), dtype=np.float32)
    for j in range(lookback):
        t = t_end - lookback + 1 + j
        if t >= 0:
            out[:, j] = np.log1p(snapshots.graphs[t].degree())
    return out
