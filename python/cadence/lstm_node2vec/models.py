"""The LSTM autoencoder over temporal walks (dynamic vectors) and skip-gram with negative sampling (node2vec)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class WalkAutoencoder(nn.Module):
    """Sequence autoencoder over temporal walks of node tokens (0..n-1, padding n).

    Encoder: token embedding -> LSTM; the final hidden state is the walk's code (``hidden``
    wide). Decoder (Srivastava et al.'s unconditioned LSTM autoencoder): an LSTM fed the code
    at every step, whose output scores tokens against an output table (n+1 vectors + bias).
    The loss is cross-entropy against the walk's tokens: over all n+1 tokens when
    ``negatives == 0``, otherwise a sampled softmax over the true token and ``negatives``
    uniform tokens (default 20: cost per step O(negatives * hidden) instead of O(n * hidden),
    so training time does not grow with the node count). Parameters are O(n * dim); there is
    no adjacency matrix anywhere.
    """

    def __init__(self, n: int, embed_dim: int = 32, hidden: int = 64, negatives: int = 20):
        super().__init__()
        self.n = n
        self.negatives = negatives
        self.embed = nn.Embedding(n + 1, embed_dim, padding_idx=n)
        self.encoder = nn.LSTM(embed_dim, hidden, batch_first=True)
        self.decoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.out = nn.Embedding(n + 1, hidden)
        self.out_bias = nn.Embedding(n + 1, 1)
        with torch.no_grad():
            self.out.weight.normal_(0.0, hidden ** -0.5)
            self.out_bias.weight.zero_()

    def encode(self, walks: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.encoder(self.embed(walks))
        return h[-1]

    def decode(self, walks: torch.Tensor) -> torch.Tensor:
        code = self.encode(walks)
        dec, _ = self.decoder(code.unsqueeze(1).expand(-1, walks.shape[1], -1))
        return dec  # (batch, length, hidden)

    def forward(self, walks: torch.Tensor) -> torch.Tensor:
        """Full logits (batch, length, n+1); for inspection and small graphs."""
        return self.decode(walks) @ self.out.weight.t() + self.out_bias.weight.squeeze(1)

    def loss(self, walks: torch.Tensor, generator=None) -> torch.Tensor:
        if self.negatives <= 0:
            logits = self.forward(walks)
            return nn.functional.cross_entropy(logits.reshape(-1, self.n + 1), walks.reshape(-1))
        dec = self.decode(walks).reshape(-1, 1, self.out.embedding_dim)
        tgt = walks.reshape(-1, 1)
        neg = torch.randint(0, self.n + 1, (tgt.shape[0], self.negatives), generator=generator)
        cand = torch.cat([tgt, neg], dim=1)  # true token in column 0
        logits = (self.out(cand) @ dec.transpose(1, 2)).squeeze(2) + self.out_bias(cand).squeeze(2)
        # a sampled negative equal to the target would count the target as its own rival
        logits[:, 1:] = logits[:, 1:].masked_fill(neg == tgt, -1e9)
        return nn.functional.cross_entropy(logits, torch.zeros(tgt.shape[0], dtype=torch.long))


def train_autoencoder(model: WalkAutoencoder, walks: np.ndarray, epochs: int = 3, batch: int = 256,
                      lr: float = 1e-2, seed: int = 0, log=None, on_step=None):
    """Adam on shuffled mini-batches; returns the mean loss of each epoch.

    ``on_step(model, step, loss)``, if given, runs after every optimiser step: the seam where a
    data-parallel trainer exchanges parameters (a parameter-server push/pull, a model
    averager); each process then passes only its own shard of the walks (see ``shard``).
    """
    g = torch.Generator().manual_seed(seed)
    data = torch.from_numpy(walks)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = []
    step = 0
    for ep in range(epochs):
        perm = torch.randperm(data.shape[0], generator=g)
        total, count = 0.0, 0
        for i in range(0, data.shape[0], batch):
            xb = data[perm[i:i + batch]]
            opt.zero_grad()
            loss = model.loss(xb, generator=g)
            loss.backward()
            opt.step()
            total += loss.item() * xb.shape[0]
            count += xb.shape[0]
            if on_step is not None:
                on_step(model, step, loss.item())
            step += 1
        history.append(total / count)
        if log:
            log(f"autoencoder epoch {ep}: loss {history[-1]:.4f}")
    return history


def shard(walks: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Rank ``rank``'s share of the walks for data-parallel training: every ``world``-th walk (strided, so each shard sees every node)."""
    if not 0 <= rank < world:
        raise ValueError(f"shard: rank {rank} outside 0..{world - 1}")
    return walks[rank::world]


@torch.no_grad()
def dynamic_vectors(model: WalkAutoencoder, walks: np.ndarray, owner: np.ndarray, n: int,
                    pool: str = "mean", batch: int = 4096) -> np.ndarray:
    """Encode every walk and pool the codes per owner node (pool="mean" default, or "max")."""
    codes = torch.cat([model.encode(torch.from_numpy(walks[i:i + batch])) for i in range(0, walks.shape[0], batch)])
    own = torch.from_numpy(owner)
    d = codes.shape[1]
    if pool == "mean":
        out = torch.zeros(n, d).index_add_(0, own, codes)
        cnt = torch.bincount(own, minlength=n).clamp(min=1).unsqueeze(1)
        out = out / cnt
    elif pool == "max":
        order = np.argsort(owner, kind="stable")
        own_sorted = owner[order]
        starts = np.flatnonzero(np.r_[True, own_sorted[1:] != own_sorted[:-1]])
        res = np.zeros((n, d), dtype=np.float32)
        res[own_sorted[starts]] = np.maximum.reduceat(codes.numpy()[order], starts, axis=0)
        return res
    else:
        raise ValueError(f"dynamic_vectors: pool must be 'mean' or 'max', not {pool!r}")
    return out.numpy()


class SkipGram(nn.Module):
    """node2vec's skip-gram: input and output vectors per node, negative sampling loss."""

    def __init__(self, n: int, dim: int, init=None, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.inp = nn.Embedding(n, dim, sparse=True)
        self.ctx = nn.Embedding(n, dim, sparse=True)
        with torch.no_grad():
            if init is None:
                self.inp.weight.copy_((torch.rand(n, dim, generator=g) - 0.5) / dim)
            else:
                self.inp.weight.copy_(torch.as_tensor(np.asarray(init), dtype=torch.float32))
            self.ctx.weight.zero_()

    def loss(self, center, context, negatives):
        u = self.inp(center)
        v = self.ctx(context)
        vn = self.ctx(negatives)  # (b, k, d)
        pos = nn.functional.logsigmoid((u * v).sum(-1))
        neg = nn.functional.logsigmoid(-(vn @ u.unsqueeze(-1)).squeeze(-1)).sum(-1)
        return -(pos + neg).mean()


def train_skipgram(model: SkipGram, pairs: np.ndarray, noise: np.ndarray, negatives: int = 5,
                   epochs: int = 1, batch: int = 4096, lr: float = 0.025, seed: int = 0):
    """SparseAdam over shuffled (center, context) pairs; negatives from ``noise`` (unigram^0.75)."""
    g = torch.Generator().manual_seed(seed)
    data = torch.from_numpy(pairs)
    noise_t = torch.as_tensor(noise, dtype=torch.float64)
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=lr)
    history = []
    for _ in range(epochs):
        perm = torch.randperm(data.shape[0], generator=g)
        total, count = 0.0, 0
        for i in range(0, data.shape[0], batch):
            b = data[perm[i:i + batch]]
            neg = torch.multinomial(noise_t, b.shape[0] * negatives, replacement=True, generator=g).view(-1, negatives)
            opt.zero_grad()
            loss = model.loss(b[:, 0], b[:, 1], neg)
            loss.backward()
            opt.step()
            total += loss.item() * b.shape[0]
            count += b.shape[0]
        history.append(total / max(count, 1))
    return history
