"""LSTM-node2vec (Khoshraftar et al., DSAA 2019): dynamic graph embedding from temporal walks, an LSTM autoencoder and node2vec."""

from .data import DataError, Snapshots, TemporalEdges, cut_snapshots, default_data_path, evolving_sbm, load_temporal_csv
from .experiment import Config, community_auc, embeddings, evaluate, run
from .graph import CSRGraph
from .metrics import LogisticRegression, average_precision, roc_auc
from .walks import node2vec_walks, skipgram_pairs, temporal_walks

__all__ = ["CSRGraph", "Config", "DataError", "LogisticRegression", "Snapshots", "TemporalEdges",
           "average_precision", "community_auc", "cut_snapshots", "default_data_path", "embeddings",
           "evaluate", "evolving_sbm", "load_temporal_csv", "node2vec_walks", "roc_auc", "run",
           "skipgram_pairs", "temporal_walks"]
