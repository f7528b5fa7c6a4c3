"""Temporal walks over snapshots (LSTM input) and node2vec's biased walks (static part), vectorised over CSR."""

from __future__ import annotations

import numpy as np

from .graph import CSRGraph


def _sample_neighbors(g: CSRGraph, cur: np.ndarray, rng: np.random.Generator):
    """One uniform neighbour of each node in ``cur``; returns (next, has_neighbor)."""
    lo = g.indptr[cur]
    deg = g.indptr[cur + 1] - lo
    ok = deg > 0
    r = (rng.random(cur.size) * deg).astype(np.int64)
    nxt = np.where(ok, g.indices[np.minimum(lo + r, max(g.indices.size - 1, 0))] if g.indices.size else cur, cur)
    return nxt, ok


def temporal_walks(snapshots, t_end: int, lookback: int, walks_per_node: int, seed=0,
                   nodes=None, mode: str = "anchored", absent: str = "pad"):
    """Walks through time: step j samples a neighbour in snapshot ``t_end - lookback + 1 + j``.

    mode="anchored" (default): every step samples a neighbour of the walk's own node, so a walk
    is one draw of the node's neighbour history over the last ``lookback`` snapshots.
    mode="chained": each step samples a neighbour of the previous step's node (the walk moves
    through the graph as it moves through time).

    Rules for a step whose node has no neighbour in that snapshot (isolated, absent from the
    snapshot, or the snapshot index is before the first one):
    absent="pad" (default): emit the padding token ``n`` and stay on the same node;
    absent="self": emit the node itself and stay.

    Returns ``(walks, owner)``: an int64 array (len(nodes) * walks_per_node, lookback) of tokens
    in 0..n (n = padding), and the node each walk belongs to. Deterministic for a given seed.
    """
    if mode not in ("anchored", "chained"):
        raise ValueError(f"temporal_walks: mode must be 'anchored' or 'chained', not {mode!r}")
    if absent not in ("pad", "self"):
        raise ValueError(f"temporal_walks: absent must be 'pad' or 'self', not {absent!r}")
    if lookback < 1 or walks_per_node < 1:
        raise ValueError("temporal_walks: lookback and walks_per_node must be >= 1")
    if not 0 <= t_end < len(snapshots):
        raise ValueError(f"temporal_walks: t_end {t_end} outside 0..{len(snapshots) - 1}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    n = snapshots.n
    nodes = np.arange(n, dtype=np.int64) if nodes is None else np.asarray(nodes, dtype=np.int64)
    owner = np.repeat(nodes, walks_per_node)
    walks = np.empty((owner.size, lookback), dtype=np.int64)
    cur = owner.copy()
    for j in range(lookback):
        t = t_end - lookback + 1 + j
        src = owner if mode == "anchored" else cur
        if t < 0:
            nxt, ok = src, np.zeros(src.size, dtype=bool)
        else:
            nxt, ok = _sample_neighbors(snapshots.graphs[t], src, rng)
        walks[:, j] = np.where(ok, nxt, n if absent == "pad" else src)
        if mode == "chained":
            cur = np.where(ok, nxt, cur)
    return walks, owner


def node2vec_walks(g: CSRGraph, walk_length: int, walks_per_node: int, p: float = 1.0, q: float = 1.0,
                   seed=0, start_nodes=None, max_tries: int = 64) -> np.ndarray:
    """node2vec's second-order biased walks, vectorised with rejection sampling.

    From current c having come from t, a uniform neighbour x is accepted with probability
    w(x) / max(1/p, 1, 1/q), w = 1/p if x == t, 1 if x is a neighbour of t, 1/q otherwise;
    that is exactly node2vec's transition distribution. Walks start only at nodes with at
    least one neighbour (an isolated node has no walk and keeps its initial vector).
    Returns an int64 array (walks, walk_length).
    """
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    starts = np.arange(g.n, dtype=np.int64) if start_nodes is None else np.asarray(start_nodes, dtype=np.int64)
    starts = starts[g.degree(starts) > 0]
    starts = np.tile(starts, walks_per_node)
    rng.shuffle(starts)
    walks = np.empty((starts.size, walk_length), dtype=np.int64)
    if starts.size == 0:
        return walks
    walks[:, 0] = starts
    if walk_length == 1:
        return walks
    walks[:, 1], _ = _sample_neighbors(g, starts, rng)
    biased = not (p == 1.0 and q == 1.0)
    wmax = max(1.0 / p, 1.0, 1.0 / q)
    for j in range(2, walk_length):
        prev, cur = walks[:, j - 2], walks[:, j - 1]
        nxt, _ = _sample_neighbors(g, cur, rng)
        if biased:
            todo = np.arange(cur.size)
            for _ in range(max_tries):
                x = nxt[todo]
                t = prev[todo]
                w = np.where(x == t, 1.0 / p, np.where(g.has_edge(t, x), 1.0, 1.0 / q))
                accept = rng.random(todo.size) * wmax < w
                todo = todo[~accept]
                if todo.size == 0:
                    break
                nxt[todo], _ = _sample_neighbors(g, cur[todo], rng)
            # after max_tries the last proposal stands (probability < (1 - min w / wmax)^max_tries)
        walks[:, j] = nxt
    return walks


def skipgram_pairs(walks: np.ndarray, window: int) -> np.ndarray:
    """(center, context) pairs within ``window`` steps, both directions; (pairs, 2) int64."""
    out = []
    L = walks.shape[1]
    for o in range(1, min(window, L - 1) + 1):
        a, b = walks[:, :-o].ravel(), walks[:, o:].ravel()
        out.append(np.stack([a, b], axis=1))
        out.append(np.stack([b, a], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 2), dtype=np.int64)
