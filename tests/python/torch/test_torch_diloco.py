# cadence.torch.DiLoCo on 2 gloo processes: outer SGD lr 1 is model averaging (exact on
# integers), the default outer step is DiLoCo's Nesterov, streaming fragments start and land on
# their steps with the global weights identical on every rank, a checkpoint resumes, and bad
# arguments are refused naming them. One spawn runs every scenario.
import pytest

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

N = 2


def _model():
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    with torch.no_grad():
        for i, p in enumerate(m.parameters()):
            p.fill_(float(i + 1))
    return m


def _inner(model, rank):
    # An "inner step" that moves every element by a known integer: + (rank + 1).
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(rank + 1))


def _plain(tensors):
    # Plain lists: tensors sent back through the spawn's queue would need shared memory.
    return [t.detach().reshape(-1).tolist() for t in tensors]


def _scenarios(rank, n):
    import cadence.torch as ct

    out = {}
    # 1. Outer SGD lr 1, H = 3: after the sync the local weights are the mean of the locals.
    m = _model()
    if rank == 1:
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(-7.0)  # overwritten by rank 0's broadcast
    d = ct.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), lambda ps: torch.optim.SGD(ps, lr=1.0),
                  sync_every=3)
    out["broadcast"] = _plain(m.parameters())
    acted = [d.step() for _ in range(3) if _inner(m, rank) is None]
    out["avg_acted"] = acted
    out["avg"] = _plain(m.parameters())
    # 2. The default outer optimizer: Nesterov lr 0.7, momentum 0.9 on the mean pseudo-gradient.
    m = _model()
    d = ct.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), sync_every=2)
    for _ in range(2):
        _inner(m, rank)
        d.step()
    out["nesterov"] = _plain(m.parameters())
    # 3. Streaming: 2 fragments, H = 4, delay 1: fragment 0 starts after step 2, lands at 3;
    # fragment 1 starts after step 4, lands at 5.
    m = _model()
    d = ct.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), sync_every=4, fragments=2, delay=1, alpha=0.5)
    steps = []
    for _ in range(10):
        _inner(m, rank)
        steps.append(d.step())
    d.finish()
    out["stream_acted"] = steps
    out["stream_outer_steps"] = d.outer_steps
    out["stream_global"] = _plain(d.global_parameters)
    # 4. A checkpoint: state_dict through a file, loaded into a fresh DiLoCo on another model.
    sd = _spawn.roundtrip(d.state_dict())
    m2 = _model()
    d2 = ct.DiLoCo(m2, torch.optim.SGD(m2.parameters(), lr=0.1), sync_every=4, fragments=2, delay=1, alpha=0.5)
    d2.load_state_dict(sd)
    out["resumed_global"] = _plain(d2.global_parameters)
    out["resumed_counts"] = (d2.step_count, d2.outer_steps)
    # 5. Bad arguments.
    bad = {}
    for key, kw in (("fragments", dict(sync_every=2, fragments=3)), ("delay", dict(sync_every=2, delay=2)),
                    ("alpha", dict(alpha=1.0)), ("sync_every", dict(sync_every=0))):
        bad[key] = _spawn.error(lambda: ct.DiLoCo(_model(), None, **kw))
    bad["resume"] = _spawn.error(lambda: ct.DiLoCo(_model(), None, sync_every=5).load_state_dict(sd))
    out["bad"] = bad
    return out


@pytest.fixture(scope="module")
def results():
    return _spawn.values(_spawn.run(_scenarios, N, timeout=90))


def test_outer_sgd_lr_1_is_model_averaging_from_rank_0s_weights(results):
    for r in results:
        assert r["broadcast"] == [[float(i + 1)] * len(p) for i, p in enumerate(r["broadcast"])]
        assert r["avg_acted"] == [False, False, True]
        # each rank moved by 3 (rank + 1): the mean moves by 3 * 1.5 = 4.5
        assert r["avg"] == [[i + 1 + 4.5] * len(p) for i, p in enumerate(r["avg"])]


def test_default_outer_step_is_diloco_nesterov(results):
    # pseudo-gradient g = -(2 * 1.5) = -3; first step: m = g; x -= 0.7 (g + 0.9 m) = x + 0.7 * 1.9 * 3
    for r in results:
        for i, p in enumerate(r["nesterov"]):
            assert p == pytest.approx([i + 1 + 0.7 * 1.9 * 3] * len(p), rel=1e-6)


def test_streaming_fragments_start_and_land_on_their_steps_identical_on_every_rank(results):
    # starts at 2, 4, 6, 8, 10 (fragments 0, 1, 0, 1, 0); lands one step later
    assert results[0]["stream_acted"] == [False, True, True, True, True, True, True, True, True, True]
    assert results[0]["stream_outer_steps"] == 5  # the last start lands in finish()
    assert results[0]["stream_global"] == results[1]["stream_global"]


def test_a_checkpoint_resumes_the_global_weights_and_counters(results):
    for r in results:
        assert r["resumed_global"] == r["stream_global"]
        assert r["resumed_counts"] == (10, 5)


def test_bad_arguments_are_refused_naming_them(results):
    bad = results[0]["bad"]
    assert bad["fragments"][1] and "fragments 3 exceed sync_every = 2" in bad["fragments"][2]
    assert bad["delay"][1] and "delay 2 must be less than sync_every = 2" in bad["delay"][2]
    assert bad["alpha"][1] and "alpha must be a number in [0, 1)" in bad["alpha"][2]
    assert bad["sync_every"][1] and "sync_every must be an integer >= 1" in bad["sync_every"][2]
    assert bad["resume"][1] and "sync_every = 4" in bad["resume"][2]
