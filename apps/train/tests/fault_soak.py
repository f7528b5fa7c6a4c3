#!/usr/bin/python3
"""Fault soak of the parameter server over ZeroMQ: many short cadence-train runs, each with
faults injected into its workers at random moments, checked against the server's own record.

Each trial starts cadence-train under launch-gloo.sh --survive-workers (1 server + 3 workers,
softmax model, one parameter-server policy drawn from asp, bsp and ssp:2, --evict-after 1,
--push-log; in one trial in three --join-after, so the last worker joins the running policy
late) and, once the server prints "<policy> [1/1]: running", injects one to three faults on
distinct workers at random moments within the run or the second after it: kill -9; SIGSTOP,
resumed after a random delay or never (then killed once the server has exited); or kill -9
followed by a restart, as a wrapper would: the same command line and rank plus --rejoin, so
the new process joins the running policy under a new worker id (if it comes while the policy
runs; one that finds it over exits and counts no rejoin). Then it checks:

  server_deaths         rank 0 (the server) exited with a non-zero status, or printed no report
  hangs                 the trial outlived --trial-timeout (generous: it only catches hangs)
  pushes_lost           a push acknowledged to a worker (its push_pull returned) that the
                        server never applied
  pushes_applied_twice  a (worker id, iteration) the server applied more than once

  evicted_unfaulted     a worker the server reported evicted although no fault hit its rank (a
                        worker that finished normally must never be listed: issue 35)
  startup_evictions_missed  a worker hit in start-up (below) that the report does not list
                        evicted

With --startup (a fraction of the trials, default 1/3), a trial's first fault lands in start-up
instead: on a worker, as soon as it prints the start-up line of a step drawn from introduce,
"policy 1 connect", "policy 1 ready" and "policy 1 first pull" (cadence-train's "start: STEP"
lines; no sleep against a deadline), kill -9 or SIGSTOP (never resumed; killed once the server
has exited); that worker must then be evicted, and the run must still end with its report.
With --load, one CPU hog per core runs beside the job for the whole soak (a loaded machine, as
in issue 40).

and prints ONE JSON object on stdout with those counts, what it injected, and "joined" (late
workers the server saw join) and "rejoined" (restarted workers it saw join under a new id,
from its "worker N joined" lines); one line per
trial goes to stderr. The exit status is 1 when any of those counts is not zero (the
failing trials' output is then kept and named on stderr), 2 on bad arguments, else 0.

  /usr/bin/python3 apps/train/tests/fault_soak.py --train build/bin/cadence-train --trials 20 --seed 1

Python 3 standard library only (with apps/soak/soak_support.py, which it shares with the
chaos soak). The schedule of a trial depends only on --seed and the trial's number, so a failing
trial can be rerun alone (--first-trial K --trials 1).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "soak"))
from soak_support import (add_keep, add_trial_arguments, add_trial_timeout, check_executable, check_keep,  # noqa: E402
                          finish, positive_seconds, read, signal_pid, soak_root, trial_done, trial_folder, trial_rng)

WORKERS = 3
POLICIES = ("asp", "bsp", "ssp:2")
STARTUP_STEPS = ("introduce", "policy 1 connect", "policy 1 ready", "policy 1 first pull")


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(
        prog="fault_soak.py",
        description="Fault soak of cadence-train's parameter server over ZeroMQ (see the module text).")
    p.add_argument("--train", required=True, help="the cadence-train executable")
    p.add_argument("--launch", default=os.path.join(os.path.dirname(here), "launch-gloo.sh"),
                   help="launch-gloo.sh (default: the one next to this folder)")
    add_trial_arguments(p, 20)
    p.add_argument("--seconds", type=positive_seconds, default=3.0,
                   help="training seconds per trial (cadence-train --seconds; default 3)")
    add_trial_timeout(p, 90)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST directory")
    p.add_argument("--startup", type=float, default=1 / 3,
                   help="fraction of the trials whose first fault lands in start-up (default 1/3; 0: none)")
    p.add_argument("--start-timeout", type=positive_seconds, default=10.0,
                   help="cadence-train --start-timeout in every trial (default 10): what a worker "
                        "lost in start-up costs the run")
    p.add_argument("--load", action="store_true",
                   help="run one CPU hog per core beside the jobs for the whole soak")
    add_keep(p)
    a = p.parse_args(argv)
    check_executable(p, "--train", a.train)
    if not os.path.isfile(a.launch):
        p.error("--launch: '%s' is not a file" % a.launch)
    if not os.path.isfile(os.path.join(a.data, "train-labels-idx1-ubyte.gz")):
        p.error("--data: no Fashion-MNIST in '%s' (install the Debian package dataset-fashion-mnist)" % a.data)
    if not 0 <= a.startup <= 1:
        p.error("--startup: expected a fraction in [0, 1], got %g" % a.startup)
    check_keep(p, a.keep)
    if shutil.which("bash") is None:
        p.error("bash not found (launch-gloo.sh needs it)")
    return a


def schedule(seed, trial, seconds, startup_fraction=0.0):
    """The trial's policy, cadence-train seed, --join-after (None, or the seconds after which
    the last rank joins), faults: a list of events (time after the server's "running" line,
    action, worker rank), sorted by time, and the start-up fault (None, or (step, action,
    rank)). The start-up draw comes last, so the rest of a seed's schedule is as before."""
    rng = trial_rng(seed, trial)
    policy = rng.choice(POLICIES)
    join_after = round(rng.uniform(0.2, 0.6 * seconds), 2) if rng.random() < 1 / 3 else None
    victims = rng.sample(range(1, WORKERS + 1), rng.randint(1, WORKERS))
    startup = None
    srng = trial_rng(seed, trial, "startup")
    if srng.random() < startup_fraction:
        # On a worker that starts with the others (not --join-after's late rank).
        rank = srng.randint(1, WORKERS - 1 if join_after is not None else WORKERS)
        startup = (srng.choice(STARTUP_STEPS), srng.choice(("kill", "stop")), rank)
        victims = [v for v in victims if v != rank]
    faults, events = [], []
    if startup is not None:
        faults.append({"kind": "startup_" + startup[1], "rank": startup[2], "at": 0.0, "step": startup[0]})
    for rank in victims:
        at = rng.uniform(0.0, seconds + 1.0)  # the run, and the bookkeeping after it
        kind = rng.choice(("kill", "stop", "restart"))
        if kind == "kill":
            events.append((at, "kill", rank))
            faults.append({"kind": "kill", "rank": rank, "at": round(at, 3)})
        elif kind == "restart":  # killed, then a new process in its slot (cadence-train --rejoin)
            # Early enough, mostly, for the new process (which loads the data first) to find
            # the policy still running; one that finds it ended exits, which counts no rejoin.
            at = rng.uniform(0.0, 0.6 * seconds)
            delay = rng.uniform(0.1, 0.8)
            events.append((at, "kill", rank))
            events.append((at + delay, "restart", rank))
            faults.append({"kind": "restart", "rank": rank, "at": round(at, 3), "restarted_after": round(delay, 3)})
        else:
            resume = rng.choice((None, rng.uniform(0.1, 3.0)))
            events.append((at, "stop", rank))
            if resume is not None:
                events.append((at + resume, "cont", rank))
            faults.append({"kind": "stop", "rank": rank, "at": round(at, 3),
                           "resumed_after": None if resume is None else round(resume, 3)})
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    return policy, rng.randrange(1, 1 << 30), join_after, faults, events, startup


def alive(pid):
    """Whether pid runs (a zombie, not yet reaped by launch-gloo.sh, counts as exited)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def push_records(path):
    """(policy index, worker id, iteration) per line of one --push-log file."""
    out = []
    for line in read(path).splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            out.append(tuple(int(p) for p in parts))
        elif line.strip():
            raise ValueError("%s: malformed line '%s'" % (path, line))
    return out


class Trial:
    def __init__(self, args, number, folder):
        self.args, self.number, self.folder = args, number, folder
        (self.policy, self.train_seed, self.join_after, self.faults, self.events,
         self.startup) = schedule(args.seed, number, args.seconds, args.startup)
        self.replacements = []  # (rank, Popen) of the processes started by --rejoin
        self.out = os.path.join(folder, "out")
        self.err = os.path.join(folder, "err")
        self.push_log = os.path.join(folder, "push")
        self.result = {"hang": False, "server_death": False, "completed": False, "lost": 0, "twice": 0,
                       "applied": 0, "acked": 0, "evicted": [], "missed": 0, "unfaulted": 0, "startup_missed": 0,
                       "problems": [],
                       "joined": 0, "rejoined": 0}

    def command(self):
        a = self.args
        return ["bash", a.launch, "-n", str(WORKERS + 1), "--survive-workers", a.train, "--transport", "zmq",
                "--model", "softmax", "--policy", self.policy, "--profile", "homogeneous",
                "--seconds", "%g" % a.seconds, "--seed", str(self.train_seed), "--evict-after", "1",
                "--train-limit", "3000", "--test-limit", "100", "--eval-every", "1", "--data", a.data,
                "--json", "--push-log", self.push_log, "--start-timeout", "%g" % a.start_timeout] + \
            ([] if self.join_after is None else ["--join-after", "%g" % self.join_after])

    def problem(self, text):
        self.result["problems"].append(text)

    def run(self):
        deadline = time.monotonic() + self.args.trial_timeout
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            job = subprocess.Popen(self.command(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        pids, stopped = [], set()
        startup_pid = None
        try:
            if self.startup is not None:
                startup_pid = self.inject_startup(job, deadline)
                if startup_pid is not None and self.startup[1] == "stop":
                    stopped.add(self.startup[2])
            pids = self.wait_for_start(job, deadline)
            if pids is not None and startup_pid is not None:
                pids[self.startup[2]] = startup_pid  # 0 in the pids line when it never introduced itself
            if pids is not None:
                self.inject(job, pids, stopped, deadline)
                self.wait_for_server(job, pids[0], deadline)
            # The server is done: a worker still stopped is killed (a stop never resumed).
            for r in sorted(stopped):
                signal_pid(pids[r], signal.SIGKILL)
            try:
                rc = job.wait(timeout=max(0.1, deadline - time.monotonic()))
                for rank, p in self.replacements:  # they leave at the policy's end
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.result["hang"] = True
                self.problem("launch-gloo.sh or a restarted worker still running after --trial-timeout %g s"
                             % self.args.trial_timeout)
                rc = None
        finally:
            for rank, p in self.replacements:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if job.poll() is None:
                for p in (pids or []):
                    signal_pid(p, signal.SIGKILL)
                try:
                    os.killpg(job.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                job.wait()
        if self.result["hang"]:
            return self.result
        self.check_server(rc)
        self.check_pushes()
        self.count_joins()
        return self.result

    def inject_startup(self, job, deadline):
        """The start-up fault: waits for the victim's line "start: STEP" and signals the pid that
        line names. Returns that pid (None when the job ended or hung first)."""
        step, action, rank = self.startup
        pattern = re.compile(r"^cadence-train \(rank %d, pid (\d+)\): start: %s$" % (rank, re.escape(step)), re.M)
        while time.monotonic() < deadline:
            m = pattern.search(read(self.err))
            if m:
                pid = int(m.group(1))
                signal_pid(pid, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
                return pid
            if job.poll() is not None:
                self.problem("the job ended before rank %d began start-up step '%s'" % (rank, step))
                return None
            time.sleep(0.005)
        self.result["hang"] = True
        self.problem("no start-up line '%s' from rank %d within --trial-timeout" % (step, rank))
        return None

    def wait_for_start(self, job, deadline):
        """Rank pids once the server prints its "running" line; None if the job ended or hung first."""
        while time.monotonic() < deadline:
            text = read(self.err)
            m = re.search(r"rank pids: ([0-9 ]+) \(rank 0", text)
            if m and re.search(r": running$", text, re.M):
                pids = [int(p) for p in m.group(1).split()]
                if len(pids) != WORKERS + 1:
                    self.problem("rank pids line names %d processes" % len(pids))
                    return None
                return pids
            if job.poll() is not None:
                self.problem("the job ended before its policy ran")
                return None
            time.sleep(0.02)
        self.result["hang"] = True
        self.problem("no 'running' line within --trial-timeout")
        return None

    def restart(self, rank, argv, env):
        """A wrapper's restart of a killed worker: the same command line and rank, plus --rejoin."""
        e = dict(os.environ)
        e.update(env)
        with open(os.path.join(self.folder, "rejoin-rank%d.err" % rank), "ab") as err:
            p = subprocess.Popen(argv + ["--rejoin"], env=e, stdout=subprocess.DEVNULL, stderr=err,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        self.replacements.append((rank, p))

    def inject(self, job, pids, stopped, deadline):
        # What a wrapper needs to restart a worker: its command line and its rank's variables.
        launched = {}
        for rank in {e[2] for e in self.events if e[1] == "restart"}:
            try:
                with open("/proc/%d/cmdline" % pids[rank], "rb") as f:
                    argv = [a.decode() for a in f.read().split(b"\0") if a]
                with open("/proc/%d/environ" % pids[rank], "rb") as f:
                    env = dict(kv.decode().split("=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
                launched[rank] = (argv, {k: v for k, v in env.items()
                                         if k.startswith("CADENCE_TRAIN_") or k == "CADENCE_JOB_SECRET"})
            except (FileNotFoundError, ProcessLookupError):
                pass  # it died already (the run ended): nothing to restart
        t0 = time.monotonic()
        for at, action, rank in self.events:
            wait = t0 + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the fault's random moment, not a wait for a state
            pid = pids[rank]
            if action == "restart":
                if rank in launched:
                    self.restart(rank, *launched[rank])
            elif action == "kill":
                signal_pid(pid, signal.SIGKILL)
            elif action == "stop":
                signal_pid(pid, signal.SIGSTOP)
                stopped.add(rank)
            else:
                signal_pid(pid, signal.SIGCONT)
                stopped.discard(rank)

    def wait_for_server(self, job, server_pid, deadline):
        while time.monotonic() < deadline:
            if not alive(server_pid):
                return
            time.sleep(0.05)
        self.result["hang"] = True
        self.problem("the server was still running after --trial-timeout %g s" % self.args.trial_timeout)

    def count_joins(self):
        """From the server's lines: the late rank's join (worker id WORKERS - 1), and the
        restarted processes' joins (ids from WORKERS up)."""
        for m in re.finditer(r"worker (\d+) joined at [0-9.]+ s: rank (\d+)", read(self.err)):
            worker = int(m.group(1))
            if worker >= WORKERS:
                self.result["rejoined"] += 1
            elif self.join_after is not None and worker == WORKERS - 1 and int(m.group(2)) == WORKERS:
                self.result["joined"] += 1

    def check_server(self, rc):
        if rc != 0:
            self.result["server_death"] = True
            self.problem("launch-gloo.sh exit status %s (rank 0's)" % rc)
        try:
            reports = json.loads(read(self.out))
        except ValueError:
            reports = None
        if not isinstance(reports, list) or len(reports) != 1 or reports[0].get("policy") is None:
            self.result["server_death"] = True
            self.problem("no report on rank 0's stdout")
            return
        self.result["completed"] = not self.result["server_death"]
        self.result["evicted"] = reports[0].get("evicted", [])
        # Every worker evicted must have been hit by a fault (issue 35: one that finished
        # normally was reported evicted). Ids from WORKERS up are restarted processes (never hit
        # again) and count only if their rank was restarted... and even then they must finish.
        hit = {f["rank"] for f in self.faults}
        for w in self.result["evicted"]:
            if w >= WORKERS or w + 1 not in hit:
                self.result["unfaulted"] += 1
                self.problem("worker %d was evicted, but no fault hit it" % w)
        # A worker hit in start-up must have been evicted (dropped as absent, or lost).
        if self.startup is not None and self.startup[2] - 1 not in self.result["evicted"]:
            self.result["startup_missed"] += 1
            self.problem("worker %d (rank %d) was hit (%s) in start-up step '%s' but not evicted"
                         % (self.startup[2] - 1, self.startup[2], self.startup[1], self.startup[0]))
        # A worker killed (or stopped for good) well before the end of the run must have been
        # evicted; one hit near or after the end may have finished first. Reported, not failed:
        # under load the margin is a guess.
        for f in self.faults:
            if f["kind"].startswith("startup_"):
                continue
            if f["kind"] != "stop" or f.get("resumed_after") is None:
                if f["at"] >= self.args.seconds - 0.5 or (self.join_after is not None and f["rank"] == WORKERS):
                    continue  # may have finished first, or not joined yet
                if f["rank"] - 1 not in self.result["evicted"]:
                    self.result["missed"] += 1
                    self.problem("worker %d (rank %d) was %s at %.2f s but not evicted"
                                 % (f["rank"] - 1, f["rank"], {"kill": "killed", "stop": "stopped",
                                                               "restart": "killed"}[f["kind"]],
                                    f["at"]))

    def check_pushes(self):
        try:
            applied = push_records(self.push_log + ".rank0")
            acked = []
            for r in range(1, WORKERS + 1):
                acked += push_records("%s.rank%d" % (self.push_log, r))
        except ValueError as e:
            self.problem(str(e))
            self.result["lost"] += 1
            return
        seen = {}
        for rec in applied:
            seen[rec] = seen.get(rec, 0) + 1
        self.result["applied"] = len(applied)
        self.result["acked"] = len(acked)
        self.result["twice"] = sum(1 for n in seen.values() if n > 1)
        lost = [rec for rec in acked if rec not in seen]
        self.result["lost"] = len(lost)
        if self.result["twice"]:
            self.problem("pushes applied twice: %s" % sorted(k for k, n in seen.items() if n > 1)[:10])
        if lost:
            self.problem("pushes acknowledged but never applied: %s" % lost[:10])


def main(argv):
    args = parse_args(argv)
    root = soak_root(args.keep, "fault-soak")
    hogs = []
    if args.load:
        for _ in range(os.cpu_count() or 1):
            hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                                         start_new_session=True))
    try:
        return soak(args, root)
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def soak(args, root):
    totals = {"trials": args.trials, "faults": {"kill": 0, "stop": 0, "stop_resumed": 0, "restart": 0, "late_join": 0,
                                                "startup_kill": 0, "startup_stop": 0},
              "server_deaths": 0, "hangs": 0, "runs_completed": 0, "pushes_lost": 0, "pushes_applied_twice": 0,
              "rejoined": 0, "joined": 0, "pushes_applied": 0, "pushes_acknowledged": 0, "evictions": 0, "evictions_missed": 0,
              "evicted_unfaulted": 0, "startup_evictions_missed": 0, "policies": {p: 0 for p in POLICIES}, "seed": args.seed,
              "seconds_per_trial": args.seconds, "loaded": args.load, "start_timeout": args.start_timeout,
              "startup_steps": {step: 0 for step in STARTUP_STEPS}}
    failed = []
    started = time.monotonic()
    for number in range(args.first_trial, args.first_trial + args.trials):
        folder = trial_folder(root, number)  # empty: --push-log appends
        trial = Trial(args, number, folder)
        t = time.monotonic()
        r = trial.run()
        for f in trial.faults:
            totals["faults"][f["kind"]] += 1
            if f.get("resumed_after") is not None:
                totals["faults"]["stop_resumed"] += 1
        totals["policies"][trial.policy] += 1
        totals["faults"]["late_join"] += int(trial.join_after is not None)
        totals["joined"] += r["joined"]
        totals["rejoined"] += r["rejoined"]
        totals["server_deaths"] += int(r["server_death"])
        totals["hangs"] += int(r["hang"])
        totals["runs_completed"] += int(r["completed"])
        totals["pushes_lost"] += r["lost"]
        totals["pushes_applied_twice"] += r["twice"]
        totals["pushes_applied"] += r["applied"]
        totals["pushes_acknowledged"] += r["acked"]
        totals["evictions"] += len(r["evicted"])
        totals["evictions_missed"] += r["missed"]
        totals["evicted_unfaulted"] += r["unfaulted"]
        if trial.startup is not None:
            totals["startup_steps"][trial.startup[0]] += 1
        totals["startup_evictions_missed"] += r["startup_missed"]
        bad = r["server_death"] or r["hang"] or r["lost"] or r["twice"] or r["unfaulted"] or r["startup_missed"]
        faults = ", ".join("%s r%d@%.2f%s" % (f["kind"], f["rank"], f["at"],
                                              " in '%s'" % f["step"] if "step" in f else
                                              "" if f["kind"] == "kill" else
                                              " +%.2f" % f["restarted_after"] if f["kind"] == "restart" else
                                              (" never resumed" if f["resumed_after"] is None
                                               else " +%.2f" % f["resumed_after"]))
                           for f in trial.faults)
        if trial.join_after is not None:
            faults = "r%d joins@%.2f, %s" % (WORKERS, trial.join_after, faults)
        print("fault_soak: trial %d (%s; %s): %s in %.1f s, %d applied, %d acknowledged, evicted %s, joined %d, "
              "rejoined %d%s" % (number, trial.policy, faults, "FAIL" if bad else "ok", time.monotonic() - t,
                                 r["applied"], r["acked"], r["evicted"], r["joined"], r["rejoined"],
                                 "".join("; " + p for p in r["problems"])), file=sys.stderr, flush=True)
        trial_done(folder, bad, args.keep, failed)
    totals["wall_seconds"] = round(time.monotonic() - started, 1)
    return finish("fault_soak", totals, failed, root, args.keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
