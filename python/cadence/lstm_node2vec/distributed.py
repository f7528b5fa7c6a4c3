"""The LSTM autoencoder trained data-parallel on several processes under Cadence's policies (cadence.torch), scored by reconstruction loss and link AUC against wall-clock time."""

from __future__ import annotations

import time

import numpy as np
import torch

from .models import WalkAutoencoder, dynamic_vectors, shard

#: Speed profiles (step-time multipliers per worker), after the simulator's scenarios: each
#: worker's real step is stretched to ``multiplier x`` its measured compute time.
PROFILES = {
    "uniform": [1.0, 1.0, 1.0, 1.0],
    "hetero2": [1.0, 1.0, 2.0, 2.0],     # two fast, two slow at 2:1 (the papers' mixed GPUs)
    "straggler": [1.0, 1.0, 1.0, 3.0],   # one 3x straggler
}
#: The default comparison: the parameter server under four policies, and the ElasticBSP averager.
DEFAULT_POLICIES = ["bsp", "ssp:3", "dssp:3:15", "elastic:15", "elastic-avg:15"]


def available() -> str:
    """Empty when cadence.torch and the bindings import; otherwise why not."""
    try:
        import cadence  # noqa: F401
        import cadence.torch  # noqa: F401
        if not hasattr(cadence, "make_controller"):
            return "the cadence bindings (cadence.make_controller) are not installed"
    except ImportError as e:
        return f"cadence.torch is not importable: {e}"
    return ""


class ServerAdam:
    """Adam applied on the parameter server to each pushed gradient (update(weights, gradient, worker))."""

    def __init__(self, size: int, lr: float = 1e-2, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], eps
        self.m = torch.zeros(size)
        self.v = torch.zeros(size)
        self.t = 0

    def __call__(self, weights: torch.Tensor, gradient: torch.Tensor, worker: int) -> None:
        self.t += 1
        self.m.mul_(self.b1).add_(gradient, alpha=1 - self.b1)
        self.v.mul_(self.b2).addcmul_(gradient, gradient, value=1 - self.b2)
        mh = self.m / (1 - self.b1 ** self.t)
        vh = self.v / (1 - self.b2 ** self.t)
        weights.addcdiv_(mh, vh.sqrt().add_(self.eps), value=-self.lr)


def _flat(model) -> np.ndarray:
    # NumPy, not a tensor: torch's queue would pass a tensor by a file descriptor the exiting
    # child closes before the parent reads it
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def _load(model, flat: np.ndarray) -> None:
    flat = torch.from_numpy(flat)
    off = 0
    with torch.no_grad():
        for p in model.parameters():
            k = p.numel()
            p.copy_(flat[off:off + k].view_as(p))
            off += k


def _batches(walks: np.ndarray, batch: int, seed: int):
    g = np.random.default_rng(seed)
    while True:
        perm = g.permutation(len(walks))
        for i in range(0, len(walks), batch):
            yield torch.from_numpy(walks[perm[i:i + batch]])


def _rank_main(rank, world, counters, spec):
    """One process of the run (in cadence._spawn's process group): rank 0 serves the
    parameter-server policies, ranks 1..W work.

    The processes start once and run every policy in turn (process start costs more than a
    short run on a loaded machine): each parameter-server policy on its own tags, the averager
    on the group of ranks 1..W while rank 0 waits at the next barrier.
    """
    import torch.distributed as dist

    torch.set_num_threads(1)
    workers_group = dist.new_group(list(range(1, world)))  # every rank must create it
    rows = []
    for i, policy in enumerate(spec["policies"]):
        dist.barrier()
        torch.manual_seed(spec["seed"])
        model = WalkAutoencoder(spec["n"], spec["token_dim"], spec["dim"], spec["negatives"])
        if policy.startswith("elastic-avg"):
            rows.append(None if rank == 0 else
                        _averager_rank(rank, model, spec, policy.replace("elastic-avg", "elastic"),
                                       counters[i], workers_group))
        else:
            rows.append(_ps_rank(rank, model, spec, policy, counters[i], DEFAULT_TAG_BASE + 16 * i))
    return rows


DEFAULT_TAG_BASE = 0x1D000


def _stretch(t0: float, mult: float) -> float:
    """Sleeps so that the step since ``t0`` takes ``mult`` times its compute time; returns the step's duration."""
    spent = time.perf_counter() - t0
    if mult > 1.0:
        time.sleep(spent * (mult - 1.0))
    return time.perf_counter() - t0


def _claim(counter) -> int:
    """Takes one step of the shared budget; returns the global step number (1-based)."""
    with counter.get_lock():
        counter.value += 1
        return counter.value


class _Worker:
    """What a worker rank of either kind keeps: its batches, its speed, the shared budget, and
    worker 0's checkpoints (time, flat parameters) every budget / checkpoints steps."""

    def __init__(self, rank, model, spec, counter):
        self.w = rank - 1
        self.model = model
        self.counter = counter
        self.batches = _batches(shard(spec["walks"], self.w, spec["workers"]), spec["batch"], spec["seed"] + rank)
        self.mult = spec["profile"][self.w % len(spec["profile"])]
        self.budget = spec["steps"]
        self.every = max(1, self.budget // spec["checkpoints"])
        self.next_ck = self.every
        self.checkpoints = []
        self.start = time.perf_counter()

    def checkpoint(self, force=False):
        if self.w == 0 and (self.counter.value >= self.next_ck or force):
            self.checkpoints.append((time.perf_counter() - self.start, _flat(self.model)))
            self.next_ck = self.counter.value + self.every


def _ps_rank(rank, model, spec, policy, counter, tag_base):
    import cadence.torch as ct

    params = list(model.parameters())
    if rank == 0:
        server = ct.ParameterServer(policy, params, update=ServerAdam(sum(p.numel() for p in params), spec["lr"]),
                                    evict_after=None, tag_base=tag_base)
        stats = server.run()
        # the run's result: the server's weights once every push is applied
        return {"role": "server", "pushes": list(stats.pushes), "max_staleness": list(stats.max_start_staleness),
                "weights": server.weights.numpy().copy()}
    worker = ct.PSWorker(params, reply_timeout=spec["timeout"], tag_base=tag_base)
    worker.pull_into(params)  # the start: a worker's clock runs from its first pull
    me = _Worker(rank, model, spec, counter)
    steps = 0
    # equal total work: the workers share one budget of steps, so a fast worker that a relaxed
    # policy does not hold back does more of them
    while _claim(counter) <= me.budget:
        t0 = time.perf_counter()
        for p in params:
            p.grad = None
        model.loss(next(me.batches)).backward()
        _stretch(t0, me.mult)
        worker.step(params)
        steps += 1
        me.checkpoint()
    seconds = time.perf_counter() - me.start
    worker.finish()
    return {"role": "worker", "seconds": seconds, "checkpoints": me.checkpoints, "steps": steps}


def _averager_rank(rank, model, spec, config, counter, group):
    import cadence.torch as ct
    import torch.distributed as dist

    params = list(model.parameters())
    for p in params:  # every rank starts from worker 0's parameters
        dist.broadcast(p.data, 1, group=group)
    avg = ct.ElasticModelAverager(config, process_group=group, timeout=spec["timeout"])
    opt = torch.optim.Adam(params, lr=spec["lr"])
    dist.barrier(group=group)
    me = _Worker(rank, model, spec, counter)
    k = 0
    while True:
        t0 = time.perf_counter()
        opt.zero_grad()
        model.loss(next(me.batches)).backward()
        opt.step()
        k += 1
        done = _claim(counter) >= me.budget  # past the budget a rank still runs to the next barrier
        if avg.step_done(_stretch(t0, me.mult)):
            stop = avg.sync(params, stop=done)
            me.checkpoint(force=stop)
            if stop:
                break
    return {"role": "worker", "seconds": time.perf_counter() - me.start, "checkpoints": me.checkpoints,
            "steps": k, "barriers": avg.barriers}


def _spawn(world, spec, timeout):
    from .. import _spawn as harness

    out, hung = harness.run(_rank_main, world, spec, timeout=timeout, pg_timeout=spec["timeout"],
                            shared=lambda ctx: ([ctx.Value("q", 0) for _ in spec["policies"]],))
    missing = [r for r, o in enumerate(out) if o is None]
    if missing or hung:
        raise RuntimeError(f"lstm_node2vec.distributed: policies {spec['policies']}: ranks {missing} did not "
                           f"report within {timeout:g} s")
    errors = [f"rank {r}:\n{o[1]}" for r, o in enumerate(out) if o[0] != "ok"]
    if errors:
        raise RuntimeError(f"lstm_node2vec.distributed: policies {spec['policies']} failed:\n" + "\n".join(errors))
    return {r: o[1] for r, o in enumerate(out)}


def run_policies(policies, walks: np.ndarray, score, n: int, cfg, workers: int = 4, profile="hetero2",
                 steps: int = 0, checkpoints: int = 8, timeout: float = 240.0, target_auc=None, loss=None,
                 target_loss=None) -> list:
    """Train the autoencoder on ``workers`` processes under each policy in turn and score the checkpoints.

    A policy is a parameter-server controller config ("bsp", "ssp:3", "dssp:3:15",
    "elastic:15", "asp"; one extra process serves) or "elastic-avg:<R>" (the ElasticBSP model
    averager over the workers). ``score(model) -> link AUC``. ``steps``: the budget of optimiser
    steps all workers share (default: the single-process run's, ``cfg.ae_epochs`` passes over the
    walks), so every policy does the same total work and a fast worker that a relaxed policy
    does not hold back takes more of it; under the averager a rank past the budget still runs
    to the next barrier. ``timeout`` bounds every wait (and the whole run, times the policies).
    ``loss(model) -> reconstruction loss``, if given, is evaluated at every checkpoint too
    (``loss_curve``, ``final_loss``), and ``target_loss`` gives ``seconds_to_target_loss``.
    """
    policies = list(policies)
    mults = PROFILES[profile] if isinstance(profile, str) else list(profile)
    if steps <= 0:
        steps = max(1, int(np.ceil(cfg.ae_epochs * len(walks) / cfg.ae_batch)))
    spec = {"policies": policies, "workers": workers, "n": n, "dim": cfg.dim, "token_dim": cfg.token_dim,
            "negatives": cfg.ae_negatives, "lr": cfg.ae_lr, "batch": cfg.ae_batch, "steps": steps,
            "seed": cfg.seed, "walks": walks, "profile": mults, "checkpoints": checkpoints, "timeout": timeout}
    out = _spawn(workers + 1, spec, timeout * len(policies) + 30.0)
    model = WalkAutoencoder(n, cfg.token_dim, cfg.dim, cfg.ae_negatives)
    rows = []
    for i, policy in enumerate(policies):
        worker_rows = [out[r][i] for r in range(1, workers + 1)]
        seconds = max(o["seconds"] for o in worker_rows)
        points = list(worker_rows[0]["checkpoints"])
        server = out[0][i]
        if server is not None:
            points.append((seconds, server["weights"]))  # the server's final weights
        curve, loss_curve = [], []
        for t, flat in points:
            _load(model, flat)
            curve.append([round(t, 2), round(float(score(model)), 4)])
            if loss is not None:
                loss_curve.append([round(t, 2), round(float(loss(model)), 4)])
        row = {"policy": policy, "seconds": round(seconds, 2), "final_link_auc": curve[-1][1] if curve else None,
               "curve": curve, "step_budget": steps, "steps": [o["steps"] for o in worker_rows],
               "profile": profile if isinstance(profile, str) else mults}
        if target_auc is not None:
            hit = [t for t, a in curve if a >= target_auc]
            row["seconds_to_target"] = hit[0] if hit else None
        if loss is not None:
            row["loss_curve"] = loss_curve
            row["final_loss"] = loss_curve[-1][1] if loss_curve else None
            if target_loss is not None:
                hit = [t for t, x in loss_curve if x <= target_loss]
                row["seconds_to_target_loss"] = hit[0] if hit else None
        if server is not None:
            row["pushes"] = server["pushes"]
            row["max_staleness"] = server["max_staleness"]
        else:
            row["barriers"] = worker_rows[0]["barriers"]
        rows.append(row)
    return rows


@torch.no_grad()
def reconstruction_loss(model: WalkAutoencoder, walks: np.ndarray, batch: int = 500) -> float:
    """Mean full-softmax cross-entropy of the model's reconstruction of ``walks`` (no sampling, so deterministic)."""
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(walks), batch):
            xb = torch.from_numpy(walks[i:i + batch])
            logits = model(xb)
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, model.n + 1), xb.reshape(-1),
                                                       reduction="sum").item()
    return total / walks.size


def run_all(snapshots, cfg, tasks, t_cur: int, policies=None, workers: int = 4, profile="hetero2",
            target_auc=None, target_fraction: float = 0.9, eval_walks: int = 2000, log=None) -> list:
    """Every policy on the same temporal walks, scored by reconstruction loss and lstm-ae link AUC over time.

    The target loss is L_sp + (1 - target_fraction) (L_0 - L_sp) on a fixed evaluation set of
    ``eval_walks`` training walks: ``target_fraction`` of the loss reduction that single-process
    training (same initial model, seed and budget) achieves. Every row carries it, with L_0
    (``initial_loss``) and L_sp (``single_process_loss``).
    """
    from .experiment import evaluate
    from .models import train_autoencoder
    from .walks import temporal_walks

    walks, owner = temporal_walks(snapshots, t_cur, cfg.lookback, cfg.temporal_walks, seed=cfg.seed,
                                  mode=cfg.walk_mode, absent=cfg.absent)
    train = walks[(walks != snapshots.n).any(axis=1)] if cfg.ae_train_on == "active" else walks
    rng = np.random.default_rng([cfg.seed, 7])
    held = train[np.sort(rng.choice(len(train), min(eval_walks, len(train)), replace=False))]

    def score(model):
        vec = dynamic_vectors(model, walks, owner, snapshots.n, pool=cfg.pool)
        return evaluate(vec, tasks, cfg)["link_auc"]

    def loss(model):
        return reconstruction_loss(model, held)

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)  # the initial model every policy starts from (as in _rank_main)
    ref = WalkAutoencoder(snapshots.n, cfg.token_dim, cfg.dim, cfg.ae_negatives)
    initial = loss(ref)
    train_autoencoder(ref, train, cfg.ae_epochs, cfg.ae_batch, cfg.ae_lr, seed=cfg.seed)
    single = loss(ref)
    target = single + (1.0 - target_fraction) * (initial - single)
    if log:
        log(f"distributed: reconstruction loss initial {initial:.3f}, single process {single:.3f}, target {target:.3f} "
            f"({time.perf_counter() - t0:.1f}s)")
    rows = run_policies(policies or DEFAULT_POLICIES, train, score, snapshots.n, cfg, workers=workers,
                        profile=profile, target_auc=target_auc, loss=loss, target_loss=target)
    for r in rows:
        r.update({"initial_loss": round(initial, 4), "single_process_loss": round(single, 4),
                  "target_loss": round(target, 4), "target_fraction": target_fraction})
    if log:
        for r in rows:
            log(f"distributed {r['policy']}: {r['seconds']:.1f}s training, loss {r['final_loss']:.3f}, "
                f"link AUC {r['final_link_auc']:.3f}")
        log(f"distributed: {time.perf_counter() - t0:.1f}s with process start and scoring")
    return rows
