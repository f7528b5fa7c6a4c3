"""The LSTM-node2vec pipeline, its baselines, and the protocol's runs over seeds (docs/lstm-node2vec.md, "Evaluation protocol")."""

from __future__ import annotations

import time
from dataclasses import dataclass, asdict, replace

import numpy as np
import torch

from .graph import CSRGraph
from .heuristics import HEURISTICS, activity_vectors
from .metrics import LogisticRegression, OneVsRest, average_precision, macro_f1, roc_auc
from .models import SkipGram, WalkAutoencoder, dynamic_vectors, train_autoencoder, train_skipgram
from .protocol import LINK_COLUMNS, Tasks
from .stats import mean_ci, paired_difference
from .walks import node2vec_walks, skipgram_pairs, temporal_walks

#: Methods that produce node vectors, in table order.
EMBEDDING_METHODS = ["lstm-node2vec", "lstm-node2vec-concat", "lstm-ae", "node2vec", "node2vec-union", "dynnode2vec",
                     "activity"]
#: Every method: the embeddings, then the pair heuristics on the current snapshot.
ALL_METHODS = EMBEDDING_METHODS + list(HEURISTICS)
#: The method the differences are taken against (the paper's).
REFERENCE = "lstm-node2vec"
#: Metrics in table order (node_f1 only where the data has labels; the heuristics have no classifier score).
METRICS = list(LINK_COLUMNS.values()) + ["link_ap", "anomaly_auc", "anomaly_auc_clf", "node_f1"]


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
    # evaluation (docs/lstm-node2vec.md, "Evaluation protocol")
    max_pairs: int = 20000        # cap on positive edges (of the target snapshot) per task
    anomaly_ratio: float = 0.1    # anomalous edges injected into the embedded snapshot, per real edge of it
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


def embeddings(snapshots, t_cur: int, cfg: Config, methods=None, log=None, state=None):
    """Node vectors at ``t_cur`` for each embedding method; returns {method: (vectors, seconds)}.

    A method's seconds include the work it shares with others (the autoencoder for the lstm
    methods, the static node2vec model for lstm-node2vec-concat), which runs once.

    ``state``, a dict, carries what two calls that differ only in snapshot ``t_cur`` can share
    (dynnode2vec's model of snapshot t_cur - 1): the clean and the anomaly-injected runs of one
    seed. Methods that are not embeddings (the pair heuristics) are ignored here.
    """
    methods = [m for m in (methods or EMBEDDING_METHODS) if m not in HEURISTICS]
    for m in methods:
        if m not in EMBEDDING_METHODS:
            raise ValueError(f"unknown method {m!r}: expected one of {', '.join(ALL_METHODS)}")
    state = {} if state is None else state
    out = {}
    g = snapshots.graphs[t_cur]
    static = []  # node2vec on snapshot t_cur from a random start: the node2vec row and the concat half are one model

    def static_vectors():
        if not static:
            t1 = time.perf_counter()
            model, _ = node2vec_embed(g, cfg, seed=cfg.seed + 1)
            static.append((model.inp.weight.detach().numpy().copy(), time.perf_counter() - t1))
        return static[0]
    if any(m.startswith("lstm") for m in methods):
        t0 = time.perf_counter()
        dyn, dstats = lstm_dynamic(snapshots, t_cur, cfg, seed=cfg.seed, log=log)
        dyn_seconds = time.perf_counter() - t0
        if log:
            log(f"lstm autoencoder: {dstats['walks']} walks ({dstats['trained_walks']} with a neighbour, trained on) in {dstats['walk_seconds']:.2f}s, "
                f"trained in {dstats['train_seconds']:.2f}s, loss {dstats['losses'][0]:.3f} -> {dstats['losses'][-1]:.3f}")
    for m in methods:
        t0 = time.perf_counter()
        shared = 0.0
        if m == "lstm-ae":
            out[m] = (dyn, dyn_seconds)
            continue
        if m in ("lstm-node2vec", "lstm-node2vec-concat"):
            combine = "concat" if m == "lstm-node2vec-concat" else cfg.combine
            if combine == "init":
                model, _ = node2vec_embed(g, cfg, init=dyn, seed=cfg.seed + 1)
                vec = model.inp.weight.detach().numpy().copy()
            elif combine == "concat":
                static_vec, static_seconds = static_vectors()
                vec = np.hstack([dyn, static_vec])
                t0, shared = time.perf_counter(), static_seconds
            else:
                raise ValueError(f"combine must be 'init' or 'concat', not {cfg.combine!r}")
            shared += dyn_seconds
        elif m == "node2vec":
            vec, shared = static_vectors()
            t0 = time.perf_counter()
        elif m == "node2vec-union":  # the LSTM's window, flattened into one graph
            lo = max(0, t_cur - cfg.lookback + 1)
            model, _ = node2vec_embed(CSRGraph.union(snapshots.graphs[lo:t_cur + 1]), cfg, seed=cfg.seed + 1)
            vec = model.inp.weight.detach().numpy().copy()
        elif m == "activity":
            vec = activity_vectors(snapshots, t_cur, cfg.lookback)
        else:  # dynnode2vec-style: train on t_cur - 1, warm-start on t_cur
            if t_cur == 0:
                raise ValueError("dynnode2vec needs a previous snapshot")
            key = ("dynnode2vec-prev", t_cur, cfg.seed)
            if key not in state:  # its time counts in the call that trains it
                state[key], _ = node2vec_embed(snapshots.graphs[t_cur - 1], cfg, seed=cfg.seed + 2)
            prev = state[key]
            starts = _changed_nodes(snapshots.graphs[t_cur - 1], g) if cfg.dyn_walks == "changed" else None
            model, _ = node2vec_embed(g, cfg, init=prev.inp.weight.detach().numpy(),
                                      init_ctx=prev.ctx.weight.detach(), start_nodes=starts, seed=cfg.seed + 1)
            vec = model.inp.weight.detach().numpy().copy()
        secs = time.perf_counter() - t0 + shared
        out[m] = (vec, secs)
        if log:
            log(f"{m}: {secs:.1f}s")
    return out


def hadamard(vec: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    return vec[pairs[:, 0]] * vec[pairs[:, 1]]


def cosine(vec: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    a, b = vec[pairs[:, 0]], vec[pairs[:, 1]]
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)


def _link_scores(tasks: Tasks, cfg: Config, score) -> dict:
    """The link columns' AUCs (and the uniform column's AP) for ``score(train_pairs, train_y, test_pairs)``."""
    out = {}
    for name, key in LINK_COLUMNS.items():
        col = tasks.link[name]
        if col.test_y.sum() == 0 or (col.test_y == 0).sum() == 0:
            out[key] = None  # a column without positives or negatives (tiny graphs)
            continue
        s = score(col.train_pairs, col.train_y, col.test_pairs)
        out[key] = roc_auc(col.test_y, s)
        if name == "uniform":
            out["link_ap"] = average_precision(col.test_y, s)
    return out


def evaluate(vec: np.ndarray, tasks: Tasks, cfg: Config, injected_vec=None) -> dict:
    """The protocol's scores for one embedding method and seed.

    ``vec``: node vectors of the clean sequence (link prediction, node classification);
    ``injected_vec``: of the anomaly-injected sequence (anomaly scores; omitted when None).
    """
    def linear(tr, ytr, te):
        clf = LogisticRegression(l2=cfg.l2).fit(hadamard(vec, tr), ytr)
        return clf.decision_function(hadamard(vec, te))

    out = _link_scores(tasks, cfg, linear)
    if injected_vec is not None:
        held, yh = tasks.anomaly_heldout
        out["anomaly_auc"] = roc_auc(yh, -cosine(injected_vec, held))
        tr, ytr = tasks.anomaly_clf
        clf = LogisticRegression(l2=cfg.l2).fit(hadamard(injected_vec, tr), ytr)
        out["anomaly_auc_clf"] = roc_auc(yh, clf.decision_function(hadamard(injected_vec, held)))
    if tasks.node_labels is not None and len(tasks.node_test):
        lab = tasks.node_labels
        clf = OneVsRest(l2=cfg.l2).fit(vec[tasks.node_train], lab[tasks.node_train])
        out["node_f1"] = macro_f1(lab[tasks.node_test], clf.predict(vec[tasks.node_test]))
    return out


def evaluate_heuristic(name: str, snapshots, tasks: Tasks) -> dict:
    """A pair heuristic scored directly (no classifier): on snapshot t for links, on the injected snapshot t for anomalies."""
    fn = HEURISTICS[name]
    g = snapshots.graphs[tasks.t_cur]
    out = _link_scores(tasks, None, lambda tr, ytr, te: fn(g, te))
    held, yh = tasks.anomaly_heldout
    out["anomaly_auc"] = roc_auc(yh, -fn(tasks.injected.graphs[tasks.t_cur], held))
    return out


def community_auc(vec: np.ndarray, labels: np.ndarray, pairs: int = 5000, seed: int = 0) -> float:
    """AUC of cosine similarity for telling same-community pairs from different-community pairs."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, len(labels), size=pairs)
    v = rng.integers(0, len(labels), size=pairs)
    keep = u != v
    p = np.stack([u[keep], v[keep]], axis=1)
    return roc_auc(labels[p[:, 0]] == labels[p[:, 1]], cosine(vec, p))


def run_seed(snapshots, cfg: Config, methods=None, t_cur=None, log=None) -> dict:
    """One seed (``cfg.seed``) of the protocol: {"scores": {method: {metric: value, "seconds": s}}, "sizes": ...}.

    Draws the evaluation sets, embeds the clean sequence and the anomaly-injected one with every
    embedding method, and scores them and the heuristics.
    """
    t_cur = len(snapshots) - 2 if t_cur is None else t_cur
    if t_cur < 1:
        raise ValueError("run: needs at least 3 snapshots (history, current, target)")
    methods = list(methods or ALL_METHODS)
    for m in methods:
        if m not in ALL_METHODS:
            raise ValueError(f"unknown method {m!r}: expected one of {', '.join(ALL_METHODS)}")
    tasks = Tasks(snapshots, t_cur, cfg)
    state = {}
    clean = embeddings(snapshots, t_cur, cfg, methods, log=log, state=state)
    injected = embeddings(tasks.injected, t_cur, cfg, methods, log=log, state=state)
    scores = {}
    for m in methods:
        t0 = time.perf_counter()
        if m in HEURISTICS:
            r = evaluate_heuristic(m, snapshots, tasks)
            r["seconds"] = time.perf_counter() - t0
        else:
            r = evaluate(clean[m][0], tasks, cfg, injected_vec=injected[m][0])
            r["seconds"] = clean[m][1] + injected[m][1]
        scores[m] = r
    return {"scores": scores, "sizes": tasks.sizes(), "active_nodes": int(len(tasks.active))}


def _run_seed_job(args):
    snapshots, cfg, methods, t_cur = args
    torch.set_num_threads(1)
    return run_seed(snapshots, cfg, methods, t_cur)


def summarise(per_seed: list, seeds: list, methods: list) -> tuple:
    """Method rows (mean, 95% interval and per-seed values of every metric) and the paired differences against REFERENCE."""
    rows = []
    for m in methods:
        row = {"method": m, "seeds": list(seeds)}
        values = {}
        for key in METRICS:
            vals = [r["scores"][m].get(key) for r in per_seed]
            if any(v is None for v in vals):
                continue
            mean, half = mean_ci(vals)
            row[key] = round(mean, 4)
            row[key + "_ci"] = [round(mean - half, 4), round(mean + half, 4)] if half == half else None
            values[key] = [round(float(v), 4) for v in vals]
        row["per_seed"] = values
        row["seconds"] = round(float(np.mean([r["scores"][m]["seconds"] for r in per_seed])), 2)
        rows.append(row)
    diffs = []
    if REFERENCE in methods and len(seeds) > 1:
        ref = next(r for r in rows if r["method"] == REFERENCE)["per_seed"]
        for row in rows:
            if row["method"] == REFERENCE:
                continue
            d = {"method": row["method"]}
            for key in METRICS:
                if key in ref and key in row["per_seed"]:
                    p = paired_difference(ref[key], row["per_seed"][key])
                    d[key] = {"diff": round(p["diff"], 4), "half": round(p["half"], 4),
                              "outside_noise": p["outside_noise"]}
            diffs.append(d)
    return rows, diffs


def run(snapshots, cfg: Config, methods=None, t_cur=None, log=None, seeds: int = 5, jobs: int = 1) -> dict:
    """The protocol over ``seeds`` seeds (cfg.seed, cfg.seed + 1, ...): embed at ``t_cur`` (default K-2), evaluate on t_cur + 1.

    ``jobs`` > 1 runs seeds in that many processes (each single-threaded); the results are the
    same as with one, since every seed is deterministic on its own.
    """
    t_cur = len(snapshots) - 2 if t_cur is None else t_cur
    methods = list(methods or ALL_METHODS)
    seed_list = [cfg.seed + i for i in range(seeds)]
    cfgs = [replace(cfg, seed=s) for s in seed_list]
    if jobs > 1 and len(cfgs) > 1:
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(min(jobs, len(cfgs))) as pool:
            per_seed = []
            for s, r in zip(seed_list, pool.imap(_run_seed_job, [(snapshots, c, methods, t_cur) for c in cfgs])):
                per_seed.append(r)
                if log:
                    log(f"seed {s} done")
    else:
        per_seed = []
        for c in cfgs:
            per_seed.append(run_seed(snapshots, c, methods, t_cur, log=log))
            if log:
                log(f"seed {c.seed} done")
    rows, diffs = summarise(per_seed, seed_list, methods)
    g = snapshots.graphs[t_cur]
    return {"dataset": {"name": snapshots.name, "nodes": snapshots.n, "snapshots": len(snapshots),
                        "current_snapshot": t_cur, "current_edges": g.num_edges,
                        "target_edges": snapshots.graphs[t_cur + 1].num_edges,
                        "active_nodes": per_seed[0]["active_nodes"], "labelled": bool(snapshots.labels),
                        "eval_sizes": per_seed[0]["sizes"]},
            "config": asdict(cfg), "seeds": seed_list, "reference": REFERENCE, "methods": rows,
            "differences": diffs}
