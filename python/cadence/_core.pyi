"""
Bindings over the Cadence C++ headers (controllers, predictors, ZipLine, simulator, elastic planner, local-SGD schedule). Import the public API from `cadence`, not from here.
"""

import numpy

import builtins


class Error(RuntimeError):
    """Base of every exception Cadence raises (C++ cadence::error)."""

class DeadlockError(Error):
    """Every active worker waits: no push can ever release them."""

class DeviceError(Error):
    """A failure reported by a device backend (CUDA, Thrust)."""

class TransportError(Error):
    """A communication call failed (deadline, lost peer, disagreement)."""

class ArrayTypeError(Error, TypeError):
    """An argument that is not a NumPy array of the element type required (int64 or float64), or not in CPU memory."""

class InvalidParameterError(Error, ValueError):
    """A parameter is out of range (negative staleness, s_U < s_L, lookahead 0, ...)."""

class ParseError(Error, ValueError):
    """Malformed text: a policy config string, a predictor spec, a ZipLine variant name."""

class TimeError(Error, ValueError):
    """A timestamp that is NaN, infinite, or earlier than one already seen."""

class ZiplineInputError(Error, ValueError):
    """Input to a ZipLine search that violates its contract (no rows, empty row, row not strictly increasing, non-finite value)."""

class TimeoutError(Error, builtins.TimeoutError):
    """A blocking wait ran past its deadline."""

class WorkerError(Error, IndexError):
    """A worker id that is out of range, unknown, already removed, or used against the protocol (for example a push from a worker that still waits to be released)."""


class Decision:
    """
    What a controller decided after one push.

    Attributes:
        proceed: True if the pushing worker may start its next iteration now; False if it waits until a later push or removal releases it.
        released: ids of the workers this push released, in release order.
    """

    @property
    def proceed(self) -> bool:
        """True if the pusher proceeds at once."""

    @property
    def released(self) -> list[int]:
        """Workers released by this push, in order."""

    def __repr__(self) -> str: ...

class SuperstepStatus:
    """Where a policy that synchronises in supersteps stands."""

    @property
    def barriers(self) -> int:
        """Barriers completed so far."""

    @property
    def monitoring(self) -> bool:
        """
        True while the current superstep is monitoring (no barrier planned yet).
        """

    def __repr__(self) -> str: ...

class ElasticPlan:
    """The barrier plan an ElasticBSP controller follows."""

    @property
    def planned(self) -> bool:
        """False during monitoring (no barrier planned)."""

    @property
    def barrier(self) -> float:
        """Predicted barrier time (latest chosen push)."""

    @property
    def spread(self) -> float:
        """Predicted spread of the chosen pushes."""

    @property
    def planned_at(self) -> float:
        """Time at which the plan was made."""

    @property
    def remaining(self) -> list[int]:
        """
        Per worker id: pushes still to make before the barrier (0: already waits; -1: not part of this superstep).
        """

    def __repr__(self) -> str: ...

class Controller:
    """
    A synchronization controller: decides, after each push of a worker, whether the worker proceeds and whom the push releases. Workers have dense ids 0..workers-1; add_worker() issues the next. Build one with cadence.make_controller(config, workers) or a policy class (BSP, ASP, SSP, DSSP, ElasticBSP). Every call holds the GIL, so Python threads sharing a controller are serialized.
    """

    def push(self, worker: int, time: float) -> Decision:
        """
        Worker `worker` finished an iteration; `time` is the push's timestamp (any unit, non-decreasing, finite).

        Returns a Decision (proceed, released). Raises WorkerError for an unknown, removed or waiting worker and TimeError for a non-finite time or one earlier than the last push; a push that raises changes nothing.
        """

    def remove_worker(self, worker: int) -> list[int]:
        """
        Removes a worker that left or died; returns the ids of the workers this released. Raises WorkerError, changing nothing, for an unknown or removed worker.
        """

    def add_worker(self) -> int:
        """Adds a worker (at the slowest active clock) and returns its new id."""

    def clock(self, worker: int) -> int:
        """Pushes the worker has made (a joiner starts at the slowest clock)."""

    def is_active(self, worker: int) -> bool:
        """True if the id was issued and the worker has not been removed."""

    def is_waiting(self, worker: int) -> bool:
        """True if the worker waits to be released."""

    def staleness(self, worker: int) -> int:
        """How many clocks the worker is ahead of the slowest active one."""

    def waiting_for(self, worker: int) -> list[int]:
        """The active workers this (waiting) worker waits for."""

    @property
    def config(self) -> str:
        """The config string make_controller() parses back into this policy."""

    @property
    def name(self) -> str:
        """The policy's name: 'bsp', 'asp', 'ssp', 'dssp' or 'elastic'."""

    @property
    def worker_capacity(self) -> int:
        """Worker ids issued so far (active or removed)."""

    @property
    def active_workers(self) -> int:
        """Number of active workers."""

    @property
    def workers(self) -> list[int]:
        """Ids of the active workers, ascending."""

    @property
    def clocks(self) -> list[int | None]:
        """
        Per worker id: its clock (iterations pushed), or None for a removed worker.
        """

    @property
    def min_clock(self) -> int:
        """Smallest clock among active workers (0 when none is active)."""

    @property
    def max_staleness(self) -> int:
        """Largest staleness over active workers right now."""

    @property
    def staleness_bound(self) -> int | None:
        """
        The largest clock gap the policy lets a worker start an iteration with (s for SSP, 0 for BSP, s_U for DSSP); None when unbounded (ASP, ElasticBSP).
        """

    @property
    def supersteps(self) -> SuperstepStatus | None:
        """
        SuperstepStatus for policies that synchronise in supersteps (ElasticBSP), else None.
        """

    def __repr__(self) -> str: ...

    def __copy__(self) -> Controller:
        """An independent copy (same class and state)."""

    def __deepcopy__(self, memo: object) -> Controller:
        """An independent copy (same class and state)."""

class BSP(Controller):
    """Bulk Synchronous Parallel: a barrier after every iteration."""

    def __init__(self, workers: int) -> None:
        """BSP for `workers` workers (ids 0..workers-1)."""

class ASP(Controller):
    """Asynchronous Parallel: nobody ever waits."""

    def __init__(self, workers: int) -> None:
        """ASP for `workers` workers (ids 0..workers-1)."""

class SSP(Controller):
    """
    Stale Synchronous Parallel: a worker proceeds while it is at most s clocks ahead of the slowest.
    """

    def __init__(self, workers: int, s: int) -> None:
        """SSP(s) for `workers` workers; s >= 0."""

class DSSP(Controller):
    """
    Dynamic SSP: SSP whose threshold adapts within [s_lower, s_upper] from predicted push times.
    """

    def __init__(self, workers: int, s_lower: int, s_upper: int, predictor: str = 'last', history: int | None = None) -> None:
        """
        DSSP(s_lower, s_upper) for `workers` workers; `predictor` is a predictor spec ('last', 'mean:K', 'median:K', 'ewma:ALPHA'); `history` how many push times per worker it sees (default 16; 2 for 'last').
        """

    @property
    def lower_bound(self) -> int:
        """s_L: a worker at most this far ahead always proceeds."""

    @property
    def upper_bound(self) -> int:
        """s_U: no worker starts an iteration more than this far ahead."""

    @property
    def grants(self) -> int:
        """
        How many times the synchronization controller granted extra iterations.
        """

    @property
    def predictor(self) -> str:
        """The predictor spec ('last', 'median:5', ...)."""

    def extra_iterations(self, worker: int) -> int:
        """Extra iterations the worker may still run past the s_L check."""

class ElasticBSP(Controller):
    """
    ElasticBSP: workers run freely between barriers, each placed where ZipLine predicts the arrivals are closest.
    """

    def __init__(self, workers: int, lookahead: int, predictor: str = 'last', variant: str = 'fast', history: int = 16) -> None:
        """
        ElasticBSP for `workers` workers with lookahead R = `lookahead` predicted pushes per worker, a predictor spec and a ZipLine variant ('fast', 'opt-bs', 'opt', 'zipline').
        """

    def plan(self) -> ElasticPlan:
        """The plan in force (ElasticPlan; planned=False during monitoring)."""

    @property
    def barriers(self) -> int:
        """Barriers completed so far."""

    @property
    def fallbacks(self) -> int:
        """
        Supersteps that ended without a barrier (fewer than two participants, or predictions the search rejected).
        """

    @property
    def last_superstep_iterations(self) -> list[int]:
        """Per worker id: pushes made in the last completed superstep."""

    @property
    def max_superstep_iterations(self) -> int:
        """The largest per-superstep iteration count of any worker so far."""

    @property
    def is_monitoring(self) -> bool:
        """True while no barrier is planned."""

    @property
    def lookahead(self) -> int:
        """R: predicted pushes per worker."""

    @property
    def predictor(self) -> str:
        """The predictor spec."""

    @property
    def variant(self) -> str:
        """The ZipLine variant name."""

def make_controller(config: str, workers: int) -> Controller:
    """
    Builds the policy named by `config` for `workers` workers (ids 0..workers-1):

        bsp | asp | ssp:<s> | dssp:<s_L>:<s_U>[:<predictor>] |
        elastic:<R>[:<predictor>][:<variant>]

    predictor: last (default), mean:<k>, median:<k>, ewma:<alpha>; variant: fast (default), opt-bs, opt, zipline. Returns an instance of the matching class (BSP, ASP, SSP, DSSP, ElasticBSP), all Controller subclasses. Raises ParseError for a malformed string and InvalidParameterError for values out of range, both naming the string.
    """

def policy_grammar() -> str:
    """The grammar of the config strings make_controller accepts."""

class Predictor:
    """
    Predicts a worker's next push times from its latest ones. Specs: 'last' (the paper's: last interval repeated), 'mean:K' (mean of the last K intervals), 'median:K' (median, K <= 64), 'ewma:ALPHA' (exponentially weighted mean interval, 0 < ALPHA <= 1).
    """

    def __init__(self, spec: str = 'last') -> None:
        """
        Builds the predictor named by `spec`. Raises ParseError for a malformed spec and InvalidParameterError for values out of range (mean:0, ewma:1.5).
        """

    @property
    def name(self) -> str:
        """The spec make_predictor parses back into this predictor."""

    @property
    def min_history(self) -> int:
        """The fewest push times predict() accepts."""

    def predict(self, history: numpy.ndarray, r: int) -> numpy.ndarray:
        """
        The next `r` push times after `history` (a 1-D int64 or float64 NumPy array of a worker's latest push times, oldest first, non-decreasing), as a new array of the same dtype, strictly increasing and above history[-1]. int64 histories are predicted exactly. Raises InvalidParameterError for a history shorter than min_history and TimeError for a non-finite or decreasing one, or predictions that overflow.
        """

    def __repr__(self) -> str: ...

def _zipline(rows: object | None, variant: str = 'fast') -> tuple:
    """
    ZipLine with a CPU variant; returns (spread, barrier, choice). Use cadence.zipline.
    """

def _rows_layout(rows: object | None) -> tuple:
    """
    How zipline() would read `rows`: ('matrix' | 'ragged' | 'separate', address of the first row's data). All three read the caller's memory in place (no copy).
    """

def _cpu_variants() -> list[str]:
    """The ZipLine variant names of the CPU (built into cadence._core)."""

def _native_zipline_seconds(rows: object | None, variant: str, repeat: int) -> float:
    """
    Best wall time in seconds of `repeat` zipline_solve calls from C++ on `rows` (reused workspace; benchmark baseline).
    """

def _native_push_ns(config: str, workers: int, rounds: int) -> float:
    """
    Nanoseconds per any_controller::push from C++, round-robin over `workers` workers for `rounds` rounds (benchmark baseline).
    """

def _simulate(policy: str, scenario: str, workers: int, seed: int, seconds: float | None, iterations: int | None, push_cost: float | None, pull_cost: float | None) -> tuple:
    """
    Runs one policy on a scenario; returns (cadence-sim JSON text, start-staleness histogram, updates-behind histogram). Use cadence.simulate.
    """

def _simulate_collective(mode: str, scenario: str, workers: int, seed: int, seconds: float | None, iterations: int | None, push_cost: float | None, pull_cost: float | None, allreduce_cost: float | None) -> str:
    """
    Runs one collective mode on a scenario; returns cadence-sim --collective JSON text. Use cadence.simulate_collective.
    """

def _scenarios() -> list:
    """
    The named scenarios, as dicts (name, default_workers, seconds, description).
    """

class ElasticRound:
    """
    The plan every rank follows until the next barrier (identical on every rank).
    """

    @property
    def barrier(self) -> int:
        """
        Barriers completed before this plan was made (0: the plan for the first).
        """

    @property
    def warmup(self) -> bool:
        """True during warm-up and after a fallback: one step per rank (BSP)."""

    @property
    def steps(self) -> list[int]:
        """Per rank: local steps to run before the next barrier, each in [1, R]."""

    @property
    def predicted_barrier_us(self) -> int:
        """
        ZipLine's predicted barrier, microseconds after the last barrier (0 in warm-up).
        """

    @property
    def predicted_spread_us(self) -> int:
        """
        ZipLine's predicted spread of the arrivals, microseconds (0 in warm-up).
        """

    @property
    def hash(self) -> int:
        """
        FNV-1a hash of the configuration and the plan; ranks compare it to detect divergence.
        """

    def __repr__(self) -> str: ...

class ElasticPlanner:
    """
    ElasticBSP's planning step over collectives: from every rank's timing record, the local steps each rank runs before the next barrier. Deterministic (integer microseconds), so every rank computes the same plan.

    Record of one rank (record_words int64 values): [local steps since the last barrier, number of durations that follow (at most history), the latest step durations in microseconds, oldest first, zero-padded]. make_record() builds one.
    """

    def __init__(self, config: str, ranks: int, history: int = 16, warmup_steps: int = 0) -> None:
        """
        `config` is 'elastic:<R>[:<predictor>][:<variant>]'; `ranks` >= 1; `history` in [2, 1024] durations per record; `warmup_steps` BSP steps before the first plan (0: what the predictor needs). Raises ParseError or InvalidParameterError naming the config.
        """

    @property
    def record_words(self) -> int:
        """int64 values in one rank's record: history + 2."""

    @property
    def ranks(self) -> int:
        """Number of ranks."""

    @property
    def history(self) -> int:
        """Durations a record holds at most."""

    @property
    def lookahead(self) -> int:
        """R: predicted steps per rank."""

    @property
    def warmup_steps(self) -> int:
        """BSP steps before the first plan."""

    @property
    def fallbacks(self) -> int:
        """Plans that fell back to BSP because prediction or search failed."""

    @property
    def config(self) -> str:
        """The canonical config 'elastic:<R>:<predictor>:<variant>'."""

    def bsp_round(self, barrier: int, salt: int = 0) -> ElasticRound:
        """
        The warm-up plan (one step per rank) for `barrier`, hashed with `salt`.
        """

    def plan(self, records: numpy.ndarray, barrier: int, salt: int = 0) -> ElasticRound:
        """
        The plan for barrier `barrier` + 1 from the ranks' records: an int64 array of shape (ranks, record_words) or (ranks * record_words,), C-contiguous (what an all-gather of make_record() yields). `salt` enters the hash.
        """

    def __repr__(self) -> str: ...

class OuterPlan:
    """
    The plan every rank of a local-SGD job follows until the next outer sync (identical on every rank).
    """

    @property
    def round(self) -> int:
        """Outer syncs completed before this plan was made."""

    @property
    def warmup(self) -> bool:
        """
        True while a timed schedule still lacks the step times it predicts from (and after a fallback): fixed steps (H, or ElasticBSP's one step).
        """

    @property
    def steps(self) -> list[int]:
        """Per rank: inner steps to run before it calls the next sync (>= 1)."""

    @property
    def contributes(self) -> list[int]:
        """
        Per rank: 1 when its pseudo-gradient goes into the next sync; 0 when it joins that sync with nothing (a late rank under a quorum) and carries its local work on.
        """

    @property
    def predicted_us(self) -> int:
        """
        The predicted time of the next sync after this one, in microseconds (0 when not predicted).
        """

    @property
    def hash(self) -> int:
        """The plan's hash, as checked across ranks (unsigned 64-bit)."""

    def __repr__(self) -> str: ...

class OuterSchedule:
    """
    When the ranks of a local-SGD job (DiLoCo) take an outer step, as a policy (cadence::exchange::outer_schedule). Configs:

        fixed:<H>                                  every rank H inner steps
        elastic:<R>[:<predictor>][:<variant>]      ElasticBSP's barriers, <= R steps per rank
        lag:<H>:<s>[:<predictor>]                  every rank >= H steps, a faster one up to H + s
        quorum:<K>:<H>[:<grace>[:<max lag>]][:<predictor>]  the outer step when K ranks finished H

    Pure planning on integers, so every rank computes the same plan from the same records. Record of one rank (record_words int64 values): [inner steps behind its pseudo-gradient, syncs its work has been carried, 1 if it contributes at this sync, the plan hash it followed (as a signed int64), the number of durations that follow (at most history), the latest step durations in microseconds, oldest first, zero-padded]; the RECORD_* class attributes are the words' indices.
    """

    def __init__(self, config: str, ranks: int, history: int = 16) -> None:
        """
        The schedule `config` names for `ranks` ranks (>= 1), each record holding up to `history` durations (in [2, 1024]). Raises ParseError or InvalidParameterError naming the config.
        """

    @property
    def kind(self) -> str:
        """The policy: 'fixed', 'elastic', 'lag' or 'quorum'."""

    @property
    def timed(self) -> bool:
        """
        Whether a sync exchanges records (every schedule but fixed, whose plan is known).
        """

    @property
    def period(self) -> int:
        """H (R for elastic): the nominal inner steps per outer step."""

    @property
    def extra(self) -> int:
        """s (lag only): the extra steps a faster rank may run."""

    @property
    def quorum(self) -> int:
        """
        K (quorum only), as configured (more than the ranks means all of them).
        """

    @property
    def grace_milli(self) -> int:
        """
        The grace window (quorum only), in thousandths of the K-th arrival time.
        """

    @property
    def max_lag(self) -> int:
        """
        Syncs a rank's work may be carried over before it must be waited for (quorum only).
        """

    @property
    def ranks(self) -> int:
        """Ranks planned for."""

    @property
    def history(self) -> int:
        """Durations a record holds at most."""

    @property
    def record_words(self) -> int:
        """int64 values in one rank's record: RECORD_HEAD + history."""

    @property
    def most_steps(self) -> int:
        """The most inner steps a plan gives a rank before one sync."""

    @property
    def fallbacks(self) -> int:
        """
        Timed plans that fell back to the warm-up plan because prediction failed.
        """

    @property
    def config(self) -> str:
        """
        The canonical config string ('quorum:3:20:0.25:2:last', 'elastic:8:last:fast').
        """

    def first_plan(self) -> OuterPlan:
        """
        The plan before the first sync: warm-up steps for every rank, all contributing.
        """

    def plan(self, records: numpy.ndarray, round: int) -> OuterPlan:
        """
        The plan after sync number `round` (1-based: the syncs completed, this one included) from the ranks' records: an int64 array of shape (ranks, record_words) or (ranks * record_words,), C-contiguous (what an all-gather of every rank's record yields). Raises InvalidParameterError for a wrong size or impossible values (naming the rank).
        """

    def __repr__(self) -> str: ...

    RECORD_STEPS: int = 0

    RECORD_CARRIED: int = 1

    RECORD_CONTRIBUTES: int = 2

    RECORD_HASH: int = 3

    RECORD_HAVE: int = 4

    RECORD_HEAD: int = 5
