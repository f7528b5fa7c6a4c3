# cadence.torch.DiLoCo on 2 gloo processes: outer SGD lr 1 is model averaging (exact on
# integers), the default outer step is DiLoCo's Nesterov, streaming fragments start and land on
# their steps with the global weights identical on every rank, a checkpoint resumes, and bad
# arguments are refused naming them. One spawn runs every scenario.
import pytest

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

N = 2

_model = _spawn.diloco_model


def _inner(model, rank):
    # An "inner step" that moves every element by a known integer: + (rank + 1).
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(rank + 1))


# Plain lists: tensors sent back through the spawn's queue would need shared memory.
_plain = _spawn.plain


def _scenarios(rank, n):
    import torch.distributed as dist

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
    for key, kw in (("codec", dict(codec="int2")), ("quorum", dict(schedule="quorum:0:10")),
                    ("elastic_fragments", dict(schedule="elastic:4", fragments=2)),
                    ("replica_fixed", dict(replica_group=dist.group.WORLD)),
                    ("both", dict(schedule="fixed:4", sync_every=5))):
        bad[key] = _spawn.error(lambda: ct.DiLoCo(_model(), None, **kw))
    d = ct.DiLoCo(_model(), None, schedule="elastic:4")
    bad["duration"] = _spawn.error(lambda: d.step(-1.0))
    f = ct.DiLoCo(_model(), None, sync_every=4)
    bad["stop_fixed"] = _spawn.error(lambda: f.step(stop=True))
    bad["stop_fixed_steps"] = f.step_count  # refused before anything moved
    out["bad"] = bad
    out.update(_codecs(rank, n))
    out.update(_weighting(rank, n))
    out.update(_resume(rank, n))
    return out


def _set_pseudo_gradient(d, pg):
    # local = global - pg: the next exchange carries pg from this rank
    with torch.no_grad():
        for g, p, v in zip(d.global_parameters, d.model.parameters(), pg):
            p.copy_(g - v)


def _codecs(rank, n):
    import cadence.torch as ct
    from cadence.torch._diloco import decode, encode

    out = {}
    # Each codec, outer SGD lr 1, H = 1: the global weights move by minus the mean of the
    # decoded contributions, bit for bit the same on every rank.
    gen = torch.Generator().manual_seed(7)
    pgs = [[torch.randn(p.shape, generator=gen) * (r + 1) for p in _model().parameters()] for r in range(n)]
    for codec in ("f32", "bf16", "fp16", "int8", "int4"):
        m = _model()
        d = ct.DiLoCo(m, None, lambda ps: torch.optim.SGD(ps, lr=1.0), sync_every=1, codec=codec)
        before = [g.clone() for g in d.global_parameters]
        _set_pseudo_gradient(d, pgs[rank])
        d.step()
        exact = [b - sum(pg[i] for pg in pgs) / n for i, b in enumerate(before)]
        out[f"codec_{codec}"] = dict(glob=_plain(d.global_parameters),
                                     err=max(float((g - e).abs().max()) for g, e in zip(d.global_parameters, exact)),
                                     bytes=d.bytes_sent, local=_plain(m.parameters()))
    # Error feedback: int4 of [7, 0.3, 0.3, ...] rounds the 0.3s to 0 every time without it; with
    # it, what was lost goes into the next contribution, so the sum over 8 syncs tracks 8 x 0.3.
    for fb in (True, False):
        m = _model()
        d = ct.DiLoCo(m, None, lambda ps: torch.optim.SGD(ps, lr=1.0), sync_every=1, codec="int4",
                      error_feedback=fb)
        start = [g.clone() for g in d.global_parameters]
        pg = []
        for p in m.parameters():
            v = torch.full(p.shape, 0.3)
            v.view(-1)[0] = 7.0
            pg.append(v)
        for _ in range(8):
            _set_pseudo_gradient(d, pg)
            d.step()
        moved = [float(s.view(-1)[-1] - g.view(-1)[-1]) for s, g in zip(start, d.global_parameters)]
        out[f"feedback_{fb}"] = moved  # the last element of each tensor (a 0.3 one, or the 7 alone)
    # Streaming DiLoCo's setting: fragments overlapping inner steps, 4-bit outer gradients.
    m = _model()
    d = ct.DiLoCo(m, None, sync_every=4, fragments=2, delay=1, alpha=0.5, codec="int4")
    for _ in range(10):
        _inner(m, rank)
        d.step()
    d.finish()
    out["stream_int4"] = dict(glob=_plain(d.global_parameters), outer_steps=d.outer_steps, bytes=d.bytes_sent)
    # The C++ codec's rules on known values: ties to even, one scale per block, NaN kept.
    x = torch.tensor([127.0, -127.0, 63.5, 0.5, 1.5, -2.5])
    out["int8_known"] = decode("int8", encode("int8", x), 6).tolist()
    out["int4_known"] = decode("int4", encode("int4", torch.tensor([7.0, 3.5, -2.5, 0.49])), 4).tolist()
    out["nan_block"] = decode("int8", encode("int8", torch.tensor([1.0, float("nan")])), 2).tolist()
    return out


def _weighting(rank, n):
    import cadence.torch as ct

    # ElasticBSP: rank 1 is 3x slower, so the plan gives it fewer inner steps; each sync's outer
    # gradient is the steps-weighted mean of the pseudo-gradients (outer SGD lr 1: exact to f32).
    m = _model()
    d = ct.DiLoCo(m, None, lambda ps: torch.optim.SGD(ps, lr=1.0), schedule="elastic:4", timeout=30)
    syncs = []
    while not d.stopped:
        if d.local_steps + 1 == d.planned:  # this step syncs: its pseudo-gradient is 1 or 4
            steps = [int(s) for s in d.plan.steps]
            before = d.global_parameters[0].reshape(-1)[0].item()
            _set_pseudo_gradient(d, [torch.full(p.shape, 1.0 + 3 * rank) for p in m.parameters()])
        synced = d.step(0.001 * (1 + 2 * rank), stop=d.syncs >= 10)
        if synced:
            syncs.append((steps, before - d.global_parameters[0].reshape(-1)[0].item()))
    out = {"weighted": syncs, "weighted_global": _plain(d.global_parameters), "weighted_local": _plain(m.parameters()),
           "weighted_steps": d.step_count}
    return out


def _data(step, rank):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g)


def _run(m, opt, d, until, rank):
    while d.syncs < until:
        x, y = _data(d.step_count, rank)
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        opt.zero_grad()
        d.step(0.001 * (1 + (rank + d.step_count) % 3))  # durations from the step count: repeatable


def _resume(rank, n):
    import cadence.torch as ct

    # A checkpoint after 4 syncs (elastic schedule, int8 with error feedback, SGD with momentum
    # inside), through a file; the job goes on to 9 syncs; a fresh model, optimizer and DiLoCo
    # loaded from the checkpoint run to 9 syncs too and must hold exactly the same weights.
    def build():
        torch.manual_seed(rank)
        m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        return m, opt, ct.DiLoCo(m, opt, schedule="elastic:4", codec="int8", timeout=30)

    m, opt, d = build()
    _run(m, opt, d, 4, rank)
    saved = _spawn.roundtrip(dict(model=m.state_dict(), opt=opt.state_dict(), diloco=d.state_dict()))
    _run(m, opt, d, 9, rank)
    m2, opt2, d2 = build()
    m2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    d2.load_state_dict(saved["diloco"])
    _run(m2, opt2, d2, 9, rank)
    same = all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))
    same_global = all(torch.equal(a, b) for a, b in zip(d.global_parameters, d2.global_parameters))
    return {"resume": dict(same=same, same_global=same_global, steps=(d.step_count, d2.step_count),
                           residual=d.state_dict()["residual"][0] is not None,
                           glob=_plain(d2.global_parameters))}


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
    for key, text in (("codec", "unknown codec 'int2'"), ("quorum", "K must be >= 1, got 0"),
                      ("elastic_fragments", "fragments and delay need the fixed schedule"),
                      ("replica_fixed", "replica_group is for the timed schedules"),
                      ("both", "disagree"), ("duration", "step duration -1.0 s is not in"),
                      ("stop_fixed", "end the loop on a step count")):
        assert bad[key][1] and text in bad[key][2], (key, bad[key])
    assert bad["stop_fixed_steps"] == 0


def test_every_codec_moves_the_global_weights_by_the_decoded_mean_identically_on_every_rank(results):
    # bound on |global - exact| per codec (|pseudo-gradients| up to about 6 here), and the bytes
    # rank 0 sent for 11 elements: f32 as a ring all-reduce, the others as the coded
    # reduce-scatter (rank 1's segment, 6 elements, encoded) and all-gather (its own, 5 encoded):
    # encoded_bytes (C++) of each; int8/int4 pay a block scale per segment at this tiny size
    for codec, bound, sent in (("f32", 1e-5, 44), ("fp16", 5e-3, 22), ("bf16", 3e-2, 22),
                               ("int8", 3e-2, 10 + 9), ("int4", 0.5, 7 + 7)):
        a, b = results[0][f"codec_{codec}"], results[1][f"codec_{codec}"]
        assert a["glob"] == b["glob"], codec  # bit for bit
        assert a["local"] == a["glob"], codec  # alpha 0: the local weights take the global ones
        assert a["err"] <= bound and b["err"] <= bound, (codec, a["err"])
        assert a["bytes"] == sent, (codec, a["bytes"])
    assert results[0]["codec_int4"]["err"] > results[0]["codec_int8"]["err"] > results[0]["codec_f32"]["err"]
    # streaming with int4: 5 fragment exchanges (as with f32), the global weights identical
    a, b = results[0]["stream_int4"], results[1]["stream_int4"]
    assert a["outer_steps"] == 5 and a["glob"] == b["glob"], (a, b)
    # int4, fragments of 6 and 5 elements (segments 3 + 3 and 2 + 3), starts 0, 1, 0, 1, 0
    assert a["bytes"] == 3 * (6 + 6) + 2 * (6 + 5)


def test_error_feedback_carries_what_quantisation_lost_into_the_next_contribution(results):
    for r in results:
        # last elements: three 0.3s (weights and the first bias) and a lone 7 (the last bias)
        with_fb, without = r["feedback_True"], r["feedback_False"]
        assert without[:3] == [0.0, 0.0, 0.0]  # 0.3 / scale 1 rounds to 0, every time
        assert all(abs(v - 8 * 0.3) <= 1.0 for v in with_fb[:3]), with_fb
        assert with_fb[3] == without[3] == 56.0


def test_codecs_follow_the_cpp_rounding_rules(results):
    r = results[0]
    assert r["int8_known"] == [127.0, -127.0, 64.0, 0.0, 2.0, -2.0]  # ties to even, scale 1
    assert r["int4_known"] == [7.0, 4.0, -2.0, 0.0]  # scale 1: 3.5 -> 4, -2.5 -> -2
    assert all(v != v for v in r["nan_block"])  # a block holding a NaN decodes as NaNs


def test_elastic_schedule_weights_each_pseudo_gradient_by_its_inner_steps(results):
    syncs = results[0]["weighted"]
    assert results[1]["weighted"] == syncs
    assert len(syncs) >= 11
    assert any(steps[0] > steps[1] for steps, _ in syncs), syncs  # the slow rank ran fewer steps
    for steps, moved in syncs:  # pseudo-gradients 1 (rank 0) and 4 (rank 1)
        assert moved == pytest.approx((steps[0] * 1 + steps[1] * 4) / (steps[0] + steps[1]), rel=1e-5), syncs
    assert results[0]["weighted_global"] == results[1]["weighted_global"]
    assert results[0]["weighted_steps"] > results[1]["weighted_steps"]


def test_a_checkpoint_resumes_the_same_trajectory(results):
    for r in results:
        assert r["resume"]["same"] and r["resume"]["same_global"], r["resume"]
        assert r["resume"]["steps"][0] == r["resume"]["steps"][1]
        assert r["resume"]["residual"]  # int8's error feedback is part of the state
    assert results[0]["resume"]["glob"] == results[1]["resume"]["glob"]
