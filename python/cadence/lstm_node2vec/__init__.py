"""LSTM-node2vec (Khoshraftar et al., DSAA 2019): dynamic graph embedding from temporal walks, an LSTM autoencoder and node2vec.

Needs PyTorch, which ``pip install 'cadence-sync[lstm]'`` brings; without it, importing this
package raises ImportError saying so.
"""

try:
    import torch as _torch  # noqa: F401  (the models and the distributed runs are torch code)
except ImportError as _e:
    raise ImportError("cadence.lstm_node2vec needs PyTorch: pip install 'cadence-sync[lstm]' (from a "
                      "clone: pip install '.[lstm]'; on Debian, python3-torch seen from a venv made with "
                      f"--system-site-packages); import failed: {_e}") from _e

from .data import (DATASETS, DataError, Snapshots, TemporalEdges, cut_snapshots, default_data_path, evolving_sbm,
                   load_dataset, load_sociopatterns, load_temporal_csv)
from .experiment import ALL_METHODS, Config, community_auc, embeddings, evaluate, run, run_seed
from .graph import CSRGraph
from .heuristics import activity_vectors, adamic_adar, common_neighbours, preferential_attachment
from .metrics import LogisticRegression, OneVsRest, average_precision, macro_f1, roc_auc
from .protocol import Tasks, node_split
from .stats import mean_ci, paired_difference
from .walks import node2vec_walks, skipgram_pairs, temporal_walks

__all__ = ["ALL_METHODS", "CSRGraph", "Config", "DATASETS", "DataError", "LogisticRegression", "OneVsRest",
           "Snapshots", "Tasks", "TemporalEdges", "activity_vectors", "adamic_adar", "average_precision",
           "common_neighbours", "community_auc", "cut_snapshots", "default_data_path", "embeddings", "evaluate",
           "evolving_sbm", "load_dataset", "load_sociopatterns", "load_temporal_csv", "macro_f1", "mean_ci",
           "node2vec_walks", "node_split", "paired_difference", "preferential_attachment", "roc_auc", "run",
           "run_seed", "skipgram_pairs", "temporal_walks"]
