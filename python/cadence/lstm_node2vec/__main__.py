"""`python3 -m cadence.lstm_node2vec [--json]`: the evaluation protocol of docs/lstm-node2vec.md on a data set (default fb-messages), as a table or one JSON object."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from .data import DATASETS, DataError, cut_snapshots, evolving_sbm, load_dataset, load_sociopatterns, load_temporal_csv
from .experiment import ALL_METHODS, Config, run

DISTRIBUTED_NOTE_MISSING = "distributed training skipped: it needs cadence.torch and the cadence bindings"


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python3 -m cadence.lstm_node2vec",
                                 description="LSTM-node2vec against its baselines under the protocol of docs/lstm-node2vec.md: "
                                             "link prediction (four negative sets), anomaly detection (anomalies injected "
                                             "into the embedded snapshot), node classification; several seeds.")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--dataset", default="fb-messages", choices=list(DATASETS),
                    help="a shipped data set (default fb-messages)")
    ap.add_argument("--data", default=None, help="a temporal edge file instead of a shipped data set (see --format)")
    ap.add_argument("--format", choices=["csv", "sociopatterns"], default="csv",
                    help="--data's format: csv (header with columns u,i,ts; default) or sociopatterns (lines 't i j Ci Cj')")
    ap.add_argument("--sbm", type=int, default=0, metavar="N",
                    help="use the synthetic evolving SBM generator with N nodes instead of a file")
    ap.add_argument("--sbm-seed", type=int, default=0, help="the SBM graph's seed (default 0; the same graph for every --seeds)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per method: --set seed=S, S+1, ... (default 5)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="run seeds in this many processes, each single-threaded (default 2, or 1 on one core); "
                         "the results do not depend on it")
    ap.add_argument("--snapshots", type=int, default=10, help="number of snapshots K (default 10)")
    ap.add_argument("--split", choices=["count", "duration"], default="count",
                    help="cut snapshots by equal event count (default) or equal duration")
    ap.add_argument("--cumulative", action="store_true", help="snapshot t holds every event up to its end")
    ap.add_argument("--methods", default=None,
                    help="comma-separated subset of " + ",".join(ALL_METHODS) + " (default all)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a Config field (e.g. --set lookback=3 --set walk_mode=chained); repeatable")
    ap.add_argument("--policies", default=None,
                    help="distributed runs: comma-separated parameter-server policies (bsp, ssp:3, dssp:3:15, "
                         "elastic:15, asp) and elastic-avg:R (the ElasticBSP averager); '' skips; default "
                         "bsp,ssp:3,dssp:3:15,elastic:15,elastic-avg:15 when cadence.torch is installed")
    ap.add_argument("--workers", type=int, default=4, help="distributed worker processes (default 4)")
    ap.add_argument("--profile", default="hetero2", help="worker speed profile: uniform, hetero2 (default), straggler")
    ap.add_argument("--target-auc", type=float, default=0.78,
                    help="distributed runs report the first checkpoint's time at this link AUC (default 0.78)")
    ap.add_argument("--target-fraction", type=float, default=0.9,
                    help="distributed runs report the time to this fraction of the single-process run's loss "
                         "reduction (default 0.9)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return ap.parse_args(argv)


def _config(overrides):
    cfg = Config()
    fields = {f.name: f for f in dataclasses.fields(Config)}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(fields)}")
        cur = getattr(cfg, key)
        try:
            cfg = dataclasses.replace(cfg, **{key: type(cur)(value)})
        except ValueError:
            raise SystemExit(f"--set {item!r}: {value!r} is not a valid {type(cur).__name__}") from None
    return cfg


COLUMNS = [("link_auc", "link uniform"), ("link_auc_hard", "link hard"), ("link_auc_dist2", "link dist-2"),
           ("link_auc_new", "link new"), ("link_ap", "AP uniform"), ("anomaly_auc", "anomaly"),
           ("anomaly_auc_clf", "anomaly clf"), ("node_f1", "node F1")]


def _cell(row, key, width=15):
    if key not in row:
        return f"{'-':>{width}}"
    lo_hi = row.get(key + "_ci")
    half = "" if not lo_hi else f"+-{(lo_hi[1] - lo_hi[0]) / 2:.3f}"
    return f"{row[key]:.3f}{half}".rjust(width)


def format_table(result) -> str:
    d = result["dataset"]
    keys = [(k, name) for k, name in COLUMNS if any(k in m for m in result["methods"])]
    seeds = result["seeds"]
    lines = [f"dataset {d['name']}: {d['nodes']} nodes, {d['snapshots']} snapshots; embed at snapshot "
             f"{d['current_snapshot']} ({d['current_edges']} edges), predict snapshot {d['current_snapshot'] + 1} "
             f"({d['target_edges']} edges, {100 * d['eval_sizes']['recurring_fraction']:.0f}% of them also in the "
             f"last {result['config']['lookback']} snapshots); {d['active_nodes']} nodes active in those",
             f"seeds {', '.join(map(str, seeds))}: mean +- half-width of the 95% interval (t, {len(seeds) - 1} df)", "",
             f"{'method':<21}" + "".join(f"{name:>15}" for _, name in keys) + f"{'s/seed':>8}"]
    for m in result["methods"]:
        lines.append(f"{m['method']:<21}" + "".join(_cell(m, k) for k, _ in keys) + f"{m['seconds']:>8.1f}")
    if result.get("differences"):
        lines += ["", f"{result['reference']} minus method, paired over seeds (* = 95% interval excludes 0: "
                      f"outside the noise)",
                  f"{'method':<21}" + "".join(f"{name:>15}" for _, name in keys)]
        for diff in result["differences"]:
            cells = []
            for k, _ in keys:
                c = diff.get(k)
                cells.append(f"{'-':>15}" if c is None else
                             (f"{c['diff']:+.3f}+-{c['half']:.3f}" + ("*" if c["outside_noise"] else " ")).rjust(15))
            lines.append(f"{diff['method']:<21}" + "".join(cells))
    lines.append("")
    if result["distributed"]:
        lines.append(f"{'policy':<18}{'seconds':>8}{'final loss':>11}{'s to target loss':>17}{'final link AUC':>15}"
                     f"{'s to AUC':>9}  loss curve (s, loss)")
        for r in result["distributed"]:
            hit = r.get("seconds_to_target")
            hit_loss = r.get("seconds_to_target_loss")
            curve = " ".join(f"{t:.1f}:{x:.3f}" for t, x in r["loss_curve"])
            lines.append(f"{r['policy']:<18}{r['seconds']:>8.1f}{r['final_loss']:>11.3f}"
                         f"{'-' if hit_loss is None else format(hit_loss, '.1f'):>17}{r['final_link_auc']:>15.3f}"
                         f"{'-' if hit is None else format(hit, '.1f'):>9}  {curve}")
        t = result["distributed"][0]
        lines.append(f"target loss {t['target_loss']:.3f} (initial {t['initial_loss']:.3f}, single process "
                     f"{t['single_process_loss']:.3f}); " + result.get("distributed_note", ""))
    else:
        lines.append("distributed: " + result.get("distributed_note", "none"))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    cfg = _config(args.set)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    try:
        if args.sbm:
            snaps = evolving_sbm(n=args.sbm, snapshots=args.snapshots, seed=args.sbm_seed)
        else:
            if args.data:
                events = (load_sociopatterns if args.format == "sociopatterns" else load_temporal_csv)(args.data)
            else:
                events = load_dataset(args.dataset)
            snaps = cut_snapshots(events, args.snapshots, split=args.split, cumulative=args.cumulative)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e} (pass --data PATH, or run from the repository root where data/{args.dataset}/ is)",
              file=sys.stderr)
        return 2
    methods = args.methods.split(",") if args.methods else None
    if args.seeds < 1:
        print("error: --seeds must be >= 1", file=sys.stderr)
        return 2
    try:
        result = run(snaps, cfg, methods=methods, log=log, seeds=args.seeds, jobs=args.jobs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["dataset"]["split"] = args.split
    result["distributed"] = []
    if args.policies != "":
        from . import distributed
        why = distributed.available()
        if why:
            result["distributed_note"] = f"{DISTRIBUTED_NOTE_MISSING}: {why}"
        else:
            from .experiment import Tasks
            t_cur = result["dataset"]["current_snapshot"]
            policies = args.policies.split(",") if args.policies else None
            if args.profile not in distributed.PROFILES:
                print(f"error: --profile {args.profile!r}: expected one of {', '.join(distributed.PROFILES)}",
                      file=sys.stderr)
                return 2
            result["distributed"] = distributed.run_all(snaps, cfg, Tasks(snaps, t_cur, cfg), t_cur, policies,
                                                        workers=args.workers, profile=args.profile,
                                                        target_auc=args.target_auc,
                                                        target_fraction=args.target_fraction, log=log)
            result["distributed_note"] = (f"the LSTM autoencoder trained on {args.workers} processes (gloo), profile "
                                          f"{args.profile}, seed {cfg.seed}; final_link_auc is the dynamic vectors' "
                                          f"(lstm-ae) uniform link AUC")
    else:
        result["distributed_note"] = "skipped (--policies '')"
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(result))
    else:
        print(format_table(result))
        print(f"\ntotal {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
