# The LSTM autoencoder (shapes, falling loss, pooling) and the skip-gram model.
import numpy as np
import pytest
import torch

from cadence.lstm_node2vec import evolving_sbm, temporal_walks
from cadence.lstm_node2vec.models import SkipGram, WalkAutoencoder, dynamic_vectors, train_autoencoder, train_skipgram


@pytest.mark.parametrize("negatives", [0, 5])
def test_the_autoencoder_has_the_documented_shapes(negatives):
    torch.manual_seed(0)
    m = WalkAutoencoder(n=10, embed_dim=4, hidden=6, negatives=negatives)
    x = torch.randint(0, 11, (7, 3))
    assert m.encode(x).shape == (7, 6)
    assert m(x).shape == (7, 3, 11)
    assert m.loss(x).dim() == 0


@pytest.mark.parametrize("negatives", [0, 10])
def test_the_autoencoder_loss_falls(negatives):
    s = evolving_sbm(n=60, snapshots=4, seed=0)
    walks, owner = temporal_walks(s, 3, 4, 4, seed=0)
    torch.manual_seed(0)
    m = WalkAutoencoder(60, 8, 16, negatives=negatives)
    hist = train_autoencoder(m, walks, epochs=8, batch=32, lr=3e-2, seed=0)
    assert hist[-1] < 0.75 * hist[0]  # measured: 0.58 (full softmax), 0.46 (sampled)


def test_dynamic_vectors_pool_each_nodes_walk_codes():
    torch.manual_seed(0)
    m = WalkAutoencoder(5, 3, 4)
    walks = np.array([[0, 1], [2, 5], [3, 3], [4, 1]])
    owner = np.array([0, 0, 2, 2])
    codes = m.encode(torch.from_numpy(walks)).detach().numpy()
    mean = dynamic_vectors(m, walks, owner, 5, pool="mean")
    assert mean.shape == (5, 4)
    assert np.allclose(mean[0], codes[:2].mean(0), atol=1e-6)
    assert np.allclose(mean[2], codes[2:].mean(0), atol=1e-6)
    assert np.allclose(mean[1], 0.0)  # no walks: zero vector
    mx = dynamic_vectors(m, walks, owner, 5, pool="max")
    assert np.allclose(mx[0], codes[:2].max(0), atol=1e-6)
    with pytest.raises(ValueError):
        dynamic_vectors(m, walks, owner, 5, pool="median")


def test_skipgram_starts_from_a_given_init_and_its_loss_falls():
    init = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    sg = SkipGram(4, 3, init=init)
    assert np.allclose(sg.inp.weight.detach().numpy(), init)
    pairs = np.array([[0, 1], [1, 0], [2, 3], [3, 2]] * 200)
    h = train_skipgram(sg, pairs, np.full(4, 0.25), negatives=2, epochs=5, batch=64, lr=0.05)
    assert h[-1] < 0.8 * h[0]


def test_the_step_hook_sees_every_step_and_shards_partition_the_walks():
    from cadence.lstm_node2vec.models import shard
    walks = np.arange(40).reshape(10, 4) % 7
    parts = [shard(walks, r, 3) for r in range(3)]
    assert sum(len(p) for p in parts) == 10
    assert sorted(map(tuple, np.concatenate(parts).tolist())) == sorted(map(tuple, walks.tolist()))
    with pytest.raises(ValueError):
        shard(walks, 3, 3)
    seen = []
    m = WalkAutoencoder(7, 3, 4, negatives=2)
    train_autoencoder(m, walks, epochs=2, batch=4, on_step=lambda model, step, loss: seen.append(step))
    assert seen == list(range(6))  # 3 batches of 10 walks per epoch


def test_server_adam_matches_torch_adam():
    w = torch.tensor([1.0, -2.0, 0.5])
    p = torch.nn.Parameter(w.clone())
    opt = torch.optim.Adam([p], lr=0.1)
    from cadence.lstm_node2vec.distributed import ServerAdam
    upd = ServerAdam(3, lr=0.1)
    mine = w.clone()
    for k in range(5):
        g = torch.tensor([0.3, -1.0, 2.0]) * (k + 1)
        p.grad = g.clone()
        opt.step()
        upd(mine, g, 0)
    assert torch.allclose(mine, p.detach(), atol=1e-6)
