"""`python3 -m cadence.lstm_node2vec.scaling`: walk and training throughput and memory against graph size on the SBM generator."""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc

import numpy as np
import torch

from .data import evolving_sbm
from .experiment import Config
from .models import SkipGram, WalkAutoencoder, train_autoencoder, train_skipgram
from .walks import node2vec_walks, skipgram_pairs, temporal_walks


def measure(n: int, avg_degree: float, cfg: Config, snapshots: int = 5, train_walks: int = 4000,
            train_pairs: int = 100000, seed: int = 0) -> dict:
    """One graph size: memory of graphs and walks (numpy, traced), throughput of each stage."""
    tracemalloc.start()
    snaps = evolving_sbm(n=n, communities=8, snapshots=snapshots, avg_degree=avg_degree, seed=seed)
    graph_bytes = sum(g.nbytes() for g in snaps.graphs)
    t0 = time.perf_counter()
    walks, owner = temporal_walks(snaps, snapshots - 1, cfg.lookback, cfg.temporal_walks, seed=seed)
    t_tw = time.perf_counter() - t0
    g = snaps.graphs[-1]
    t0 = time.perf_counter()
    nw = node2vec_walks(g, cfg.walk_length, cfg.walks_per_node, p=0.5, q=2.0, seed=seed)
    t_nw = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    edges = sum(x.num_edges for x in snaps.graphs)

    # training throughput on a fixed-size sample: with the sampled softmax the cost per walk
    # does not depend on n, so a sample measures it without hours of training
    torch.manual_seed(seed)
    ae = WalkAutoencoder(n, cfg.token_dim, cfg.dim, cfg.ae_negatives)
    sample = walks[np.random.default_rng(seed).choice(len(walks), min(train_walks, len(walks)), replace=False)]
    t0 = time.perf_counter()
    train_autoencoder(ae, sample, epochs=1, batch=cfg.ae_batch, lr=cfg.ae_lr)
    t_ae = time.perf_counter() - t0
    pairs = skipgram_pairs(nw[: max(1, train_pairs // (2 * cfg.window * cfg.walk_length))], cfg.window)[:train_pairs]
    sg = SkipGram(n, cfg.dim)
    noise = np.bincount(nw.ravel(), minlength=n).astype(np.float64) ** 0.75
    t0 = time.perf_counter()
    train_skipgram(sg, pairs, noise / noise.sum(), cfg.negatives, 1, cfg.n2v_batch, cfg.n2v_lr)
    t_sg = time.perf_counter() - t0
    params = sum(p.numel() * p.element_size() for p in ae.parameters()) + \
        sum(p.numel() * p.element_size() for p in sg.parameters())
    return {"nodes": n, "avg_degree": avg_degree, "edges_all_snapshots": edges,
            "graph_bytes": graph_bytes, "peak_numpy_bytes": peak, "model_bytes": params,
            "dense_adjacency_bytes": n * n * snapshots * 4,
            "temporal_walks_per_s": len(walks) / t_tw, "temporal_walk_edges_per_s": edges / t_tw,
            "node2vec_walks_per_s": len(nw) / max(t_nw, 1e-9),
            "ae_train_walks_per_s": len(sample) / t_ae, "skipgram_pairs_per_s": len(pairs) / t_sg}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m cadence.lstm_node2vec.scaling")
    ap.add_argument("--nodes", default="1000,4000,16000,64000", help="node counts at --degree")
    ap.add_argument("--degree", type=float, default=8.0)
    ap.add_argument("--fixed-nodes", type=int, default=16000, help="node count for the degree series")
    ap.add_argument("--degrees", default="4,8,16,32", help="average degrees at --fixed-nodes ('' to skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = Config()
    rows = [measure(int(n), args.degree, cfg) for n in args.nodes.split(",") if n]
    rows += [measure(args.fixed_nodes, float(d), cfg) for d in args.degrees.split(",") if d]
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'nodes':>7}{'deg':>5}{'edges':>9}{'graph MB':>10}{'peak np MB':>11}{'model MB':>10}{'dense MB':>10}"
          f"{'tw walks/s':>12}{'tw edges/s':>12}{'n2v walks/s':>12}{'AE walks/s':>11}{'SG pairs/s':>11}")
    for r in rows:
        print(f"{r['nodes']:>7}{r['avg_degree']:>5.0f}{r['edges_all_snapshots']:>9}{r['graph_bytes'] / 1e6:>10.2f}"
              f"{r['peak_numpy_bytes'] / 1e6:>11.2f}{r['model_bytes'] / 1e6:>10.2f}{r['dense_adjacency_bytes'] / 1e6:>10.0f}"
              f"{r['temporal_walks_per_s']:>12.0f}{r['temporal_walk_edges_per_s']:>12.0f}{r['node2vec_walks_per_s']:>12.0f}"
              f"{r['ae_train_walks_per_s']:>11.0f}{r['skipgram_pairs_per_s']:>11.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
