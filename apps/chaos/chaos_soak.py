#!/usr/bin/python3
"""Chaos soak of a collective job that survives faults (issue 36): many short jobs of
cadence-chaos-rank processes (one rank each, over ZeroMQ, on a membership member and its quorum
view), each with seeded random faults injected while it runs, checked against the JSON lines
the ranks print.

Each trial starts --ranks processes (one slot held back in a fraction --late-join of the trials:
it joins later), waits for their "start" lines (the first quorum formed), then injects one to
--max-faults faults, one at a time: each when the job has committed the step drawn for it (a
state, not a clock) and the previous fault's reconfiguration is over (a commit on a new quorum
without the victim, or the newcomer admitted). The kinds:

  kill          kill -9 of a random member (rank 0 included)
  leader        kill -9 of the current leader (the lowest live rank)
  stop          SIGSTOP, resumed after 2-4 heartbeat timeouts: the quorum has gone on without
                it, so it must stop (evicted or refused: exit 3)
  stop_forever  SIGSTOP never resumed (killed once the others are done)
  restart       kill -9 of a member other than rank 0, then a new process in its slot with
                --join after 0.05-1 s
  late_join     the held-back slot starts with --join
  link_down     (--netns) the member's link down, then up after 0.2-0.8 heartbeat timeouts (it
                may stay a member) or 2-4 (the others go on without it; it stops, evicted or
                without a quorum: exit 3)
  partition     (--netns) a minority of the members cut off from the rest (they still reach each
                other), for as long as link_down's; the minority must stop, the rest go on
  link_cut      (--netns, drawn only when --kinds names it) only the link between two members cut
                (a blackhole route to the other's address in each of their namespaces), neither
                the leader the schedule expects (the lowest live member; nor rank 0, without
                --holder), for as long as link_down's: the leader still sees both, and must
                leave one end out (docs/collective.md, "The livelock's cause"), the one with
                the most broken links, on a tie the higher rank. That end, the higher of the
                two, is the fault's victim (counted in "link_victims", lost for the rest of the
                schedule); the other end counts as never hit: it must stay a member

With --netns every slot runs in a network namespace of its own (10.78.0.(rank+1)), joined to a
bridge by a veth pair (apps/soak/soak_support.py's NetnsCluster; the cluster is removed on any
exit); without root or working namespaces the soak prints why and exits 77 (skipped). --kinds
restricts the kinds drawn (the default, all, draws the same schedule as before link faults
existed when --netns is off, and leaves link_cut out: it came later, and every seed draws the
schedule it drew before).

A fault that would leave fewer than 2 members, or a majority no longer reachable, is not drawn
(destructive faults need 3 live members), nor is one that hits rank 0 while a join is still to
come, nor a join once rank 0 is gone: rank 0 holds the ZeroMQ rendezvous, and a new process
cannot register once it is lost (docs/transports.md), so restarts and late joins need it alive
(the others survive its loss). With --holder, rank 0 only holds the rendezvous
(cadence-chaos-rank --holder, membership::hold_rendezvous) and is never hit: the members are
ranks 1..N-1, any of them may be restarted, the leader included (it may also be the held-back
slot, with 3 members or more: the first quorum forms without it), and the holder must count
every process that registered and end by itself once the members are gone (holder_errors).
A link fault's victims count as lost for the rest of the schedule (they may stay). Then it
checks and reports:

  hangs              a trial outlived --trial-timeout (generous: it only catches hangs)
  divergent_commits  a step that two processes committed with different state hashes, or
                     processes that finished with different hashes
  lost_alive         a process never hit by a fault that was evicted or refused (exit 3)
  rank_errors        a process never hit that failed otherwise (exit status not 0 or 3)
  unfinished         a process never hit that did not print "done"
  not_absorbed       a fault whose reconfiguration did not end within 8 quorum timeouts (a
                     link fault: its link back, and each victim either committing again or
                     gone with the others committing without it)
  link_victim_errors a process whose link was cut that neither finished the job nor stopped
                     evicted or without a quorum (exit 3); "link_victims" counts the outcomes

--rejoin N gives every rank cadence-chaos-rank --rejoin N: a process the quorum dropped while it
lived (evicted, or without a quorum on its side) comes back in its slot as a new incarnation
that joins (rank 0 without --holder cannot: it hosts the rendezvous). A process that came back
and committed again counts as "rejoined" (a link victim's outcome too), not lost_alive;
lost_alive still counts a process no fault hit that was dropped and never committed again (it
gave up, or was still rejoining when the job ended). A stop or link fault is then absorbed only
once each victim has also come back or exited, and the job is held until every running process
is back in the newest quorum (or for 8 quorum timeouts at most). --min-rejoined K fails the run (exit 1) unless at least K processes came back.

Not counted as divergent, but reported as "lone_commits": the last commit of a faulted process
that then stopped (exit 3), when no other process committed that step in that quorum: it
committed a sync alone and the survivors ran it again without it (docs/collective.md, "The end
of the job"). A cut link makes this likely: the victim receives the sync's last messages, the
others never get its own.

and measures: steps committed after the first fault against the ideal (the pre-fault pace over
the same time, every initial member's steps) and against what the lost members' own work allows
(the same pace times the quorum's size at each moment); the reconfiguration time, from the
members' "recovered" lines (a member's detection of the loss to its first commit without the
lost rank) and from this driver (the fault to the first commit on a new quorum: adds the
detection, the heartbeat timeout for a stopped process); a joiner's admission (its start to its
"start" line); the state transfer (bytes and seconds from the "state" lines) against the raw
loopback TCP rate measured here (with --netns: between two of the namespaces).

It prints ONE JSON object on stdout; one line per trial goes to stderr. The exit status is 1
when any of the counts above is not zero (the failing trials' output is then kept and named on
stderr), 2 on bad arguments, else 0.

  /usr/bin/python3 apps/chaos/chaos_soak.py --rank-program build/bin/cadence-chaos-rank --trials 50 --seed 1

--python-ranks makes a mixed job: the slots it names run apps/chaos/chaos_rank.py (the same rank
in Python, on cadence.membership.Member, under --python) instead of --rank-program, their
restarts included, in one quorum with the C++ processes; both average bit-identical state, so the
checks above compare their hashes as they do the C++ ones'.

Python 3 standard library only (with apps/soak/soak_support.py, which it shares with the fault
soak). The schedule of a trial depends only on --seed and the
trial's number (and the options), so a failing trial can be rerun alone (--first-trial K
--trials 1).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
from soak_support import (NetnsCluster, add_keep, add_trial_arguments, add_trial_timeout,  # noqa: E402
                          check_executable, check_keep, exit_on_sigterm, finish, last_line, netns_unavailable,
                          non_negative_int, positive_int, raw_link_mbps, signal_popen, soak_root, summary,
                          trial_done, trial_folder, trial_rng)

KINDS = ("kill", "leader", "stop", "stop_forever", "restart", "late_join", "link_down", "partition", "link_cut")
LINK_KINDS = ("link_down", "partition", "link_cut")
DEFAULT_LINK_KINDS = ("link_down", "partition")  # --netns without --kinds: link_cut only when named
MODES = ("periodic", "bsp")
SKIP = 77  # --netns where namespaces cannot be made: ctest's SKIP_RETURN_CODE


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="chaos_soak.py",
        description="Chaos soak of cadence-chaos-rank jobs over ZeroMQ (see the module text).")
    p.add_argument("--rank-program", required=True, help="the cadence-chaos-rank executable")
    p.add_argument("--ranks", type=positive_int, default=4, help="processes per job (default 4; at least 3)")
    add_trial_arguments(p, 10)
    p.add_argument("--syncs", type=positive_int, default=80,
                   help="syncs each job commits before it ends (default 80); faults land in the first 60%%")
    p.add_argument("--max-faults", type=positive_int, default=3, help="faults per trial: 1 to this (default 3)")
    p.add_argument("--late-join", type=float, default=0.25,
                   help="fraction of the trials with a slot held back that joins late (default 0.25; 0: "
                        "none). The first quorum then waits its timeout (8 heartbeat timeouts) for it")
    p.add_argument("--mode", choices=MODES + ("mixed",), default="mixed",
                   help="cadence-chaos-rank --mode: periodic, bsp, or mixed (drawn per trial; default)")
    p.add_argument("--mib", type=float, default=4.0, help="MiB of parameters per rank (default 4)")
    p.add_argument("--step-ms", type=non_negative_int, default=2, help="milliseconds per local step (default 2)")
    p.add_argument("--heartbeat-ms", type=positive_int, default=500,
                   help="heartbeat timeout (op 4x, quorum 8x; default 500)")
    add_trial_timeout(p, 120)
    p.add_argument("--insecure", action="store_true",
                   help="no job secret (the wire unencrypted: the state transfer against the raw link "
                        "without the encryption's cost)")
    p.add_argument("--netns", action="store_true",
                   help="each rank in a network namespace of its own on a bridge (root), and the link faults "
                        "link_down and partition drawn too (link_cut when --kinds names it); without root or "
                        "namespaces: exit 77 (skip)")
    p.add_argument("--holder", action="store_true",
                   help="rank 0 only holds the rendezvous and is never hit; the members are ranks 1..N-1 (so "
                        "--ranks 4 or more), any of which may be restarted, the leader included")
    p.add_argument("--kinds", default="",
                   help="the fault kinds drawn, comma-separated (default: all but link_cut; link_down, partition and "
                        "link_cut need --netns; late_join is --late-join's)")
    p.add_argument("--rejoin", type=non_negative_int, default=0, metavar="N",
                   help="cadence-chaos-rank --rejoin N on every rank: a process the quorum dropped while it lived "
                        "comes back in its slot, at most N attempts (default 0: it stops, exit 3)")
    p.add_argument("--min-rejoined", type=non_negative_int, default=0, metavar="K",
                   help="exit 1 unless at least K processes rejoined and committed again (default 0; a check "
                        "that --rejoin works, for the ctest)")
    p.add_argument("--python-ranks", default="", metavar="SPEC",
                   help="the slots whose processes (restarts included) run apps/chaos/chaos_rank.py, the same "
                        "rank on cadence.membership.Member, instead of --rank-program, in one quorum with the "
                        "C++ ones: all, odd, even, or slots such as 1,3 (default: none)")
    p.add_argument("--python", default=sys.executable, metavar="PYTHON",
                   help="--python-ranks: the interpreter that runs chaos_rank.py (default: this one); it finds "
                        "NumPy and the cadence package through the environment (PYTHONPATH)")
    add_keep(p)
    a = p.parse_args(argv)
    check_executable(p, "--rank-program", a.rank_program)
    if a.ranks < 3:
        p.error("--ranks: at least 3 (a job of 2 cannot lose a member and go on: the majority rule)")
    if a.holder and a.ranks < 4:
        p.error("--holder: --ranks at least 4 (rank 0 holds the rendezvous, and 3 members are needed to lose one)")
    if not 0 <= a.late_join <= 1:
        p.error("--late-join: expected a fraction in [0, 1], got %g" % a.late_join)
    if not 0 < a.mib <= 4096:
        p.error("--mib: expected (0, 4096], got %g" % a.mib)
    if a.syncs < 10:
        p.error("--syncs: at least 10 (faults land between the warm-up and 60%% of the syncs), got %d" % a.syncs)
    check_keep(p, a.keep)
    a.kinds = [k for k in a.kinds.split(",") if k] if a.kinds else None
    for k in a.kinds or []:
        if k not in KINDS or k == "late_join":
            p.error("--kinds: '%s' is not a fault kind (%s)"
                    % (k, ", ".join(x for x in KINDS if x != "late_join")))
        if k in LINK_KINDS and not a.netns:
            p.error("--kinds: %s needs --netns (a link of its own per rank)" % k)
    a.python_slots = python_slots(p, a.python_ranks, a.ranks)
    if a.python_slots:
        check_python(p, a.python)
    return a


CHAOS_RANK_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos_rank.py")


def python_slots(p, spec, ranks):
    """--python-ranks: the sorted slots that SPEC names (all, odd, even, or a comma-separated list
    of ranks); [] for none."""
    if not spec:
        return []
    if spec == "all":
        return list(range(ranks))
    if spec in ("odd", "even"):
        return [r for r in range(ranks) if r % 2 == (1 if spec == "odd" else 0)]
    slots = set()
    for item in spec.split(","):
        try:
            r = int(item)
        except ValueError:
            p.error("--python-ranks: '%s' is not a slot (all, odd, even, or ranks such as 1,3), in '%s'"
                    % (item, spec))
        if not 0 <= r < ranks:
            p.error("--python-ranks: slot %d is out of range for --ranks %d (0..%d)" % (r, ranks, ranks - 1))
        slots.add(r)
    return sorted(slots)


def check_python(p, python):
    """--python: an interpreter that imports NumPy and cadence.membership, asked once here rather
    than failing every Python rank of every trial."""
    if not os.path.isfile(CHAOS_RANK_PY):
        p.error("--python-ranks: %s is missing" % CHAOS_RANK_PY)
    try:
        r = subprocess.run([python, "-c", "import numpy, cadence.membership"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except OSError as e:
        p.error("--python: cannot run '%s': %s" % (python, e))
    except subprocess.TimeoutExpired:
        p.error("--python: '%s' took over 60 s to import numpy and cadence.membership" % python)
    if r.returncode != 0:
        lines = r.stdout.decode(errors="replace").strip().splitlines()
        p.error("--python: '%s' cannot import numpy and cadence.membership (PYTHONPATH=%s): %s"
                % (python, os.environ.get("PYTHONPATH", ""), lines[-1] if lines else "exit %d" % r.returncode))


def schedule(args, trial):
    """The trial's mode, held-back slot (None or a rank) and faults: a list of dicts (kind,
    step: the committed step after which it is injected, victim: a rank, delay: seconds to the
    resume or the restart), drawn against the members the job will have at each fault."""
    rng = trial_rng(args.seed, trial)
    mode = rng.choice(MODES) if args.mode == "mixed" else args.mode
    # The held-back slot: without --holder never rank 0 (the rendezvous, which every process
    # needs to register). With --holder it may be rank 1, the first quorum's leader, when 3 or
    # more members remain: the others count its slot lost an op timeout after start() and form
    # the first quorum without it (a majority of the members; docs/collective.md); with 2
    # members the one left is half without the leader, which must not go on.
    first_late = (1 if args.ranks - 1 >= 3 else 2) if args.holder else 1
    late = rng.randint(first_late, args.ranks - 1) if rng.random() < args.late_join else None
    n = rng.randint(1, args.max_faults)
    warm = max(3, args.syncs // 10)
    last = max(warm + n, int(0.6 * args.syncs))
    steps = sorted(rng.sample(range(warm, last), n))
    live = set(range(1 if args.holder else 0, args.ranks)) - ({late} if late is not None else set())
    rank0 = True  # rank 0 (the rendezvous) alive
    join_pending = late is not None
    hb = args.heartbeat_ms / 1000.0
    faults = []
    for i, step in enumerate(steps):
        # The late joiner comes at a random fault slot, or the last one at the latest.
        if join_pending and (rng.random() < 0.5 or i == n - 1):
            faults.append({"kind": "late_join", "step": step, "victim": late, "delay": 0.0})
            live.add(late)
            join_pending = False
            continue
        kinds = []
        if len(live) >= 3:
            kinds += ["kill", "stop", "stop_forever"]
            if not (join_pending and min(live) == 0):
                kinds.append("leader")
            if rank0 and len(live - {0}) > 0:
                kinds.append("restart")
            if args.netns:
                kinds += list(DEFAULT_LINK_KINDS)
                # Drawn only when named, so that the seeds drawn before it existed draw the same.
                if "link_cut" in (args.kinds or ()) and len(cut_pool(live)) >= 2:
                    kinds.append("link_cut")
        if args.kinds is not None:
            kinds = [k for k in kinds if k in args.kinds]
        if not kinds:
            continue
        kind = rng.choice(kinds)
        group = pair = None
        if kind == "leader":
            victim = min(live)
        elif kind == "restart":
            victim = rng.choice(sorted(live - {0}))
        else:
            pool = sorted(live - ({0} if join_pending else set()))
            if kind == "partition":  # a minority: the rest keep more than half
                group = sorted(rng.sample(pool, rng.randint(1, (len(live) - 1) // 2)))
                victim = group[0]
            elif kind == "link_cut":  # two members other than the leader; the higher is left out
                pair = sorted(rng.sample(cut_pool(live), 2))
                victim = pair[1]
            else:
                victim = rng.choice(pool)
        delay = 0.0
        if kind == "stop":
            delay = round(rng.uniform(2.0, 4.0) * hb, 3)
        elif kind == "restart":
            delay = round(rng.uniform(0.05, 1.0), 3)
        elif kind in LINK_KINDS:
            # Down for less than the heartbeat timeout (it may stay a member) or for 2-4 of them
            # (the others must go on without it).
            delay = round(rng.uniform(0.2, 0.8) * hb if rng.random() < 0.5 else rng.uniform(2.0, 4.0) * hb, 3)
        f = {"kind": kind, "step": step, "victim": victim, "delay": delay}
        if group is not None:
            f["group"] = group
        if pair is not None:
            f["pair"] = pair
        faults.append(f)
        if kind != "restart":
            # A link fault's victims count as lost (they may stay when the link returns in
            # time): later faults are drawn against fewer members, never more.
            for v in group or [victim]:
                live.discard(v)
                if v == 0:
                    rank0 = False
    return mode, late, faults


def cut_pool(live):
    """link_cut: the members whose link to one another may be cut, the leader the schedule expects
    (the lowest live member) and rank 0 (the rendezvous, without --holder) left out, so that the
    leader still sees both ends."""
    return sorted(live - {min(live), 0}) if live else []


class Proc:
    """One process of a trial: its rank, how it started, its lines so far."""

    def __init__(self, trial, rank, join, index):
        self.rank, self.join, self.index = rank, join, index
        self.out = os.path.join(trial.folder, "rank%d-%d.jsonl" % (rank, index))
        self.err = os.path.join(trial.folder, "rank%d-%d.err" % (rank, index))
        a = trial.args
        program = [a.python, CHAOS_RANK_PY] if rank in a.python_slots else [a.rank_program]
        cmd = program + ["--rank", str(rank), "--size", str(a.ranks), "--rendezvous-file", trial.rendezvous,
               "--syncs", str(a.syncs), "--mode", trial.mode, "--mib", "%g" % a.mib, "--step-ms", str(a.step_ms),
               "--heartbeat-ms", str(a.heartbeat_ms), "--join-timeout-ms", str(int(a.trial_timeout * 1000)),
               "--hold-file", trial.hold]
        if a.holder:
            cmd.append("--holder")
        if a.insecure:
            cmd.append("--insecure")
        if join:
            cmd.append("--join")
        if a.rejoin:
            cmd += ["--rejoin", str(a.rejoin)]
        if trial.cluster is not None:  # in its slot's namespace, on its address there
            cmd = trial.cluster.command(rank, cmd + ["--address", trial.cluster.address(rank)])
        env = dict(os.environ)
        if not a.insecure:
            env["CADENCE_JOB_SECRET"] = trial.secret
        self.launched = time.time()
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                      start_new_session=True)
        self.lines, self.offset, self.partial = [], 0, b""
        self.faulted = False  # hit by a fault (its fate is then free)
        self.stopped = False  # SIGSTOP'd, not resumed
        self.rejoin_missed = False  # still rejoining when the job ended (killed)

    def poll_lines(self):
        with open(self.out, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        fresh = []
        for raw in complete:
            try:
                fresh.append(json.loads(raw))
            except ValueError:
                fresh.append({"event": "malformed", "text": raw.decode(errors="replace")})
        self.lines += fresh
        return fresh

    def first(self, event):
        for line in self.lines:
            if line.get("event") == event:
                return line
        return None

    def signal(self, sig):
        signal_popen(self.p, sig)

    def rejoining(self):
        """Dropped and not back yet: running, with a rejoin line after its last start line."""
        if self.p.poll() is not None:
            return False
        events = [line.get("event") for line in self.lines if line.get("event") in ("start", "rejoin")]
        return bool(events) and events[-1] == "rejoin"

    def came_back(self):
        """Rejoined (a start line with "rejoin") and committed a sync after it."""
        back = False
        for line in self.lines:
            if line.get("event") == "start" and "rejoin" in line:
                back = True
            elif back and line.get("event") == "commit":
                return True
        return False


class Trial:
    def __init__(self, args, number, folder, cluster=None):
        self.args, self.number, self.folder, self.cluster = args, number, folder, cluster
        self.mode, self.late, self.faults = schedule(args, number)
        self.rendezvous = os.path.join(folder, "rendezvous")
        # While this file exists the ranks go on past --syncs (they agree on it in every sync):
        # removed once every fault is absorbed, so the job never ends under a joiner still on
        # its way in (a restart drawn near the end of the job is then admitted, not missed).
        self.hold = os.path.join(folder, "hold")
        self.secret = os.urandom(32).hex()
        self.procs = []
        self.commits = []  # (t, step, quorum, members, hash, rank)
        self.result = {"hang": False, "divergent": 0, "lost_alive": 0, "rank_errors": 0, "unfinished": 0,
                       "not_absorbed": 0, "skipped": 0, "problems": [], "recovered": [], "fault_to_commit": [],
                       "admission": [], "state": [], "steps_committed": 0, "steps_ideal": 0.0,
                       "steps_allowed": 0.0, "faulted_errors": 0, "joins_missed": 0,
                       "link_victims": {"stayed": 0, "evicted": 0, "no_quorum": 0, "rejoined": 0},
                       "link_victim_errors": 0, "lone_commits": 0, "holder_errors": 0, "rejoined": 0,
                       "rejoin_attempts": 0, "rejoin": []}
        self.timers = []  # (time.monotonic() when, action, proc or rank)

    def problem(self, text):
        self.result["problems"].append(text)

    def start(self, rank, join):
        p = Proc(self, rank, join, len([q for q in self.procs if q.rank == rank]))
        self.procs.append(p)
        return p

    def is_holder(self, p):
        """Whether p holds the rendezvous (--holder: rank 0, never hit, never restarted)."""
        return self.args.holder and p.rank == 0

    def current(self, rank):
        """The newest process in slot `rank`."""
        for p in reversed(self.procs):
            if p.rank == rank:
                return p
        return None

    def pump(self):
        """Reads every process's new lines; runs the timers that are due."""
        for p in self.procs:
            for line in p.poll_lines():
                if line.get("event") == "commit":
                    self.commits.append((line["t"], line["step"], line["quorum"], line["members"], line["hash"],
                                         p.rank))
        now = time.monotonic()
        due = [x for x in self.timers if x[0] <= now]
        self.timers = [x for x in self.timers if x[0] > now]
        for _, action, arg in due:
            if action == "cont":
                arg.stopped = False
                arg.signal(signal.SIGCONT)
            elif action == "restart":
                self.start(arg, True)
            elif action == "link_back":
                self.link_fault(arg, False)

    def link_fault(self, f, cut):
        """A link fault's start (cut) or end: the victim's link down or up, its group onto the
        other bridge or back, or the link between the pair's two members cut or mended. The end's
        time (wall clock, as the ranks' lines) goes into f."""
        group = f.get("group", [f["victim"]])
        if f["kind"] == "link_down":
            self.cluster.link(f["victim"], not cut)
        elif f["kind"] == "link_cut":
            self.cluster.cut_link(f["pair"][0], f["pair"][1], cut)
        elif cut:
            self.cluster.partition(group)
        else:
            self.cluster.heal(group)
        if not cut:
            f["restored_t"] = time.time()

    def max_step(self):
        return max((c[1] for c in self.commits), default=0)

    def max_quorum(self):
        return max((c[2] for c in self.commits), default=0)

    def running(self):
        return [p for p in self.procs if p.p.poll() is None]

    def run(self):
        deadline = time.monotonic() + self.args.trial_timeout
        with open(self.hold, "w"):
            pass
        try:
            for r in range(self.args.ranks):
                if r != self.late:
                    self.start(r, False)
            if self.wait_for_starts(deadline):
                self.inject(deadline)
                self.wait_for_rejoins(deadline)
                os.remove(self.hold)  # every fault absorbed (or given up on): the job may end
                self.wait_for_end(deadline)
        finally:
            if os.path.exists(self.hold):
                os.remove(self.hold)
            for p in self.procs:
                if p.p.poll() is None:
                    p.signal(signal.SIGKILL)
                    p.p.wait()
            if self.cluster is not None:
                self.cluster.restore()  # a hang's link still down: the next trial starts whole
        self.pump()
        if not self.result["hang"]:
            self.check()
        return self.result

    def wait_for_starts(self, deadline):
        while time.monotonic() < deadline:
            self.pump()
            if all(p.first("start") for p in self.procs):
                return True
            for p in self.procs:
                if p.p.poll() is not None and not p.first("start"):
                    self.problem("rank %d exited (status %s) before its start line: %s"
                                 % (p.rank, p.p.returncode, self.tail(p)))
                    self.result["rank_errors"] += 1
                    return False
            time.sleep(0.01)
        self.result["hang"] = True
        self.problem("no start line from every rank within --trial-timeout")
        return False

    def tail(self, p):
        return last_line(p.err)

    def inject(self, deadline):
        hb = self.args.heartbeat_ms / 1000.0
        absorb_limit = 8 * 8 * hb + 10  # 8 quorum timeouts, plus a process's start
        stop_after = self.args.syncs - 3  # later faults could land after the job's end
        for f in self.faults:
            # Wait for the fault's step (a state, not a clock).
            while time.monotonic() < deadline and self.max_step() < f["step"]:
                self.pump()
                if not self.running():
                    break
                time.sleep(0.005)
            if time.monotonic() >= deadline:
                self.result["hang"] = True
                self.problem("step %d never committed within --trial-timeout" % f["step"])
                return
            # With --holder a late join is never skipped: the holder ends by itself only once every
            # member slot has registered, so the held-back slot's process starts even near the
            # end (admitted, or a join missed: reported, not failed).
            held_back = f["kind"] == "late_join" and self.args.holder and self.running()
            if (self.max_step() >= stop_after or not self.running()) and not held_back:
                f["skipped"] = True
                self.result["skipped"] += 1
                continue
            q_before = self.max_quorum()
            t_fault = time.time()
            f["at_step"] = self.max_step()
            victim = None
            if f["kind"] == "late_join":
                self.start(f["victim"], True)
            elif f["kind"] in LINK_KINDS:
                f["procs"] = {v: self.current(v) for v in f.get("group", [f["victim"]])}
                for p in f["procs"].values():
                    p.faulted = True
                self.link_fault(f, True)
                self.timers.append((time.monotonic() + f["delay"], "link_back", f))
            else:
                victim = self.current(f["victim"])
                victim.faulted = True
                if f["kind"] in ("kill", "leader", "restart"):
                    victim.signal(signal.SIGKILL)
                else:
                    victim.signal(signal.SIGSTOP)
                    victim.stopped = True
                    if f["kind"] == "stop":
                        self.timers.append((time.monotonic() + f["delay"], "cont", victim))
                if f["kind"] == "restart":
                    self.timers.append((time.monotonic() + f["delay"], "restart", f["victim"]))
            # Absorbed: a commit on a new quorum without the victim's slot (a restart: with the
            # new process admitted), or the newcomer admitted.
            limit = time.monotonic() + absorb_limit
            measured = admitted = False
            while time.monotonic() < min(limit, deadline):
                self.pump()
                if not measured and f["kind"] != "late_join":
                    after = [c for c in self.commits if c[0] > t_fault and c[2] > q_before]
                    if after:
                        first = min(after)
                        self.result["fault_to_commit"].append(first[0] - t_fault)
                        f["fault_to_commit"] = round(first[0] - t_fault, 4)
                        measured = True
                done = False
                if f["kind"] in ("late_join", "restart"):
                    # The process started for this fault, not the one it killed (itself a joiner
                    # when a slot is restarted twice: seed 1, trial 24 of the --holder soak took
                    # the killed joiner's start line for the newcomer's and ended the job under it).
                    newest = self.current(f["victim"])
                    if newest.join and newest is not victim and newest.first("start"):
                        if not admitted:
                            self.result["admission"].append(newest.first("start")["t"] - newest.launched)
                            admitted = True
                        done = measured or f["kind"] == "late_join"
                    elif newest.join and newest is not victim and newest.p.poll() is not None:
                        self.problem("the process that joined rank %d's slot exited (status %s): %s"
                                     % (f["victim"], newest.p.returncode, self.tail(newest)))
                        done = True
                elif f["kind"] in LINK_KINDS:
                    done = self.link_absorbed(f, t_fault, measured)
                else:
                    done = measured and any(c[0] > t_fault and f["victim"] not in c[3] for c in self.commits)
                    if done and f["kind"] == "stop" and self.args.rejoin:
                        # The victim, resumed, comes back (or exits: rank 0, or it gave up).
                        done = victim.p.poll() is not None or victim.came_back()
                if done:
                    break
                if not [p for p in self.running() if not p.stopped]:
                    break
                time.sleep(0.005)
            else:
                if time.monotonic() >= deadline:
                    self.result["hang"] = True
                    self.problem("fault %s on rank %d: still not absorbed at --trial-timeout" % (f["kind"], f["victim"]))
                    return
                self.result["not_absorbed"] += 1
                self.problem("fault %s on rank %d at step %d: no reconfiguration within %.0f s"
                             % (f["kind"], f["victim"], f["at_step"], absorb_limit))

    def link_absorbed(self, f, t_fault, measured):
        """A link fault is over once its link is back and each victim has either committed a sync
        again (it stayed a member: a short cut) or exited (lost: evicted, or no quorum on its
        side); when one was lost, the others must also have committed without it."""
        if "restored_t" not in f:
            return False
        lost = []
        back = False
        for v in f.get("group", [f["victim"]]):
            p = self.current(v)
            if p.p.poll() is not None:
                lost.append(v)
            elif p.rejoining() or not any(c[5] == v and c[0] > f["restored_t"] for c in self.commits):
                return False  # --rejoin: one on its way back is waited for
            back = back or p.came_back()
        f["outcome"] = "lost" if lost else "rejoined" if back else "stayed"
        return not lost or (measured and any(c[0] > t_fault and not set(lost) & set(c[3]) for c in self.commits))

    def out_of_quorum(self):
        """The running processes (not SIGSTOP'd, not the holder) that the newest committed quorum
        does not hold: dropped (the drop not yet noticed there: a live rank left out waits in its
        old sync up to the op timeout), rejoining, or joiners not yet admitted."""
        if not self.commits:
            return []
        newest = max(self.commits, key=lambda c: (c[2], c[0]))
        return [p for p in self.running() if not p.stopped and not self.is_holder(p) and p.rank not in newest[3]]

    def wait_for_rejoins(self, deadline):
        """--rejoin: holds the job (its hold file) while a process is on its way back or out of
        the quorum, for at most 8 quorum timeouts plus a process's start (as a fault's
        absorption), so that the job does not end under it."""
        if not self.args.rejoin:
            return
        limit = min(deadline, time.monotonic() + 8 * 8 * self.args.heartbeat_ms / 1000.0 + 10)
        while time.monotonic() < limit:
            self.pump()
            if not any(p.rejoining() for p in self.procs) and not self.out_of_quorum():
                return
            time.sleep(0.01)

    def hold_for_rejoins(self, state):
        """--rejoin, while the job ends: a process dropped after the hold file was removed (its
        drop noticed late, or a loss near the end) holds the job again until it is back, within
        one absorption limit in all, unless a member has already finished."""
        if not self.args.rejoin or any(p.first("done") for p in self.procs):
            return
        pending = any(p.rejoining() for p in self.procs) or self.out_of_quorum()
        now = time.monotonic()
        if pending and state.get("until", now + 1) > now:
            if "until" not in state:
                state["until"] = now + 8 * 8 * self.args.heartbeat_ms / 1000.0 + 10
            if not os.path.exists(self.hold):
                with open(self.hold, "w"):
                    pass
        elif os.path.exists(self.hold):
            os.remove(self.hold)

    def wait_for_end(self, deadline):
        held = {}
        while time.monotonic() < deadline:
            self.pump()
            self.hold_for_rejoins(held)
            active = [p for p in self.running() if not p.stopped]
            if not active and not self.timers:
                break
            # Members are done: a joiner still waiting to be admitted came too late. (The holder
            # waits for every member slot to empty, a waiting joiner's included: not a member.)
            members = [p for p in active if not self.is_holder(p)]
            members_done = [p for p in members if (not p.join or p.first("start")) and not p.rejoining()]
            if not members_done and members and any(p.first("done") for p in self.procs):
                for p in members:
                    if p.rejoining():  # dropped, not back in time: its fate is decided in check()
                        p.rejoin_missed = True
                        self.problem("rank %d was still rejoining when the job ended" % p.rank)
                    else:
                        self.result["joins_missed"] += 1
                        self.problem("rank %d's joiner was still waiting when the job ended" % p.rank)
                        p.faulted = True
                    p.signal(signal.SIGKILL)
            time.sleep(0.01)
        else:
            self.result["hang"] = True
            self.problem("processes still running after --trial-timeout %g s: ranks %s"
                         % (self.args.trial_timeout, [p.rank for p in self.running() if not p.stopped]))
            return
        for p in self.running():  # stopped for good: killed now
            p.signal(signal.SIGKILL)
            p.p.wait()

    def lone_commits(self):
        """The commits that are not the job's: a faulted process that then stopped (exit 3) may
        have committed its last sync alone (its collectives completed here, nowhere else: a cut
        link loses its last messages to the others), and the survivors ran that sync again
        without it (docs/collective.md, "The end of the job": there is no second commit phase;
        the job's history is the survivors'). Such a commit is the stopped process's last, and no
        other process committed that step in that quorum. Returns their (rank, t)."""
        lone = set()
        for p in self.procs:
            # Each life's last commit: before each rejoin line (--rejoin: a process dropped, any
            # process, that came back as a new incarnation), and the last one of a faulted
            # process that then stopped.
            lasts, last = [], None
            for line in p.lines:
                if line.get("event") == "commit":
                    last = line
                elif line.get("event") == "rejoin" and last is not None:
                    lasts.append(last)
                    last = None
            if p.faulted and p.p.returncode == 3 and last is not None:
                lasts.append(last)
            for last in lasts:
                if not any(c[1] == last["step"] and c[2] == last["quorum"] and c[5] != p.rank
                           for c in self.commits):
                    lone.add((p.rank, last["t"]))
        return lone

    def check(self):
        r = self.result
        by_step = {}
        lone = self.lone_commits()
        r["lone_commits"] = len(lone)
        for t, step, q, members, h, rank in self.commits:
            if (rank, t) not in lone:
                by_step.setdefault(step, set()).add(h)
        divergent = sorted(s for s, hs in by_step.items() if len(hs) > 1)
        if divergent:
            r["divergent"] += len(divergent)
            self.problem("steps committed with different hashes: %s" % divergent[:10])
        members = [p for p in self.procs if not self.is_holder(p)]
        if self.args.holder:
            self.check_holder(self.procs[0], members)
        dones = [(p, p.first("done")) for p in members if p.first("done")]
        finals = {(d["step"], d["hash"]) for _, d in dones}
        if len(finals) > 1:
            r["divergent"] += 1
            self.problem("processes finished with different (step, hash): %s" % sorted(finals))
        link_hit = set()
        for f in self.faults:
            if f["kind"] in LINK_KINDS and "at_step" in f:
                link_hit |= {f["procs"][v] for v in f.get("group", [f["victim"]])}
        for p in members:
            rc = p.p.returncode
            stopped = p.first("stopped")
            rejoins = [line for line in p.lines if line.get("event") == "rejoin"]
            r["rejoin_attempts"] += len(rejoins)
            r["rejoin"] += [line["rejoin_seconds"] for line in p.lines
                            if line.get("event") == "start" and "rejoin_seconds" in line]
            if p.came_back():
                r["rejoined"] += 1
            if p in link_hit:
                # Cut off: it stays (finishes the job), comes back (--rejoin) or stops by itself,
                # evicted or without a quorum (exit 3); anything else is an error (one still
                # running is a hang). One still rejoining when the job ended: its drop's reason.
                reason = stopped.get("reason") if stopped else None
                if p.rejoin_missed:
                    rc, reason = 3, rejoins[-1]["reason"]
                if rc == 0 and p.first("done"):
                    r["link_victims"]["rejoined" if p.came_back() else "stayed"] += 1
                elif rc == 3 and reason in ("evicted", "quorum"):
                    r["link_victims"]["evicted" if reason == "evicted" else "no_quorum"] += 1
                else:
                    r["link_victim_errors"] += 1
                    self.problem("rank %d (its link cut) exited with status %s: %s" % (p.rank, rc, self.tail(p)))
                continue
            if p.faulted:
                if rc not in (0, 3, -signal.SIGKILL):
                    r["faulted_errors"] += 1
                    self.problem("rank %d (faulted) exited with status %s: %s" % (p.rank, rc, self.tail(p)))
                continue
            if rc == 3 or p.rejoin_missed:
                r["lost_alive"] += 1
                if p.rejoin_missed:
                    self.problem("rank %d was never hit, but was dropped (%s) and not back by the job's end"
                                 % (p.rank, rejoins[-1]["reason"]))
                else:
                    self.problem("rank %d was never hit, but stopped (%s): %s"
                                 % (p.rank, stopped.get("reason") if stopped else "?", self.tail(p)))
            elif rc != 0:
                r["rank_errors"] += 1
                self.problem("rank %d was never hit, but exited with status %s: %s" % (p.rank, rc, self.tail(p)))
            elif not p.first("done"):
                r["unfinished"] += 1
                self.problem("rank %d exited 0 without a done line" % p.rank)
        for p in self.procs:
            for line in p.lines:
                if line.get("event") == "recovered":
                    r["recovered"].append(line["seconds"])
                elif line.get("event") == "state":
                    r["state"].append((line["bytes"], line["seconds"]))
        self.efficiency()

    def check_holder(self, h, members):
        """--holder: rank 0 (h, the first process started) announced itself as the holder, ended
        by itself (exit 0, a done line) and counted every member process that registered: at
        least those that printed their start line (admitted), at most every one started; and
        every one of them gone by the end."""
        r = self.result
        done = h.first("done")
        start = h.first("start")
        if not start or not start.get("holder") or h.p.returncode != 0 or not done:
            r["holder_errors"] += 1
            self.problem("the rendezvous holder exited with status %s%s%s: %s"
                         % (h.p.returncode, "" if start and start.get("holder") else " without its holder start line",
                            "" if done else " without a done line", self.tail(h)))
            return
        admitted = sum(1 for p in members if p.first("start"))
        # --rejoin: each attempt registers a new incarnation of its process's slot.
        incarnations = len(members) + sum(1 for p in members for line in p.lines if line.get("event") == "rejoin")
        if not admitted <= done["registrations"] <= incarnations or done["losses"] != done["registrations"]:
            r["holder_errors"] += 1
            self.problem("the rendezvous holder counted %d registrations and %d losses; %d member processes "
                         "started, %d admitted" % (done["registrations"], done["losses"], len(members), admitted))

    def efficiency(self):
        """Steps committed after the first fault against the pre-fault pace (see the module text)."""
        r = self.result
        hit = [f for f in self.faults if "at_step" in f]
        if not hit or not self.commits:
            return
        first_t = {}
        size = {}
        for t, step, q, members, h, rank in self.commits:
            if step not in first_t or t < first_t[step]:
                first_t[step] = t
                size[step] = len(members)
        s0 = hit[0]["at_step"]
        steps = sorted(first_t)
        if s0 < 3 or s0 not in first_t or steps[-1] <= s0:
            return
        pace = (s0 - 1) / (first_t[s0] - first_t[1]) if first_t[s0] > first_t[1] else None
        if not pace:
            return
        initial = size[s0]
        after = [s for s in steps if s > s0]
        span = first_t[after[-1]] - first_t[s0]
        r["steps_committed"] = sum(size[s] for s in after) 
        r["steps_ideal"] = span * pace * initial 
        # What the lost members' own work allows: the pace times the quorum's size at each moment.
        allowed, prev = 0.0, s0
        for s in after:
            allowed += (first_t[s] - first_t[prev]) * pace * size[prev]
            prev = s
        r["steps_allowed"] = allowed 


def main(argv):
    args = parse_args(argv)
    if args.netns:
        why = netns_unavailable()
        if why:
            print("chaos_soak: --netns: %s; skipped" % why, file=sys.stderr)
            return SKIP
    exit_on_sigterm()  # a TERM (ctest's timeout) still removes the namespaces and the processes
    try:
        if not args.netns:
            return soak(args, None)
        with NetnsCluster(args.ranks) as cluster:
            return soak(args, cluster)
    except KeyboardInterrupt:  # the trial's processes and the namespaces are gone by now
        print("chaos_soak: interrupted", file=sys.stderr)
        return 130


def soak(args, cluster):
    root = soak_root(args.keep, "chaos-soak")
    # The raw link the state transfer goes over: loopback, or between two namespaces.
    raw = raw_link_mbps() if cluster is None else cluster.raw_link_mbps()
    totals = {"trials": args.trials, "seed": args.seed, "first_trial": args.first_trial, "ranks": args.ranks,
              "syncs": args.syncs, "mib": args.mib, "heartbeat_ms": args.heartbeat_ms, "secure": not args.insecure,
              "netns": cluster is not None,
              "modes": {m: 0 for m in MODES}, "faults": {k: 0 for k in KINDS}, "faults_skipped": 0,
              "hangs": 0, "divergent_commits": 0, "lost_alive": 0, "rank_errors": 0, "unfinished": 0,
              "not_absorbed": 0, "faulted_errors": 0, "joins_missed": 0,
              "link_faults": {"short": 0, "long": 0},
              "link_victims": {"stayed": 0, "evicted": 0, "no_quorum": 0, "rejoined": 0}, "link_victim_errors": 0,
              "lone_commits": 0, "holder": args.holder, "holder_errors": 0,
              "rejoin": args.rejoin, "rejoined": 0, "rejoin_attempts": 0}
    if args.python_slots:  # only then: the default output stays as it was
        totals["python_ranks"] = args.python_slots
    recovered, fault_to_commit, admission, state, rejoin = [], [], [], [], []
    committed = ideal = allowed = 0.0
    failed = []
    started = time.monotonic()
    for number in range(args.first_trial, args.first_trial + args.trials):
        folder = trial_folder(root, number)
        trial = Trial(args, number, folder, cluster)
        t = time.monotonic()
        r = trial.run()
        totals["modes"][trial.mode] += 1
        for f in trial.faults:
            if f.get("skipped"):
                totals["faults_skipped"] += 1
            elif "at_step" in f:
                totals["faults"][f["kind"]] += 1
                if f["kind"] in LINK_KINDS:
                    totals["link_faults"]["short" if f["delay"] < args.heartbeat_ms / 1000.0 else "long"] += 1
        totals["hangs"] += int(r["hang"])
        for k, key in (("divergent", "divergent_commits"), ("lost_alive", "lost_alive"), ("rank_errors", "rank_errors"),
                       ("unfinished", "unfinished"), ("not_absorbed", "not_absorbed"),
                       ("faulted_errors", "faulted_errors"), ("joins_missed", "joins_missed"),
                       ("link_victim_errors", "link_victim_errors"), ("lone_commits", "lone_commits"),
                       ("holder_errors", "holder_errors"), ("rejoined", "rejoined"),
                       ("rejoin_attempts", "rejoin_attempts")):
            totals[key] += r[k]
        rejoin += r["rejoin"]
        for k, n in r["link_victims"].items():
            totals["link_victims"][k] += n
        recovered += r["recovered"]
        fault_to_commit += r["fault_to_commit"]
        admission += r["admission"]
        state += r["state"]
        committed += r["steps_committed"]
        ideal += r["steps_ideal"]
        allowed += r["steps_allowed"]
        bad = (r["hang"] or r["divergent"] or r["lost_alive"] or r["rank_errors"] or r["unfinished"] or
               r["not_absorbed"] or r["link_victim_errors"] or r["holder_errors"])
        faults = ", ".join("%s %s@%s%s%s%s" % (f["kind"], "-".join("r%d" % v for v in f["pair"]) if "pair" in f else
                                               "+".join("r%d" % v for v in f.get("group", [f["victim"]])),
                                               f.get("at_step", f["step"]),
                                               " +%.2fs" % f["delay"] if f["delay"] else "",
                                               " " + f["outcome"] if "outcome" in f else "",
                                             " (skipped)" if f.get("skipped") else
                                             " %.3fs" % f["fault_to_commit"] if "fault_to_commit" in f else "")
                           for f in trial.faults)
        rec = r["recovered"]
        print("chaos_soak: trial %d (%s%s; %s): %s in %.1f s, reconfiguration max %s s%s"
              % (number, trial.mode, "" if trial.late is None else ", r%d late" % trial.late, faults,
                 "FAIL" if bad else "ok", time.monotonic() - t, round(max(rec), 3) if rec else "-",
                 "".join("; " + p for p in r["problems"])), file=sys.stderr, flush=True)
        trial_done(folder, bad, args.keep, failed)
    totals["faults_total"] = sum(totals["faults"].values())
    totals["reconfiguration_seconds"] = summary(recovered)
    totals["fault_to_commit_seconds"] = summary(fault_to_commit)
    totals["admission_seconds"] = summary(admission)
    totals["rejoin_seconds"] = summary(rejoin)
    sb = sum(b for b, _ in state)
    ss = sum(s for _, s in state)
    totals["state_transfer"] = {"count": len(state), "bytes": sb, "seconds": round(ss, 4),
                                "mbps": round(sb / ss / 1e6, 1) if ss > 0 else None}
    totals["raw_link_mbps"] = raw
    totals["state_vs_raw"] = round(sb / ss / 1e6 / raw, 3) if ss > 0 and raw else None
    totals["steps_committed"] = int(committed)
    totals["steps_ideal"] = round(ideal, 1)
    totals["steps_allowed"] = round(allowed, 1)
    totals["efficiency"] = round(committed / ideal, 4) if ideal else None
    totals["allowed_efficiency"] = round(allowed / ideal, 4) if ideal else None
    totals["committed_vs_allowed"] = round(committed / allowed, 4) if allowed else None
    totals["wall_seconds"] = round(time.monotonic() - started, 1)
    rc = finish("chaos_soak", totals, failed, root, args.keep)
    if totals["rejoined"] < args.min_rejoined:
        print("chaos_soak: FAIL: %d process(es) rejoined and committed again, --min-rejoined %d"
              % (totals["rejoined"], args.min_rejoined), file=sys.stderr)
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
