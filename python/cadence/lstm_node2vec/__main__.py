"""`python3 -m cadence.lstm_node2vec [--json]`: the default LSTM-node2vec experiment on fb-messages, as a table or one JSON object."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from .data import DataError, cut_snapshots, default_data_path, evolving_sbm, load_temporal_csv
from .experiment import Config, run

DISTRIBUTED_NOTE_MISSING = "distributed training skipped: it needs cadence.torch and the cadence bindings"


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python3 -m cadence.lstm_node2vec",
                                 description="LSTM-node2vec against node2vec baselines: link prediction and anomaly detection "
                                             "on the next snapshot.")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--data", default=None, help="temporal CSV with columns u,i,ts (default: the shipped fb-messages)")
    ap.add_argument("--sbm", type=int, default=0, metavar="N",
                    help="use the synthetic evolving SBM generator with N nodes instead of a CSV")
    ap.add_argument("--snapshots", type=int, default=10, help="number of snapshots K (default 10)")
    ap.add_argument("--split", choices=["count", "duration"], default="count",
                    help="cut snapshots by equal event count (default) or equal duration")
    ap.add_argument("--cumulative", action="store_true", help="snapshot t holds every event up to its end")
    ap.add_argument("--methods", default=None,
                    help="comma-separated subset of lstm-node2vec,lstm-node2vec-concat,lstm-ae,node2vec,dynnode2vec")
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


def format_table(result) -> str:
    d = result["dataset"]
    lines = [f"dataset {d['name']}: {d['nodes']} nodes, {d['snapshots']} snapshots; embed at snapshot "
             f"{d['current_snapshot']} ({d['current_edges']} edges), predict snapshot {d['current_snapshot'] + 1} "
             f"({d['target_edges']} edges)", "",
             f"{'method':<22}{'link AUC':>10}{'link AP':>10}{'anomaly AUC':>13}{'seconds':>9}"]
    for m in result["methods"]:
        lines.append(f"{m['method']:<22}{m['link_auc']:>10.3f}{m['link_ap']:>10.3f}{m['anomaly_auc']:>13.3f}"
                     f"{m['seconds']:>9.1f}")
    lines.append("")
    if result["distributed"]:
        lines.append(f"{'policy':<22}{'seconds':>10}{'final link AUC':>16}{'s to target':>13}  curve (s, AUC)")
        for r in result["distributed"]:
            hit = r.get("seconds_to_target")
            curve = " ".join(f"{t:.1f}:{a:.3f}" for t, a in r["curve"])
            lines.append(f"{r['policy']:<22}{r['seconds']:>10.1f}{r['final_link_auc']:>16.3f}"
                         f"{'-' if hit is None else format(hit, '.1f'):>13}  {curve}")
    else:
        lines.append("distributed: " + result.get("distributed_note", "none"))
    if result["distributed"]:
        lines.append(result.get("distributed_note", ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    cfg = _config(args.set)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    try:
        if args.sbm:
            snaps = evolving_sbm(n=args.sbm, snapshots=args.snapshots, seed=cfg.seed)
        else:
            events = load_temporal_csv(args.data or default_data_path())
            snaps = cut_snapshots(events, args.snapshots, split=args.split, cumulative=args.cumulative)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e} (pass --data PATH, or run from the repository root where data/fb-messages/ is)",
              file=sys.stderr)
        return 2
    methods = args.methods.split(",") if args.methods else None
    result = run(snaps, cfg, methods=methods, log=log)
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
                                                        target_auc=args.target_auc, log=log)
            result["distributed_note"] = (f"the LSTM autoencoder trained on {args.workers} processes (gloo), profile "
                                          f"{args.profile}; final_link_auc is the dynamic vectors' (lstm-ae) link AUC")
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
