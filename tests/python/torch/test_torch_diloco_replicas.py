# cadence.torch.DiLoCo's bounded-lag and quorum schedules inside replica groups (issue 37), on 4
# gloo processes: cadence.torch.replica_groups(2) gives replicas {0, 1} and {2, 3} and cross
# groups {0, 2} and {1, 3}; DiLoCo(process_group=cross, replica_group=replica). DDP is simulated:
# a replica's two ranks start from the same weights and take the same inner step. The two
# members of a replica report different step durations; replica_group makes them agree on one
# record (the slowest member's durations) and one stop flag, so both cross groups compute the
# same plan at every sync (the one cadence.OuterSchedule computes from the records), a
# replica's members hold the same weights after every sync, the slow replica runs fewer steps
# (lag) or is left out of a quorum's sync and its carried work counts later, and a stop asked by
# one member stops every rank at the same sync. Without replica_group the two cross groups see
# different durations and plan differently (what these tests catch). One spawn, 10 syncs.
import pytest

import _torch_spawn as _spawn

torch = _spawn.need_gloo()  # or skip, saying what is missing

N = 4  # ranks
R = 2  # replicas of 2 ranks (the cross groups' size)
# Step durations by rank: replica 0's slower member is rank 0 (1 ms), replica 1's is rank 3
# (3 ms): replica 1 runs three times slower than replica 0. Each cross group alone would see
# other durations: {0, 2} 1 ms and 1 ms, {1, 3} 0.5 ms and 3 ms.
DURATIONS = (0.001, 0.0005, 0.001, 0.003)
SLOWEST_US = (1000, 3000)  # per replica: its slower member's duration in microseconds


_model = _spawn.diloco_model
_plain = _spawn.plain


def _traced(rank, groups, config, syncs, stop_rank, stop_at):
    """Runs `config` until it stops (at most `syncs` syncs), outer SGD lr 1, every inner step
    moving each element by -(replica + 1) and taking DURATIONS[rank]; rank `stop_rank` asks for
    the stop in its steps after sync `stop_at`. Per sync: the full records exchanged, the plan,
    the plan a fresh cadence.OuterSchedule computes from the records, the global weights'
    first element's move, the global and local weights, whether this rank's replica
    contributed."""
    import numpy as np

    import cadence
    import cadence.torch as ct

    m = _model()
    d = ct.DiLoCo(m, None, lambda ps: torch.optim.SGD(ps, lr=1.0), process_group=groups.cross,
                  replica_group=groups.replica, schedule=config, timeout=30)
    trace = []
    while not d.stopped and d.syncs < syncs:
        with torch.no_grad():
            for p in m.parameters():
                p.sub_(float(groups.index + 1))  # the same step on both members: DDP's invariant
        if d.local_steps + 1 == d.planned:  # this step syncs: the weights it starts from
            before = (d.global_parameters[0].reshape(-1)[0].item(), int(d.plan.contributes[d.rank]),
                      _plain(m.parameters()))
        if d.step(DURATIONS[rank], stop=rank == stop_rank and d.syncs >= stop_at):
            fresh = cadence.OuterSchedule(config, R).plan(np.asarray(d._records, dtype=np.int64), d.syncs)
            trace.append(dict(records=np.asarray(d._records).reshape(R, -1).tolist(),
                              steps=list(d.plan.steps), contributes=list(d.plan.contributes),
                              hash=int(d.plan.hash),
                              fresh=(list(fresh.steps), list(fresh.contributes), int(fresh.hash)),
                              moved=before[0] - d.global_parameters[0].reshape(-1)[0].item(),
                              glob=_plain(d.global_parameters), local_before=before[2],
                              local=_plain(m.parameters()), contributed=before[1]))
    return dict(trace=trace, steps=d.step_count, syncs=d.syncs, stopped=d.stopped,
                stale=[d.stale_contributions, d.max_staleness], cross_rank=d.rank)


def _scenarios(rank, n):
    import cadence.torch as ct

    groups = ct.replica_groups(2)
    # lag:4:4: replica 0 runs 8 steps, replica 1 4; rank 1 asks for the stop after sync 3.
    # quorum:1:4:0:2: replica 1 left out twice, then waited for; rank 3 asks after sync 5.
    return dict(index=groups.index,
                lag=_traced(rank, groups, "lag:4:4", 6, stop_rank=1, stop_at=3),
                quorum=_traced(rank, groups, "quorum:1:4:0:2", 8, stop_rank=3, stop_at=5))


@pytest.fixture(scope="module")
def results():
    return _spawn.values(_spawn.run(_scenarios, N, timeout=120))


def _expected_move(records):
    # replica r's pseudo-gradient is steps_r x (r + 1), weighted steps / (1 + carried), over the
    # sum of the contributors' steps
    num = den = 0.0
    for r, (steps, carried, contributes) in enumerate(row[:3] for row in records):
        if contributes:
            num += steps / (1 + carried) * steps * (r + 1)
            den += steps
    return num / den


def _check_common(results, key, syncs):
    """Every rank's plans, records and global weights equal at every sync (both cross groups
    planned alike), the plan the one cadence.OuterSchedule computes, each replica's record
    carrying its slower member's durations, both members of a replica holding the same local
    weights; every rank stopped at the same sync, `syncs`."""
    assert [r["index"] for r in results] == [0, 0, 1, 1]
    assert [r[key]["cross_rank"] for r in results] == [0, 0, 1, 1]
    traces = [r[key]["trace"] for r in results]
    for i, sync in enumerate(traces[0]):
        for rank, t in enumerate(traces[1:], 1):
            assert (t[i]["records"], t[i]["steps"], t[i]["contributes"], t[i]["hash"], t[i]["glob"]) == \
                (sync["records"], sync["steps"], sync["contributes"], sync["hash"], sync["glob"]), (key, i, rank)
        assert sync["fresh"] == (sync["steps"], sync["contributes"], sync["hash"]), (key, i)
        for r, row in enumerate(sync["records"]):  # RECORD_HAVE durations from RECORD_HEAD
            have = row[4]
            assert have > 0 and row[5:5 + have] == [SLOWEST_US[r]] * have, (key, i, r, row)
        for a, b in ((0, 1), (2, 3)):  # a replica's members: the same weights after the sync
            assert traces[a][i]["local"] == traces[b][i]["local"], (key, i, a, b)
        assert sync["moved"] == pytest.approx(_expected_move(sync["records"]), rel=1e-5), (key, i, sync)
    for rank, r in enumerate(results):  # the stop one member asked for: every rank at one sync
        assert (r[key]["syncs"], r[key]["stopped"], len(r[key]["trace"])) == (syncs, True, syncs), (key, rank)
    return traces


def test_lag_inside_replicas_plans_alike_on_both_cross_groups_and_the_slow_replica_runs_fewer(results):
    traces = _check_common(results, "lag", 4)
    # warm-up: 4 steps each; then replica 1 (3 ms) ends its 4th step at 12 ms, replica 0 runs
    # H + s = 8; every replica contributes
    assert [s["steps"] for s in traces[0]] == [[8, 4]] * 4
    assert all(s["contributes"] == [1, 1] for s in traces[0])
    assert [r["lag"]["steps"] for r in results] == [4 + 3 * 8] * 2 + [4 * 4] * 2
    for t in traces:  # lag: every rank takes the global weights (alpha 0)
        assert all(s["local"] == s["glob"] for s in t)


def test_quorum_inside_replicas_leaves_the_slow_replica_out_and_counts_its_work_later(results):
    traces = _check_common(results, "quorum", 6)
    # after the warm-up: replica 1 left out twice (1 step each), then waited for (max lag 2)
    assert [s["steps"] for s in traces[0][:4]] == [[4, 1], [4, 1], [4, 2], [4, 1]]
    assert [s["contributes"][1] for s in traces[0][:4]] == [0, 0, 1, 0]
    for t in traces[2:]:  # replica 1's ranks: weights kept when left out, the global's otherwise
        for i, sync in enumerate(t):
            if sync["contributed"]:
                assert sync["local"] == sync["glob"], i
            else:
                assert sync["local"] == sync["local_before"] and sync["records"][1][2] == 0, i
    # its carried work arrived with staleness 2: 4 steps weighted 4 / 3
    carried = [s["records"][1] for s in traces[0] if s["records"][1][2] == 1 and s["records"][1][1] > 0]
    assert carried and all(row[:2] == [4, 2] for row in carried), carried
    for r in results:
        assert r["quorum"]["stale"] == [len(carried), 2], r["quorum"]["stale"]
    assert results[2]["quorum"]["steps"] == results[3]["quorum"]["steps"] < results[0]["quorum"]["steps"]
