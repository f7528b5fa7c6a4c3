#!/usr/bin/env python3
"""Runs cadence-train for docs/train.md and draws its plots (accuracy against wall-clock time).

Usage (from the repository root, after building cadence-train):
    python3 docs/plots/train_plots.py --run [--seeds 1 2 3] [--seconds 40]   # runs, then plots
    python3 docs/plots/train_plots.py                                        # plots saved runs
    sudo python3 docs/plots/train_plots.py --net --run [--seconds 30]        # the network straggler
    python3 docs/plots/train_plots.py --net                                  # its saved runs

--net is the network-straggler experiment of docs/cluster.md: 5 network namespaces
(scripts/netns-cluster.sh, root only), 1 server and 4 workers over ZeroMQ meeting at rank 0's
TCP store, every worker computing at the same speed (profile homogeneous), every link at
1 Gbit/s ("net-even") and then host 4's link at 100 Mbit/s ("net-slow4"), once per seed.

--run starts `mpirun -np 5 build/bin/cadence-train --json --curves ...` once per profile and
seed (about policies x seconds each) and saves each run's JSON and curves under
docs/plots/train-data/. Without --run it reads what is saved there. It writes
docs/img/train_<profile>.png (seed 1's curves) and prints the markdown table of docs/train.md:
per policy the median over seeds of time to 80%, final accuracy and iterations/s, and
time-to-80% relative to BSP (the speed-up). Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "docs", "plots", "train-data")
IMG = os.path.join(ROOT, "docs", "img")
PROFILES = ["hetero16", "straggler3x"]
POLICIES = ["bsp", "dssp:3:15", "elastic:15"]
# --net: the link set-ups (netns-cluster.sh options) and the policies, parameter server and
# collective modes.
NET = {"net-even": [], "net-slow4": ["--host-rate", "4=100mbit"]}
NET_POLICIES = ["bsp", "asp", "ssp:3", "dssp:3:15", "elastic:15", "periodic:4", "elastic-avg:15"]


def run(args):
    os.makedirs(DATA, exist_ok=True)
    for profile in PROFILES:
        for seed in args.seeds:
            stem = os.path.join(DATA, f"{profile}-seed{seed}")
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "5", args.train,
                   "--profile", profile, "--seconds", str(args.seconds), "--seed", str(seed),
                   "--json", "--curves", stem + ".curves.csv"]
            for p in args.policies:
                cmd += ["--policy", p]
            print(" ".join(cmd), file=sys.stderr)
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            with open(stem + ".json", "w") as f:
                f.write(out)


def run_net(args):
    os.makedirs(DATA, exist_ok=True)
    for name, links in NET.items():
        for seed in args.seeds:
            stem = os.path.join(DATA, f"{name}-seed{seed}")
            cmd = ["bash", os.path.join(ROOT, "scripts", "netns-cluster.sh"), "-n", "5", "--rate", "1gbit", *links,
                   "--", args.train, "--transport", "zmq", "--rank", "{host}", "--size", "5",
                   "--rendezvous", "{host0}:29500", "--address", "{addr}", "--model", "mlp",
                   "--profile", "homogeneous", "--train-limit", "10000", "--seconds", str(args.seconds),
                   "--seed", str(seed), "--json", "--curves", stem + ".curves.csv"]
            for p in args.policies:
                cmd += ["--policy", p]
            print(" ".join(cmd), file=sys.stderr)
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            # netns-cluster prefixes each host's lines; rank 0 (host 0) printed the JSON.
            rank0 = [line[len("[host 0] "):] for line in out.splitlines() if line.startswith("[host 0] ")]
            with open(stem + ".json", "w") as f:
                f.write("\n".join(rank0) + "\n")


def load(profile):
    runs = {}
    for name in sorted(os.listdir(DATA)):
        if name.startswith(profile + "-seed") and name.endswith(".json"):
            seed = int(name[len(profile) + 5:-5])
            with open(os.path.join(DATA, name)) as f:
                runs[seed] = json.load(f)
    return runs


def curves(profile, seed):
    out = {}
    with open(os.path.join(DATA, f"{profile}-seed{seed}.curves.csv")) as f:
        for row in csv.DictReader(f):
            out.setdefault(row["policy"], []).append((float(row["seconds"]), float(row["accuracy"])))
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, unit="", digits=1):
    return "-" if v is None else f"{v:.{digits}f}{unit}"


def table(profile):
    runs = load(profile)
    if not runs:
        return ""
    seeds = sorted(runs)
    by_policy = {}
    for seed in seeds:
        for r in runs[seed]:
            by_policy.setdefault(r["policy"], []).append(r)
    bsp = by_policy.get("bsp", [])
    bsp_t80 = {i: r["time_to_80"] for i, r in enumerate(bsp)}
    lines = [f"Profile `{profile}`, {len(seeds)} seed(s) ({', '.join(map(str, seeds))}), median over seeds:",
             "",
             "| policy | time to 80% (s) | speed-up vs BSP | final accuracy | best | it/s (sim) | wait % (sim) | max staleness |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for policy, rs in by_policy.items():
        t80 = median([r["time_to_80"] for r in rs])
        ratios = [bsp_t80[i] / r["time_to_80"] for i, r in enumerate(rs)
                  if bsp_t80.get(i) and r["time_to_80"]]
        speed = median(ratios)
        lines.append("| {} | {} | {} | {} | {} | {} ({}) | {} ({}) | {} |".format(
            policy, fmt(t80), fmt(speed, "x", 2),
            fmt(100 * median([r["final_accuracy"] for r in rs]), "%"),
            fmt(100 * median([r["best_accuracy"] for r in rs]), "%"),
            fmt(median([r["iterations_per_second"] for r in rs])),
            fmt(median([r["simulated"]["iterations_per_second"] for r in rs])),
            fmt(100 * median([r["wait_fraction"] for r in rs])),
            fmt(100 * median([r["simulated"]["wait_fraction"] for r in rs])),
            max(r["max_staleness"] for r in rs)))
    never = [f"{r['policy']} (seed {seeds[i % len(seeds)]})" for p, rs in by_policy.items()
             for i, r in enumerate(rs) if r["time_to_80"] is None]
    if never:
        lines.append("")
        lines.append("Never reached 80%: " + ", ".join(never) + " (left out of the medians).")
    return "\n".join(lines)


def plot(profile):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = load(profile)
    if not runs:
        return
    seed = min(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy, pts in curves(profile, seed).items():
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], label=policy, linewidth=1.6)
    ax.axhline(80, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("test accuracy (%, 1000 test images)")
    ax.set_ylim(50, 90)
    ax.set_title(f"cadence-train: 784-256-10 MLP, 4 MPI workers, profile {profile}, seed {seed}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    os.makedirs(IMG, exist_ok=True)
    fig.savefig(os.path.join(IMG, f"train_{profile}.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="run cadence-train first")
    ap.add_argument("--train", default=os.path.join(ROOT, "build", "bin", "cadence-train"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--policies", nargs="+", default=None)
    ap.add_argument("--net", action="store_true", help="the network-straggler experiment (netns, root)")
    args = ap.parse_args()
    if args.policies is None:
        args.policies = NET_POLICIES if args.net else POLICIES
    if args.run:
        (run_net if args.net else run)(args)
    for profile in (NET if args.net else PROFILES):
        if not args.net:
            plot(profile)
        print(table(profile))
        print()


if __name__ == "__main__":
    main()
