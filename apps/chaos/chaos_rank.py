#!/usr/bin/python3
"""chaos_rank.py: cadence-chaos-rank in Python, on cadence.membership.Member (the binding of the
C++ membership::member over ZeroMQ), so that the chaos soak (chaos_soak.py --python-ranks,
docs/collective.md "Chaos soak") can run jobs that mix C++ and Python processes in one quorum.

The same command line (the flags chaos_soak.py passes, and the others of cadence-chaos-rank),
the same JSON lines on stdout (events, keys, the state hash as 16 hex digits) and the same exit
status: 0 done, 3 evicted or no quorum left, 2 bad command line, 1 any other error. The state
it averages is bit-identical to the C++ program's, so the soak compares their hashes per step:

  periodic  a local step adds d = 0.01 (rank + 1) + 0.001 (step mod 7) to every 97th parameter
            (float64); every --period steps the parameters are replaced by their mean over the
            quorum, one Member.allreduce_average of the whole float64 array (the C++
            periodic_averager's one in-place view.allreduce_average of a lone contiguous tensor),
            retried on a fault.
  bsp       a local step sets every 97th gradient to d; every step the gradients are averaged
            (Member.allreduce_average: the C++ bucketed_allreducer's one bucket, one
            iallreduce_average of the same count), then params -= 0.5 * grads (float64, exact
            halving: no rounding differs with or without a fused multiply-add), discarded on a
            fault.

With --hold-file both agree in every sync on whether the file exists (an all-reduce max of one
float64, before the average in periodic mode, after it in bsp mode, as the C++ program), and the
agreed value is registered state after the parameters. --holder on rank 0 holds the rendezvous
(cadence.membership.hold_rendezvous). --rejoin N brings a process the quorum dropped while it
lived (EvictedError or QuorumError while syncing) back as a new Member in its slot that joins,
up to N attempts, with the C++ program's lines and rules. Needs NumPy and the cadence package
with its _membership module (PYTHONPATH). An application, not part of the library.
"""

import argparse
import json
import os
import stat
import sys
import time

PROG = "chaos_rank.py"
MODES = ("periodic", "bsp")


class UsageError(Exception):
    """A bad command line (exit 2)."""


def _integer(least, most):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("expected an integer, got '%s'" % text)
        if not least <= v <= most:
            raise argparse.ArgumentTypeError("expected an integer in [%d, %d], got %d" % (least, most, v))
        return v
    return parse


def _mib(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number, got '%s'" % text)
    if not 0 < v <= 4096:
        raise argparse.ArgumentTypeError("expected a number in (0, 4096], got %s" % text)
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog=PROG,
        description="One rank of a fault-tolerant collective job over ZeroMQ, in Python (cadence.membership): "
                    "cadence-chaos-rank's flags and JSON lines, for chaos_soak.py --python-ranks. Exit status: "
                    "0 done, 3 evicted or no quorum left, 2 bad command line, 1 any other error.")
    p.add_argument("--rank", type=_integer(0, 1 << 16), metavar="R", help="this process's rank (its slot)")
    p.add_argument("--size", type=_integer(1, 1 << 16), metavar="N", help="ranks in the job (slots)")
    p.add_argument("--rendezvous", default="", metavar="tcp://H:P",
                   help="rank 0 binds this ZeroMQ address (port 0: any), the others register there")
    p.add_argument("--rendezvous-file", default="", metavar="F",
                   help="rank 0 writes the address it bound here; the others wait for the file")
    p.add_argument("--address", default="127.0.0.1", metavar="A",
                   help="the address this process binds its endpoint on (default 127.0.0.1)")
    sec = p.add_mutually_exclusive_group()
    sec.add_argument("--secret-file", default="", metavar="F",
                     help="the job secret, a key file (mode 600) holding its hex (default: $CADENCE_JOB_SECRET)")
    sec.add_argument("--insecure", action="store_true",
                     help="no job secret: nothing authenticated or encrypted (loopback only)")
    p.add_argument("--join", action="store_true", help="a restarted or late process: joins the running job")
    p.add_argument("--holder", action="store_true",
                   help="rank 0 only holds the rendezvous (hold_rendezvous) and is in no quorum; the members are "
                        "ranks 1..N-1 (every process of the job is given it)")
    p.add_argument("--rejoin", type=_integer(0, 1000), default=0, metavar="N",
                   help="dropped by the quorum while alive (evicted, or no quorum on its side), come back: a new "
                        "Member in this slot that joins and receives the state, at most N attempts (default 0: "
                        "stop, exit 3). Not on rank 0 without --holder: it hosts the rendezvous, which a new "
                        "Member cannot take over")
    p.add_argument("--mode", choices=MODES, default="periodic", help="periodic (default) or bsp")
    p.add_argument("--mib", type=_mib, default=4.0, metavar="X", help="MiB of parameters (default 4)")
    p.add_argument("--period", type=_integer(1, 1000000), default=2, metavar="K",
                   help="periodic: local steps between syncs (default 2)")
    p.add_argument("--syncs", type=_integer(1, 1 << 40), default=100, metavar="N",
                   help="stop once the job has committed this many syncs (default 100)")
    p.add_argument("--hold-file", default="", metavar="F",
                   help="go on past --syncs while this file exists (agreed by the members in every sync)")
    p.add_argument("--step-ms", type=_integer(0, 60000), default=2, metavar="MS",
                   help="milliseconds a local step sleeps (default 2)")
    p.add_argument("--heartbeat-ms", type=_integer(10, 600000), default=1000, metavar="MS",
                   help="the heartbeat timeout; op = 4x, quorum = 8x (default 1000)")
    p.add_argument("--join-timeout-ms", type=_integer(1, 3600000), default=30000, metavar="MS",
                   help="--join: the wait to be admitted (default 30000)")
    p.add_argument("--connect-timeout-ms", type=_integer(1, 3600000), default=30000, metavar="MS",
                   help="the wait for the rendezvous file and the communicator's construction (default 30000)")
    o = p.parse_args(argv)
    # The checks after parsing, with cadence-chaos-rank's messages.
    if o.rank is None or o.size is None:
        raise UsageError("needs --rank and --size (see --help)")
    if o.rank >= o.size:
        raise UsageError("--rank %d is out of range for --size %d (ranks 0..%d)" % (o.rank, o.size, o.size - 1))
    if not o.rendezvous and not o.rendezvous_file:
        raise UsageError("needs --rendezvous or --rendezvous-file")
    if o.join and o.rank == 0:
        raise UsageError("--join: rank 0 cannot rejoin: it holds the job's rendezvous, and a new process cannot "
                         "take it over (the others registered with the old one; docs/transports.md, ZeroMQ)")
    if o.holder and o.size < 2:
        raise UsageError("--holder needs --size 2 or more (rank 0 and a member)")
    return o


def emit(j):
    """One JSON object per line, flushed (the soak reads them as they come); the keys sorted and
    no spaces, as the C++ program's nlohmann::json prints them."""
    j["t"] = time.time()
    sys.stdout.write(json.dumps(j, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    sys.stdout.flush()


def secret_of(o):
    """The job secret's hex: --secret-file (a regular file that neither group nor others may
    read or write, as job_secret::from_file insists), else $CADENCE_JOB_SECRET; None with
    --insecure."""
    if o.insecure:
        return None
    if o.secret_file:
        path = o.secret_file
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise UsageError('the job secret file "%s" does not exist or is not a file' % path)
        if st.st_mode & 0o077:
            raise UsageError('the job secret file "%s" may be read or written by others (chmod 600 it)' % path)
        with open(path, encoding="ascii", errors="replace") as f:
            line = f.readline().rstrip("\n")
        if not line:
            raise UsageError('the job secret file "%s" is empty or unreadable' % path)
        return line
    s = os.environ.get("CADENCE_JOB_SECRET", "")
    if not s:
        raise UsageError("no job secret: set $CADENCE_JOB_SECRET (hex), give --secret-file, or --insecure on loopback")
    return s


def connection(o):
    """The keyword arguments Member and hold_rendezvous share."""
    return {"rendezvous": o.rendezvous or None, "rendezvous_file": o.rendezvous_file or None,
            "address": o.address, "secret": o.secret, "insecure": o.insecure,
            "heartbeat": o.heartbeat_ms / 1000.0, "connect_timeout": o.connect_timeout_ms / 1000.0}


def hold(o, membership):
    """--holder on rank 0: holds the rendezvous until every member has been gone for a heartbeat
    timeout, with a line per registration and loss, and a done line with the counts. (The start
    line comes before the bind here, after it in the C++ program: the members wait for the
    rendezvous file either way.)"""
    kw = connection(o)
    emit({"event": "start", "rank": 0, "pid": os.getpid(), "holder": True})
    r = membership.hold_rendezvous(o.size, exit_when_empty=o.heartbeat_ms / 1000.0,
                                   on_event=lambda line: emit({"event": "rendezvous", "rank": 0, "line": line}),
                                   **kw)
    emit({"event": "done", "rank": 0, "holder": True, "registrations": r["registrations"], "losses": r["losses"],
          "seconds": r["seconds"]})
    return 0


class Rejoining:
    """A rejoin under way: the drop's reason ("evicted" or "quorum") and time, the attempt made."""

    def __init__(self, reason, attempt):
        self.reason, self.dropped_at, self.attempt = reason, time.time(), attempt


# How far one member's life got when it raised (the C++ program's phases): a drop while syncing
# is what --rejoin answers; an error while connecting or joining fails a rejoin attempt (on the
# first life, the process, as before --rejoin existed); one in the closing sync ends the process.
CONNECTING, SYNCING, FINISHING = "connecting", "syncing", "finishing"


def run(o, np, cadence, membership):
    """The rank's lives: the first, then with --rejoin up to N more after a drop while syncing,
    each a new Member in the same slot that joins. A failed attempt (not connected, not
    admitted) counts as one and is followed by the next, a heartbeat interval later."""
    if o.holder and o.rank == 0:
        return hold(o, membership)
    # The state that outlives a Member (a rejoin registers the same arrays with the new one,
    # whose join() overwrites them with a donor's). As the C++ program:
    # static_cast<size_t>(mib * 1024 * 1024 / sizeof(double)).
    elements = int(o.mib * 1024 * 1024 / 8)
    st = {"params": np.ones(elements, dtype=np.float64), "grads": np.zeros(elements, dtype=np.float64),
          # --hold-file: whether the job goes on past --syncs, agreed in every sync; state after
          # the parameters (a newcomer learns it), written only once the sync's all-reduce of it
          # completed.
          "held": np.array([1.0 if o.hold_file else 0.0], dtype=np.float64), "local": 0}
    may_rejoin = o.rejoin > 0 and not (o.rank == 0 and not o.holder)  # rank 0 hosts the rendezvous
    again = None
    while True:
        where = [CONNECTING]
        try:
            return live(o, np, membership, st, o.join or again is not None, again, where)
        except (membership.EvictedError, membership.QuorumError) as e:
            if not may_rejoin or where[0] == FINISHING or (where[0] == CONNECTING and again is None):
                raise
            reason = "evicted" if isinstance(e, membership.EvictedError) else "quorum"
            message = str(e)
        except (cadence.Error, TimeoutError) as e:
            # Not admitted (a construction or a rendezvous file that timed out): a failed
            # attempt. Anywhere else, as before --rejoin: the process fails.
            if again is None or where[0] != CONNECTING:
                raise
            message = str(e)
        if where[0] == SYNCING:  # dropped (again): a new rejoin, its attempts counted on
            again = Rejoining(reason, again.attempt if again else 0)
        if again.attempt >= o.rejoin:
            what = "%s (gave up after %d rejoin attempt%s)" % (message, again.attempt,
                                                               "" if again.attempt == 1 else "s")
            raise (membership.EvictedError if again.reason == "evicted" else membership.QuorumError)(what)
        if where[0] == CONNECTING:  # the last attempt failed: not at once again
            time.sleep(heartbeat_interval(o))
        again.attempt += 1
        emit({"event": "rejoin", "rank": o.rank, "attempt": again.attempt, "reason": again.reason,
              "seconds": time.time() - again.dropped_at, "message": message})


def heartbeat_interval(o):
    """timeouts::scaled's heartbeat interval, in seconds: a fifth of the timeout, at least 1 ms."""
    return max(1, o.heartbeat_ms // 5) / 1000.0


def live(o, np, membership, st, join, again, where):
    """One life of this rank: a Member in its slot that starts (the first life) or joins, and the
    syncs until the job's end; where[0] says how far it got when it raises."""
    kw = connection(o)
    join_timeout = o.join_timeout_ms / 1000.0
    if again is not None:  # an attempt waits at most a quorum timeout to connect, and again to be admitted
        quorum = 8 * o.heartbeat_ms / 1000.0
        join_timeout = min(join_timeout, quorum)
        kw["connect_timeout"] = min(kw["connect_timeout"], quorum)
    m = membership.Member(o.rank, o.size, join_timeout=join_timeout, holder=o.holder, **kw)
    # Closed on every way out (an eviction included): its callbacks refer back to it, a cycle
    # that only close() breaks (nanobind would report the member leaked at exit).
    with m:
        return member_loop(o, np, m, st, join, again, where)


def member_loop(o, np, m, st, join, again, where):
    """The member's part: registers the state, starts or joins, runs the syncs, finishes."""
    params, grads, held = st["params"], st["grads"], st["held"]
    elements = params.size
    m.add_state(params)
    if o.hold_file:
        m.add_state(held)

    ctx = {"detected_at": None, "lost": [], "last": m.stats()}

    def changed(c):
        s = m.stats()
        t = time.time()
        emit({"event": "reconfig", "rank": o.rank, "quorum": c["after"]["id"], "before": c["before"]["ranks"],
              "members": c["after"]["ranks"], "lost": c["lost"], "admitted": c["admitted"], "healed": c["healed"],
              "step": c["committed"], "seconds": s["last_reconfiguration_seconds"]})
        if c["lost"] and c["before"]["id"] != 0:  # not the first quorum's absentees
            if ctx["detected_at"] is None:
                ctx["detected_at"] = t - s["last_reconfiguration_seconds"]
            ctx["lost"] += c["lost"]
        last = ctx["last"]
        if s["state_received_bytes"] > last["state_received_bytes"]:
            emit({"event": "state", "rank": o.rank, "bytes": s["state_received_bytes"] - last["state_received_bytes"],
                  "seconds": s["state_receive_seconds"] - last["state_receive_seconds"], "step": c["committed"]})
        ctx["last"] = s

    m.on_change(changed)
    if join:
        m.join()
    else:
        m.start()
    where[0] = SYNCING
    q = m.quorum
    start = {"event": "start", "rank": o.rank, "pid": os.getpid(), "join": join, "quorum": q["id"],
             "members": q["ranks"], "step": m.committed, "state_bytes": elements * 8, "mode": o.mode}
    if again is not None:  # admitted again: which attempt, and the time from the drop
        start["rejoin"] = again.attempt
        start["rejoin_seconds"] = time.time() - again.dropped_at
    emit(start)

    def agree_on_hold():
        if not o.hold_file:
            return
        h = np.array([1.0 if os.path.exists(o.hold_file) else 0.0], dtype=np.float64)
        m.allreduce(h, "max")
        held[0] = h[0]

    local_steps = 0  # periodic: steps since the last sync (periodic_averager's count)

    def step():
        st["local"] += 1
        d = 0.01 * (o.rank + 1) + 0.001 * float(st["local"] % 7)  # the C++ expression, in float64
        if o.mode == "periodic":
            params[::97] += d
        else:
            grads[::97] = d
        if o.step_ms > 0:
            time.sleep(o.step_ms / 1000.0)

    def periodic_body():
        agree_on_hold()  # before the average, as the C++ program
        m.allreduce_average(params)

    def bsp_body():
        # The optimizer step inside the sync's body (a newcomer admitted at this sync receives
        # the state as the body left it), after the hold's agreement (a discarded attempt leaves
        # params as they were). In place: params is the registered array.
        m.allreduce_average(grads)
        agree_on_hold()
        np.subtract(params, 0.5 * grads, out=params)

    while m.committed < o.syncs or held[0] != 0.0:
        step()
        if o.mode == "periodic":
            local_steps += 1
            if local_steps < o.period:
                continue
            r = m.transact(periodic_body, backup=[params])
            local_steps = 0  # committed: the average was this period's; else the period starts again
        else:
            r = m.transact(bsp_body, backup=[grads], policy="discard")
        if r["outcome"] == "discarded":
            emit({"event": "discarded", "rank": o.rank, "step": m.committed, "quorum": m.quorum["id"],
                  "attempts": r["attempts"]})
            continue
        q = m.quorum
        emit({"event": "commit" if r["outcome"] == "committed" else "healed", "rank": o.rank, "step": r["committed"],
              "quorum": q["id"], "members": q["ranks"], "hash": "%016x" % m.state_hash, "attempts": r["attempts"]})
        if r["outcome"] == "committed" and ctx["detected_at"] is not None:
            emit({"event": "recovered", "rank": o.rank, "lost": ctx["lost"], "step": r["committed"],
                  "seconds": time.time() - ctx["detected_at"]})
            ctx["detected_at"] = None
            ctx["lost"] = []
    # The closing sync (member::finish(), docs/collective.md "The end of the job"); `done`'s
    # step counts it.
    where[0] = FINISHING
    m.finish()
    s = m.stats()
    q = m.quorum
    emit({"event": "done", "rank": o.rank, "step": m.committed, "quorum": q["id"], "members": q["ranks"],
          "hash": "%016x" % m.state_hash, "reconfigurations": s["reconfigurations"],
          "failed_syncs": s["failed_syncs"], "retries": s["retries"], "discarded": s["discarded"],
          "state_sent_bytes": s["state_sent_bytes"], "state_received_bytes": s["state_received_bytes"]})
    return 0


def main(argv):
    try:
        o = parse_args(argv)
        o.secret = secret_of(o)
    except UsageError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2
    try:
        import numpy as np
        import cadence
        import cadence.membership as membership
    except ImportError as e:
        print("%s (rank %d): error: needs NumPy and the cadence package with cadence.membership (set PYTHONPATH "
              "to the folder that holds cadence/): %s" % (PROG, o.rank, e), file=sys.stderr)
        return 1
    try:
        return run(o, np, cadence, membership)
    except membership.EvictedError as e:
        # A stopped process that comes back finds the quorum gone on without it: its expected fate.
        emit({"event": "stopped", "rank": o.rank, "reason": "evicted", "message": str(e)})
        print("%s (rank %d): evicted: %s" % (PROG, o.rank, e), file=sys.stderr)
        return 3
    except membership.QuorumError as e:
        emit({"event": "stopped", "rank": o.rank, "reason": "quorum", "message": str(e)})
        print("%s (rank %d): no quorum: %s" % (PROG, o.rank, e), file=sys.stderr)
        return 3
    except Exception as e:  # noqa: BLE001 (any other error: exit 1 with its message, as the C++ program)
        print("%s (rank %d): error: %s: %s" % (PROG, o.rank, type(e).__name__, e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
