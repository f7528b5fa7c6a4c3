"""The LSTM-node2vec pipeline, its baselines and the evaluation protocols (link prediction, anomaly detection)."""

from __future__ import annotations

import time
from dataclasses import dataclass, asdict

import numpy as np
import torch

from .metrics import LogisticRegression, average_precision, roc_auc
from .models import SkipGram, WalkAutoencoder, dynamic_vectors, train_autoencoder, train_skipgram
from .walks import node2vec_walks, skipgram_pairs, temporal_walks


@dataclass
class Config:
    """Every choice the paper leaves open, with its default (docs/lstm-node2vec.md explains each)."""

    dim: int = 32                 # embedding width (LSTM hidden = node2vec width)
    # temporal walks / LSTM autoencoder
    lookback: int = 5             # l: snapshots a temporal walk spans (walk length)
    temporal_walks: int = 10      # temporal walks per node
    walk_mode: str = "anchored"   # "anchored" | "chained"
    absent: str = "pad"           # "pad" | "self": token for a step with no neighbour
    token_dim: int = 16           # LSTM input embedding width
    ae_negatives: int = 20        # sampled-softmax negatives in the decoder (0 = full softmax)
    ae_train_on: str = "active"   # "active": train on walks with a non-padding token; "all"
    ae_epochs: int = 3
    ae_batch: int = 256
    ae_lr: float = 1e-2
    pool: str = "mean"            # "mean" | "max" over a node's walk codes
    # node2vec
    walk_length: int = 20
    walks_per_node: int = 10
    p: float = 1.0
    q: float = 1.0
    window: int = 5
    negatives: int = 5
    n2v_epochs: int = 1
    n2v_batch: int = 4096
    n2v_lr: float = 0.025
    combine: str = "init"         # "init": node2vec starts from the dynamic vectors; "concat": [dynamic, node2vec]
    dyn_walks: str = "changed"    # dynnode2vec baseline: walks from "changed" nodes only, or "all"
    # evaluation
    max_pairs: int = 20000        # cap on positive edges used per task
    anomaly_ratio: float = 0.1    # injected anomalous edges per real edge of the target snapshot
    anomaly_score: str = "classifier"  # "classifier": -(link classifier score); "cosine": -cosine (unsupervised)
    l2: float = 1.0               # logistic regression penalty
    seed: int = 0


def node2vec_embed(graph, cfg: Config, init=None, init_ctx=None, start_nodes=None, seed: int = 0):
    """Biased walks on ``graph`` and skip-gram training; returns the trained SkipGram model and stats."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    walks = node2vec_walks(graph, cfg.walk_length, cfg.walks_per_node, cfg.p, cfg.q, rng, start_nodes=start_nodes)
    t_walk = time.perf_counter() - t0
    dim = cfg.dim if init is None else np.asarray(init).shape[1]
    model = SkipGram(graph.n, dim, init=init, seed=seed)
    if init_ctx is not None:
        with torch.no_grad():
            model.ctx.weight.copy_(torch.as_tensor(init_ctx))
    counts = np.bincount(walks.ravel(), minlength=graph.n).astype(np.float64) if walks.size else np.ones(graph.n)
    noise = counts ** 0.75
    if noise.sum() == 0:
        noise = np.ones(graph.n)
    pairs = skipgram_pairs(walks, cfg.window)
    t1 = time.perf_counter()
    if pairs.size:
        train_skipgram(model, pairs, noise / noise.sum(), cfg.negatives, cfg.n2v_epochs, cfg.n2v_batch,
                       cfg.n2v_lr, seed=seed)
    t_train = time.perf_counter() - t1
    stats = {"walks": int(walks.shape[0]), "walk_seconds": t_walk, "pairs": int(pairs.shape[0]),
             "train_seconds": t_train}
    return model, stats


def lstm_dynamic(snapshots, t_cur: int, cfg: Config, seed: int = 0, log=None):
    """Temporal walks ending at ``t_cur``, autoencoder training, pooled codes; returns (vectors, stats)."""
    t0 = time.perf_counter()
    walks, owner = temporal_walks(snapshots, t_cur, cfg.lookback, cfg.temporal_walks, seed=seed,
                                  mode=cfg.walk_mode, absent=cfg.absent)
    t_walk = time.perf_counter() - t0
    torch.manual_seed(seed)
    model = WalkAutoencoder(snapshots.n, cfg.token_dim, cfg.dim, cfg.ae_negatives)
    if cfg.ae_train_on == "active":
        train = walks[(walks != snapshots.n).any(axis=1)]
        if train.shape[0] == 0:
            train = walks
    elif cfg.ae_train_on == "all":
        train = walks
    else:
        raise ValueError(f"ae_train_on must be 'active' or 'all', not {cfg.ae_train_on!r}")
    t1 = time.perf_counter()
    losses = train_autoencoder(model, train, cfg.ae_epochs, cfg.ae_batch, cfg.ae_lr, seed=seed, log=log)
    t_train = time.perf_counter() - t1
    vecs = dynamic_vectors(model, walks, owner, snapshots.n, pool=cfg.pool)
    return vecs, {"walks": int(walks.shape[0]), "trained_walks": int(train.shape[0]), "walk_seconds": t_walk, "train_seconds": t_train,
                  "losses": losses}


def _changed_nodes(g_old, g_new) -> np.ndarray:
    """Nodes whose neighbour set differs between two snapshots (dynnode2vec's evolving nodes)."""
    diff = np.setxor1d(g_old.keys, g_new.keys, assume_unique=True)
    return np.unique(diff // g_new.n)


def embeddings(snapshots, t_cur: int, cfg: Config, methods=None, log=None):
    """Embeddings at ``t_cur`` for each method; returns {method: (vectors, seconds)}."""
    methods = methods or ["lstm-node2vec", "lstm-node2vec-concat", "lstm-ae", "node2vec", "dynnode2vec"]
    out = {}
    g = snapshots.graphs[t_cur]
    need_dyn = any(m.startswith("lstm") for m in methods)
    if need_dyn:
        t0 = time.perf_counter()
        dyn, dstats = lstm_dynamic(snapshots, t_cur, cfg, seed=cfg.seed, log=log)
        dyn_seconds = time.perf_counter() - t0
        if log:
            log(f"lstm autoencoder: {dstats['walks']} walks ({dstats['trained_walks']} with a neighbour, trained on) in {dstats['walk_seconds']:.2f}s, "
                f"trained in {dstats['train_seconds']:.2f}s, loss {dstats['losses'][0]:.3f} -> {dstats['losses'][-1]:.3f}")
    for m in methods:
        t0 = time.perf_counter()
        if m == "lstm-ae":
            out[m] = (dyn, dyn_seconds)
            continue
        if m == "lstm-node2vec":
            combine = cfg.combine
        elif m == "lstm-node2vec-concat":
            combine = "concat"
        elif m in ("node2vec", "dynnode2vec"):
            combine = None
        else:
            raise ValueError(f"unknown method {m!r}")
        if combine == "init":
            model, _ = node2vec_embed(g, cfg, init=dyn, seed=cfg.seed + 1)
            vec = model.inp.weight.detach().numpy().copy()
        elif combine == "concat":
            model, _ = node2vec_embed(g, cfg, seed=cfg.seed + 1)
            vec = np.hstack([dyn, model.inp.weight.detach().numpy()])
        elif m == "node2vec":
            model, _ = node2vec_embed(g, cfg, seed=cfg.seed + 1)
            vec = model.inp.weight.detach().numpy().copy()
        else:  # dynnode2vec-style: train on t_cur - 1, warm-start on t_cur
            if t_cur == 0:
                raise ValueError("dynnode2vec needs a previous snapshot")
            prev, _ = node2vec_embed(snapshots.graphs[t_cur - 1], cfg, seed=cfg.seed + 2)
            starts = _changed_nodes(snapshots.graphs[t_cur - 1], g) if cfg.dyn_walks == "changed" else None
            model, _ = node2vec_embed(g, cfg, init=prev.inp.weight.detach().numpy(),
                                      init_ctx=prev.ctx.weight.detach(), start_nodes=starts, seed=cfg.seed + 1)
            vec = model.inp.weight.detach().numpy().copy()
        secs = time.perf_counter() - t0 + (dyn_seconds if combine else 0.0)
        out[m] = (vec, secs)
        if log:
            log(f"{m}: {secs:.1f}s")
    return out


def _sample_non_edges(graphs, n: int, count: int, rng) -> np.ndarray:
    """``count`` distinct-endpoint pairs that are edges in none of ``graphs``."""
    got = []
    need = count
    for _ in range(100):
        if need <= 0:
            break
        u = rng.integers(0, n, size=2 * need + 16)
        v = rng.integers(0, n, size=u.size)
        ok = u != v
        for g in graphs:
            ok &= ~g.has_edge(u, v)
        pairs = np.stack([u[ok], v[ok]], axis=1)[:need]
        got.append(pairs)
        need -= len(pairs)
    return np.concatenate(got) if got else np.zeros((0, 2), dtype=np.int64)


def hadamard(vec: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    return vec[pairs[:, 0]] * vec[pairs[:, 1]]


def cosine(vec: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    a, b = vec[pairs[:, 0]], vec[pairs[:, 1]]
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


class Tasks:
    """The evaluation sets for predicting snapshot ``t_cur + 1`` from embeddings at ``t_cur``, drawn once so every method sees the same pairs."""

    def __init__(self, snapshots, t_cur: int, cfg: Config):
        rng = np.random.default_rng(cfg.seed + 1000)
        target = snapshots.graphs[t_cur + 1]
        pos = target.edge_list()
        if len(pos) > cfg.max_pairs:
            pos = pos[rng.choice(len(pos), cfg.max_pairs, replace=False)]
        if len(pos) < 4:
            raise ValueError(f"snapshot {t_cur + 1} has {len(pos)} edges: too few to evaluate link prediction")
        neg = _sample_non_edges([target], snapshots.n, len(pos), rng)
        pairs = np.concatenate([pos, neg])
        y = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
        perm = rng.permutation(len(y))
        half = len(y) // 2
        self.train_pairs, self.train_y = pairs[perm[:half]], y[perm[:half]]
        self.test_pairs, self.test_y = pairs[perm[half:]], y[perm[half:]]
        # anomaly detection: real edges of the target snapshot vs injected edges that exist neither
        # in the target nor in the current snapshot
        k = max(1, int(round(cfg.anomaly_ratio * len(pos))))
        anom = _sample_non_edges([target, snapshots.graphs[t_cur]], snapshots.n, k, rng)
        self.anomaly_pairs = np.concatenate([pos, anom])
        self.anomaly_y = np.concatenate([np.zeros(len(pos)), np.ones(len(anom))])


def evaluate(vec: np.ndarray, tasks: Tasks, cfg: Config) -> dict:
    """link_auc, link_ap (logistic regression on Hadamard features) and anomaly_auc."""
    clf = LogisticRegression(l2=cfg.l2).fit(hadamard(vec, tasks.train_pairs), tasks.train_y)
    s = clf.decision_function(hadamard(vec, tasks.test_pairs))
    if cfg.anomaly_score == "cosine":
        a = -cosine(vec, tasks.anomaly_pairs)
    elif cfg.anomaly_score == "classifier":
        a = -clf.decision_function(hadamard(vec, tasks.anomaly_pairs))
    else:
        raise ValueError(f"anomaly_score must be 'cosine' or 'classifier', not {cfg.anomaly_score!r}")
    return {"link_auc": roc_auc(tasks.test_y, s), "link_ap": average_precision(tasks.test_y, s),
            "anomaly_auc": roc_auc(tasks.anomaly_y, a)}


def community_auc(vec: np.ndarray, labels: np.ndarray, pairs: int = 5000, seed: int = 0) -> float:
    """AUC of cosine similarity for telling same-community pairs from different-community pairs."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, len(labels), size=pairs)
    v = rng.integers(0, len(labels), size=pairs)
    keep = u != v
    p = np.stack([u[keep], v[keep]], axis=1)
    return roc_auc(labels[p[:, 0]] == labels[p[:, 1]], cosine(vec, p))


def run(snapshots, cfg: Config, methods=None, t_cur=None, log=None) -> dict:
    """Embed at ``t_cur`` (default: second-to-last snapshot), evaluate on the next one."""
    t_cur = len(snapshots) - 2 if t_cur is None else t_cur
    if t_cur < 1:
        raise ValueError("run: needs at least 3 snapshots (history, current, target)")
    tasks = Tasks(snapshots, t_cur, cfg)
    embs = embeddings(snapshots, t_cur, cfg, methods, log=log)
    rows = []
    for m, (vec, secs) in embs.items():
        r = {"method": m}
        r.update(evaluate(vec, tasks, cfg))
        r["seconds"] = round(secs, 2)
        rows.append(r)
    g = snapshots.graphs[t_cur]
    return {"dataset": {"name": snapshots.name, "nodes": snapshots.n, "snapshots": len(snapshots),
                        "current_snapshot": t_cur, "current_edges": g.num_edges,
                        "target_edges": snapshots.graphs[t_cur + 1].num_edges},
            "config": asdict(cfg), "methods": rows}
