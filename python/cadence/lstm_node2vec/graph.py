"""Undirected snapshot graphs stored as CSR arrays: memory grows with edges, never nodes squared."""

from __future__ import annotations

import numpy as np


class CSRGraph:
    """An undirected simple graph on nodes 0..n-1 as sorted CSR (indptr, indices).

    Built from an edge list: both directions are stored, duplicates merged, self-loops
    dropped. Rows are sorted, so ``keys = row * n + col`` is sorted too and ``has_edge``
    is one vectorised ``searchsorted`` (no dense adjacency anywhere).
    """

    __slots__ = ("n", "indptr", "indices", "_keys")

    def __init__(self, n: int, indptr: np.ndarray, indices: np.ndarray):
        self.n = int(n)
        self.indptr = indptr
        self.indices = indices
        self._keys = None

    @classmethod
    def from_edges(cls, n: int, src, dst) -> "CSRGraph":
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if src.shape != dst.shape:
            raise ValueError("CSRGraph.from_edges: src and dst differ in length")
        if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
            raise ValueError(f"CSRGraph.from_edges: a node id is outside 0..{n - 1}")
        keep = src != dst
        a = np.concatenate([src[keep], dst[keep]])
        b = np.concatenate([dst[keep], src[keep]])
        keys = np.unique(a * n + b)
        rows = keys // n
        indices = keys % n
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        g = cls(n, indptr, indices)
        g._keys = keys
        return g

    @classmethod
    def from_keys(cls, n: int, keys: np.ndarray) -> "CSRGraph":
        """From sorted, unique, symmetric ``row * n + col`` keys (what ``keys`` returns)."""
        keys = np.asarray(keys, dtype=np.int64)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(keys // n, minlength=n), out=indptr[1:])
        g = cls(n, indptr, keys % n)
        g._keys = keys
        return g

    @classmethod
    def union(cls, graphs) -> "CSRGraph":
        """The graph whose edges are those of any of ``graphs`` (same node set), merged."""
        graphs = list(graphs)
        if not graphs:
            raise ValueError("CSRGraph.union: no graphs")
        return cls.from_keys(graphs[0].n, np.unique(np.concatenate([g.keys for g in graphs])))

    @property
    def keys(self) -> np.ndarray:
        if self._keys is None:
            rows = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.indptr))
            self._keys = rows * self.n + self.indices
        return self._keys

    @property
    def num_edges(self) -> int:
        """Undirected edges (each stored twice)."""
        return int(self.indices.size // 2)

    def degree(self, nodes=None) -> np.ndarray:
        d = np.diff(self.indptr)
        return d if nodes is None else d[np.asarray(nodes)]

    def neighbors(self, v: int) -> np.ndarray:
        return self.indices[self.indptr[v]:self.indptr[v + 1]]

    def has_edge(self, u, v) -> np.ndarray:
        """Vectorised membership test for pairs (u[i], v[i])."""
        u = np.asarray(u, dtype=np.int64)
        v = np.asarray(v, dtype=np.int64)
        q = u * self.n + v
        keys = self.keys
        pos = np.searchsorted(keys, q)
        pos_c = np.minimum(pos, max(keys.size - 1, 0))
        return (pos < keys.size) & (keys[pos_c] == q) if keys.size else np.zeros(q.shape, bool)

    def edge_list(self) -> np.ndarray:
        """Each undirected edge once, as an (m, 2) array with u < v."""
        rows = np.repeat(np.arange(self.n, dtype=np.int64), np.diff(self.indptr))
        m = rows < self.indices
        return np.stack([rows[m], self.indices[m]], axis=1)

    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.indices.nbytes + (self._keys.nbytes if self._keys is not None else 0))
