"""Temporal edge lists: the CSV and SocioPatterns loaders, the shipped data sets, snapshot cutting, and a seeded evolving SBM generator."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field

import numpy as np

from .graph import CSRGraph


class DataError(ValueError):
    """Malformed input; the message starts with ``file:line:``."""


@dataclass
class TemporalEdges:
    """Timestamped events on nodes 0..n-1, sorted by time (stable)."""

    src: np.ndarray
    dst: np.ndarray
    ts: np.ndarray
    n: int
    node_ids: np.ndarray  # original id of node k
    name: str = ""
    labels: np.ndarray = None  # class of node k (int, -1 = none), when the data has one
    label_names: list = field(default_factory=list)  # name of class c


@dataclass
class Snapshots:
    """A sequence of snapshot graphs over one node set.

    ``present[t]`` marks the nodes seen in any event of snapshot t (a self-loop counts:
    it shows the node was active); a present node can still have degree 0.
    """

    graphs: list
    present: list
    n: int
    name: str = ""
    labels: list = field(default_factory=list)  # node classes per snapshot (-1 = none); empty when unlabelled
    bounds: list = field(default_factory=list)  # (first ts, last ts) per snapshot

    def __len__(self):
        return len(self.graphs)


#: The data sets shipped in the repository: name -> (path under the repository root, format).
DATASETS = {
    "fb-messages": (os.path.join("data", "fb-messages", "ml_fb_msg.csv"), "csv"),
    "highschool-2012": (os.path.join("data", "highschool-2012", "thiers_2012.csv"), "sociopatterns"),
}


def default_data_path(name: str = "fb-messages") -> str:
    """The path of a shipped data set (default fb-messages: data/fb-messages/ml_fb_msg.csv).

    Looked for beside the source tree this module lives in (python/cadence/lstm_node2vec/), then
    under the working directory (an installed package carries no data: run from the repository
    root or pass a path).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}: expected one of {', '.join(DATASETS)}")
    here = os.path.dirname(os.path.realpath(__file__))
    rel = DATASETS[name][0]
    candidates = [os.path.normpath(os.path.join(here, "..", "..", "..", rel)), os.path.abspath(rel)]
    for c in candidates:
        if os.path.exists(c):
            return c
    return candidates[0]


def load_dataset(name: str) -> TemporalEdges:
    """A shipped data set by name, read with its format's loader."""
    path = default_data_path(name)
    return load_sociopatterns(path) if DATASETS[name][1] == "sociopatterns" else load_temporal_csv(path)


def _finish(path, src, dst, ts, labels=None) -> TemporalEdges:
    """Sort by time (stable), remap ids to 0..n-1 in increasing order of the original id."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    ts = np.asarray(ts, dtype=np.int64)
    order = np.argsort(ts, kind="stable")
    node_ids, inv = np.unique(np.concatenate([src, dst]), return_inverse=True)
    m = src.size
    ev = TemporalEdges(inv[:m][order], inv[m:][order], ts[order], int(node_ids.size), node_ids,
                       name=os.path.basename(os.path.dirname(path)) or os.path.basename(path))
    if labels is not None:
        names = sorted(set(labels.values()))
        code = {c: k for k, c in enumerate(names)}
        ev.labels = np.array([code[labels[int(i)]] for i in node_ids], dtype=np.int64)
        ev.label_names = names
    return ev


def load_sociopatterns(path: str) -> TemporalEdges:
    """Read SocioPatterns' contact-list format: lines ``t i j Ci Cj`` (tab or space separated, no header).

    A contact between ids i and j active during [t - 20 s, t]; Ci and Cj are their classes (or
    roles), which become the node labels. Each line is one event. Any malformed line raises
    DataError with ``path:line:``; so does a node given two different classes.
    """
    src, dst, ts = [], [], []
    labels = {}
    with open(path) as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 5:
                raise DataError(f"{path}:{line_no}: expected 5 fields 't i j Ci Cj', got {len(fields)}")
            t, i, j = _integers(path, line_no, "field", zip(("t", "i", "j"), fields[:3]))
            _add_edge(path, line_no, (src, dst, ts), i, j, t)
            for node, cls in ((i, fields[3]), (j, fields[4])):
                if labels.setdefault(node, cls) != cls:
                    raise DataError(f"{path}:{line_no}: node {node} has class {cls!r} here but {labels[node]!r} before")
    if not src:
        raise DataError(f"{path}:1: no contact lines")
    return _finish(path, src, dst, ts, labels)


def _add_edge(path, line, edges, u, v, t) -> None:
    """Appends the edge u -> v at time t to the lists ``edges`` (sources, destinations, times);
    DataError naming the file and line for a negative node id."""
    if u < 0 or v < 0:
        raise DataError(f"{path}:{line}: negative node id")
    for column, value in zip(edges, (u, v, t)):
        column.append(value)


def _integers(path, line, what, named) -> list:
    """The integers of (name, text) pairs; DataError naming the file, line and the first that is
    not one."""
    vals = []
    for name, text in named:
        try:
            vals.append(int(text))
        except ValueError:
            raise DataError(f"{path}:{line}: {what} '{name}' is not an integer: {text!r}") from None
    return vals


def load_temporal_csv(path: str, src_col: str = "u", dst_col: str = "i", ts_col: str = "ts") -> TemporalEdges:
    """Read a CSV with a header naming ``src_col``, ``dst_col`` and ``ts_col`` (integers).

    Any malformed row raises DataError with ``path:line:`` (1-based, header is line 1) and
    the column at fault. Rows are stably sorted by time; node ids are remapped to 0..n-1
    in increasing order of the original id.
    """
    src, dst, ts = [], [], []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"{path}:1: empty file, expected a header with columns {src_col},{dst_col},{ts_col}") from None
        cols = {}
        for name in (src_col, dst_col, ts_col):
            if name not in header:
                raise DataError(f"{path}:1: header {header} has no column '{name}'")
            cols[name] = header.index(name)
        width = len(header)
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != width:
                raise DataError(f"{path}:{line}: expected {width} fields, got {len(row)}")
            u, v, t = _integers(path, line, "column", ((n, row[cols[n]].strip()) for n in (src_col, dst_col, ts_col)))
            _add_edge(path, line, (src, dst, ts), u, v, t)
    if not src:
        raise DataError(f"{path}:2: no data rows")
    return _finish(path, src, dst, ts)


def cut_snapshots(events: TemporalEdges, k: int, split: str = "count", cumulative: bool = False) -> Snapshots:
    """Cut a temporal edge list into ``k`` snapshot graphs.

    split="count": each snapshot holds the same number of events (+-1), so quiet months do not
    give empty snapshots (default). split="duration": equal time intervals.
    cumulative=True: snapshot t holds every event up to the end of interval t.
    """
    if k < 1:
        raise ValueError("cut_snapshots: k must be >= 1")
    m = events.src.size
    if split == "count":
        edges = np.linspace(0, m, k + 1).round().astype(np.int64)
    elif split == "duration":
        t0, t1 = int(events.ts[0]), int(events.ts[-1])
        cuts = t0 + (t1 - t0) * np.arange(1, k) / k
        edges = np.concatenate([[0], np.searchsorted(events.ts, cuts, side="right"), [m]]).astype(np.int64)
    else:
        raise ValueError(f"cut_snapshots: split must be 'count' or 'duration', not {split!r}")
    graphs, present, bounds = [], [], []
    for t in range(k):
        lo = 0 if cumulative else edges[t]
        hi = edges[t + 1]
        s, d = events.src[lo:hi], events.dst[lo:hi]
        graphs.append(CSRGraph.from_edges(events.n, s, d))
        p = np.zeros(events.n, dtype=bool)
        p[s] = True
        p[d] = True
        present.append(p)
        bounds.append((int(events.ts[lo]) if hi > lo else None, int(events.ts[hi - 1]) if hi > lo else None))
    labels = [events.labels] * k if events.labels is not None else []
    return Snapshots(graphs, present, events.n, name=events.name, bounds=bounds, labels=labels)


def evolving_sbm(n: int = 200, communities: int = 4, snapshots: int = 6, avg_degree: float = 8.0,
                 p_intra: float = 0.9, move: float = 0.02, persist: float = 0.5, seed: int = 0) -> Snapshots:
    """A seeded evolving stochastic block model, generated in O(edges) memory.

    Each snapshot has about ``n * avg_degree / 2`` edges; a fraction ``p_intra`` joins two
    nodes of the same community (the rest join uniform random pairs). Between snapshots a
    fraction ``move`` of the nodes switch to a random community and a fraction ``persist`` of
    the previous snapshot's edges whose endpoints did not move is kept. Communities are
    returned in ``labels[t]``.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, communities, size=n)
    m = int(round(n * avg_degree / 2))
    graphs, present, all_labels = [], [], []
    prev = np.zeros((0, 2), dtype=np.int64)
    for t in range(snapshots):
        moved = np.zeros(n, dtype=bool)
        if t > 0 and move > 0:
            movers = rng.random(n) < move
            labels = labels.copy()
            labels[movers] = rng.integers(0, communities, size=int(movers.sum()))
            moved = movers
        if persist > 0 and prev.size:
            keep = (rng.random(len(prev)) < persist) & ~moved[prev[:, 0]] & ~moved[prev[:, 1]]
            kept = prev[keep]
        else:
            kept = np.zeros((0, 2), dtype=np.int64)
        fresh = max(m - len(kept), 0)
        order = np.argsort(labels, kind="stable")
        counts = np.bincount(labels, minlength=communities)
        start = np.concatenate([[0], np.cumsum(counts)[:-1]])
        u = rng.integers(0, n, size=fresh)
        intra = rng.random(fresh) < p_intra
        c = labels[u]
        v_intra = order[start[c] + (rng.random(fresh) * counts[c]).astype(np.int64)]
        v_any = rng.integers(0, n, size=fresh)
        v = np.where(intra, v_intra, v_any)
        e = np.concatenate([kept, np.stack([u, v], axis=1)])
        e = e[e[:, 0] != e[:, 1]]
        g = CSRGraph.from_edges(n, e[:, 0], e[:, 1])
        graphs.append(g)
        present.append(g.degree() > 0)
        all_labels.append(labels.copy())
        prev = g.edge_list()
    return Snapshots(graphs, present, n, name=f"sbm(n={n},k={communities},seed={seed})", labels=all_labels)
