#!/usr/bin/env python3
"""Runs cadence-train's local-SGD schemes over seeds and prints docs/local-sgd.md's tables.

One run per seed (all policies in one cadence-train job, as docs/local-sgd.md's commands),
over MPI on this machine or, with --netns, over gloo on scripts/netns-cluster.sh's namespace
cluster (needs root). Each run's JSON (rank 0's stdout) and the workers' "sent ... bytes"
lines (stderr) are saved under --save; --from re-reads a saved folder without running.

Per policy, the median over the seeds of: the time to 70% and to 80% (worker 0's global
weights on 1,000 test images, every second; a seed that never reaches it counts as later than
any that do), the MB worker 0 sent in the run, the MB to 80% (its send rate times its time to
80%), the final accuracy on the 10,000 test images, the steps per second of all workers
together and the wait fraction. Every seed's time to 80% is shown in parentheses.

  python3 docs/plots/local_sgd_runs.py --profile homogeneous --seconds 60 \
      --policy periodic:1 --policy diloco:fixed:50 --save /tmp/lsgd-homog
  sudo python3 docs/plots/local_sgd_runs.py --netns --rate 100mbit --host-rate 4=10mbit ...
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SENT = re.compile(r"cadence-train: (\S+): worker 0 sent (\d+) bytes in (\d+) merges")


def command(args, seed):
    train = os.path.join(args.build, "bin", "cadence-train")
    flags = [f"--policy={p}" for p in args.policy]
    flags += ["--profile", args.profile, "--seconds", str(args.seconds), "--seed", str(seed), "--json"]
    flags += args.extra
    if not args.netns:
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.workers + 1), train] + flags
    cluster = [os.path.join(ROOT, "scripts", "netns-cluster.sh"), "-n", str(args.workers + 1), "--rate", args.rate]
    for h in args.host_rate:
        cluster += ["--host-rate", h]
    return cluster + ["--", train, "--transport", "gloo", "--rank", "{host}", "--size", str(args.workers + 1),
                      "--rendezvous", "{host0}:29500", "--address", "{addr}"] + flags


def run(args, seed):
    cmd = command(args, seed)
    print("running:", " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"local_sgd_runs: seed {seed} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    out = done.stdout
    if args.netns:  # host 0's lines carry the JSON, prefixed "[host 0] "
        out = "\n".join(l.split("] ", 1)[1] for l in out.splitlines() if l.startswith("[host 0] "))
    os.makedirs(args.save, exist_ok=True)
    with open(os.path.join(args.save, f"seed{seed}.json"), "w") as f:
        f.write(out)
    with open(os.path.join(args.save, f"seed{seed}.stderr"), "w") as f:
        f.write(done.stderr)


def load(folder, seed):
    with open(os.path.join(folder, f"seed{seed}.json")) as f:
        text = f.read()
    rows = json.loads(text[text.index("["):])
    sent = {}
    with open(os.path.join(folder, f"seed{seed}.stderr")) as f:
        for line in f:
            m = SENT.search(line)
            if m:
                sent[m.group(1)] = int(m.group(2))
    return rows, sent


def median_time(values):
    """Median with a missing time (never reached) as later than any reached one."""
    keyed = sorted(values, key=lambda v: math.inf if v is None else v)
    return keyed[len(keyed) // 2]


def fmt_time(t, seconds):
    return f"> {seconds:g}" if t is None else f"{t:g}"


def table(folder, seeds):
    per = {}  # policy -> [(its JSON row, worker 0's bytes)] per seed, in the run's order
    for seed in seeds:
        rows, sent = load(folder, seed)
        for r in rows:
            per.setdefault(r["policy"], []).append((r, sent.get(r["policy"])))
    print("| scheme | t@70% s | t@80% s (seeds " + "/".join(map(str, seeds)) +
          ") | MB sent | MB to 80% | accuracy at end | steps/s | wait |")
    print("|---|---|---|---|---|---|---|---|")
    for p, runs in per.items():
        seconds = runs[0][0]["seconds"]
        t70 = median_time([r["time_to_70"] for r, _ in runs])
        t80s = [r["time_to_80"] for r, _ in runs]
        t80 = median_time(t80s)
        mb = [b / 1e6 for _, b in runs if b is not None]
        to80 = [b / 1e6 / r["seconds"] * r["time_to_80"] for r, b in runs if b is not None and r["time_to_80"] is not None]
        mb_to80 = "-" if t80 is None or not to80 else f"{statistics.median(to80):.3g}"
        print(f"| `{p}` | {fmt_time(t70, seconds)} | {fmt_time(t80, seconds)} "
              f"({'/'.join('-' if t is None else f'{t:g}' for t in t80s)}) | "
              f"{statistics.median(mb):.3g} | {mb_to80} | "
              f"{statistics.median(r['final_accuracy'] for r, _ in runs) * 100:.1f}% | "
              f"{statistics.median(r['iterations_per_second'] for r, _ in runs):.1f} | "
              f"{statistics.median(r['wait_fraction'] for r, _ in runs) * 100:.0f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", action="append", default=[], help="a cadence-train policy (repeatable)")
    ap.add_argument("--profile", default="homogeneous")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--workers", type=int, default=4, help="workers (the job has one more rank, the observer)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--netns", action="store_true", help="gloo over scripts/netns-cluster.sh (root)")
    ap.add_argument("--rate", default="1gbit", help="with --netns: every host's link rate")
    ap.add_argument("--host-rate", action="append", default=[], help="with --netns: I=RATE (host I = worker I-1)")
    ap.add_argument("--save", help="folder for each seed's JSON and stderr")
    ap.add_argument("--from", dest="source", help="tabulate a saved folder instead of running")
    ap.add_argument("extra", nargs="*", help="more cadence-train flags, after --")
    args = ap.parse_args()
    if args.source:
        table(args.source, args.seeds)
        return
    if not args.policy or not args.save:
        ap.error("--policy and --save are needed to run (or --from FOLDER to tabulate)")
    for seed in args.seeds:
        run(args, seed)
    table(args.save, args.seeds)


if __name__ == "__main__":
    main()
