"""What the two soaks share (issue 34): apps/chaos/chaos_soak.py (the collective job under chaos,
docs/collective.md "Chaos soak") and apps/train/tests/fault_soak.py (cadence-train's parameter
server, docs/parameter_server.md). Each imports it from this folder (it puts the folder on
sys.path), so the two keep one copy of: the whole-number and seconds argparse types, the
options every soak has (--trials, --first-trial, --seed, --trial-timeout, --keep), the seeded
schedule's random generator, signals that tolerate a process already gone, percentiles, the
loop's folders and its last words (one JSON object on stdout, the failing trials named on
stderr, the exit status), and a cluster of network namespaces on a bridge whose links can go
down and up, or be cut into two groups (chaos_soak.py --netns).

Python 3 standard library only, as the soaks.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


# ---- command line ----

def whole_number(least):
    """An argparse type: a whole number >= least."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < least:
            raise argparse.ArgumentTypeError("expected a whole number >= %d, got '%s'" % (least, text))
        return v
    return parse


positive_int = whole_number(1)
non_negative_int = whole_number(0)


def positive_seconds(text):
    """An argparse type: seconds in (0, 3600]."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds > 0, got '%s'" % text)
    if not v > 0 or v > 3600:
        raise argparse.ArgumentTypeError("expected seconds in (0, 3600], got '%s'" % text)
    return v


def add_trial_arguments(p, trials):
    """--trials, --first-trial and --seed: which trials of which schedule run."""
    p.add_argument("--trials", type=positive_int, default=trials, help="number of trials (default %d)" % trials)
    p.add_argument("--first-trial", type=non_negative_int, default=0,
                   help="number of the first trial (default 0): reruns a trial's schedule alone")
    p.add_argument("--seed", type=non_negative_int, default=1, help="seed of the fault schedule (default 1)")


def add_trial_timeout(p, default):
    p.add_argument("--trial-timeout", type=positive_seconds, default=float(default),
                   help="a trial still running after this long is a hang (default %g)" % default)


def add_keep(p):
    p.add_argument("--keep", default="",
                   help="keep every trial's output under this folder (default: only failing trials', in a "
                        "temporary folder named on stderr)")


def check_executable(p, flag, path):
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        p.error("%s: '%s' is not an executable file" % (flag, path))


def check_keep(p, keep):
    if keep and not os.path.isdir(keep):
        p.error("--keep: '%s' is not a folder" % keep)


# ---- the schedule ----

def trial_rng(seed, trial, part=None):
    """The random generator of one trial's schedule: it depends only on the seed, the trial's
    number and (for a second, independent draw) a part's name, so a trial reruns alone."""
    return random.Random("%d/%d" % (seed, trial) if part is None else "%d/%d/%s" % (seed, trial, part))


# ---- processes ----

def signal_pid(pid, sig):
    """Signals pid; one already gone is not an error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signal_popen(p, sig):
    """Signals a child unless it has exited (and was reaped)."""
    if p.poll() is None:
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass


def kill_and_reap(p):
    if p.poll() is None:
        p.kill()
    p.wait()


def read(path):
    """A file's text, "" if it does not exist."""
    try:
        with open(path, "r", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def last_line(path):
    """The last line of a file (a process's stderr): what a problem's message quotes."""
    if not os.path.exists(path):
        return "(no stderr)"
    text = read(path).strip().splitlines()
    return text[-1] if text else "(nothing on stderr)"


# ---- numbers ----

def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))
    return round(v[k], 4)


def summary(values):
    return {"count": len(values), "p50": percentile(values, 0.5), "p99": percentile(values, 0.99),
            "max": round(max(values), 4) if values else None}


# ---- the loop's folders and its end ----

def soak_root(keep, name):
    """Where the trials' output goes: --keep, or a new temporary folder."""
    return keep or tempfile.mkdtemp(prefix="cadence-%s-" % name)


def trial_folder(root, number):
    """An empty folder for trial `number` (a rerun starts clean: some logs append)."""
    folder = os.path.join(root, "trial-%d" % number)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return folder


def trial_done(folder, bad, keep, failed):
    """A failing trial's folder is kept and listed; a passing one is removed unless --keep."""
    if bad:
        failed.append(folder)
    elif not keep:
        shutil.rmtree(folder, ignore_errors=True)


def finish(name, totals, failed, root, keep):
    """Prints the one JSON object; names the failing trials' output on stderr. The exit status:
    1 when a trial failed, else 0 (the temporary folder removed)."""
    print(json.dumps(totals))
    if failed:
        print("%s: FAIL: %d trial(s); their output: %s" % (name, len(failed), " ".join(failed)), file=sys.stderr)
        return 1
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


# ---- the raw link: plain TCP, one stream ----

def _receive(srv, total, got):
    c, _ = srv.accept()
    view = memoryview(bytearray(1 << 20))
    while got[0] < total:
        k = c.recv_into(view)
        if k == 0:
            break
        got[0] += k
    c.close()


def raw_link_once(megabytes, host="127.0.0.1"):
    """MB/s (10^6 bytes) of plain TCP from one thread to another in this process over `host`."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind((host, 0))
    srv.listen(1)
    total = megabytes << 20
    got = [0]
    t = threading.Thread(target=_receive, args=(srv, total, got))
    t.start()
    s = socket.create_connection(srv.getsockname())
    block = b"\0" * (1 << 20)
    t0 = time.monotonic()
    for _ in range(megabytes):
        s.sendall(block)
    s.close()
    t.join()
    dt = time.monotonic() - t0
    srv.close()
    return round(got[0] / dt / 1e6, 1)


def raw_link_mbps(runs=3, megabytes=128):
    """The median of `runs` raw_link_once over loopback (a loaded machine swings it)."""
    rates = sorted(raw_link_once(megabytes) for _ in range(runs))
    return rates[len(rates) // 2]


# Run by NetnsCluster.raw_link_mbps on both sides of a link: python3 soak_support.py raw-receive
# ADDRESS PORT MIB (prints MB/s once the bytes are in) or raw-send ADDRESS PORT MIB.
def _raw_main(argv):
    what, host, port, mib = argv[0], argv[1], int(argv[2]), int(argv[3])
    if what == "raw-receive":
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(1)
        print("listening", flush=True)
        c, _ = srv.accept()
        view = memoryview(bytearray(1 << 20))
        got, t0 = 0, None
        while got < mib << 20:
            k = c.recv_into(view)
            if k == 0:
                break
            if t0 is None:
                t0 = time.monotonic()
            got += k
        print(round(got / (time.monotonic() - t0) / 1e6, 1), flush=True)
        return 0
    s = socket.create_connection((host, port), timeout=30)
    block = b"\0" * (1 << 20)
    for _ in range(mib):
        s.sendall(block)
    s.close()
    return 0


# ---- network namespaces: hosts on a bridge, links that go down ----

def netns_unavailable():
    """Why this machine cannot make the namespace cluster (None if it can): root, iproute2, and
    a namespace with a veth pair that works (root in a container often cannot)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs ip (Debian: iproute2)"
    probe = "cdcprobe%d" % os.getpid()
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "ip netns add fails here"
    try:
        r = subprocess.run(["ip", "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"],
                           capture_output=True)
        if r.returncode != 0:
            return "veth pairs do not work in a namespace here"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class NetnsCluster:
    """`hosts` network namespaces, host i at 10.78.0.(i+1)/24, each joined by a veth pair to a
    port of a bridge in a "switch" namespace (as scripts/netns-cluster.sh builds, without the
    rate cap): the only addresses used are inside these namespaces. A second bridge takes the
    ports of a group cut off from the rest (a partition: the group still reaches itself).
    close() kills what still runs in the namespaces and deletes them; use it as a context
    manager, which closes on any exit (an error, Ctrl-C; the soaks turn SIGTERM into an exit)."""

    def __init__(self, hosts):
        self.hosts = hosts
        self.prefix = "cch%04x" % ((os.getpid() ^ random.getrandbits(16)) & 0xffff)
        self.switch = self.prefix + "sw"
        self.created = []
        self.down, self.cut = set(), set()
        self.blackholed = set()  # (i, j): host i drops what it sends to host j (cut_link)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _ip(self, *args):
        r = subprocess.run(["ip"] + list(args), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("netns cluster: 'ip %s' failed: %s" % (" ".join(args), r.stderr.strip()))

    def _build(self):
        self._ip("netns", "add", self.switch)
        self.created.append(self.switch)
        for br in ("br0", "br1"):
            self._ip("-n", self.switch, "link", "add", br, "type", "bridge")
            self._ip("-n", self.switch, "link", "set", br, "up")
        for i in range(self.hosts):
            ns = self.namespace(i)
            self._ip("netns", "add", ns)
            self.created.append(ns)
            self._ip("link", "add", "%sa%d" % (self.prefix, i), "netns", ns, "type", "veth", "peer", "name",
                     "s%d" % i, "netns", self.switch)
            self._ip("-n", ns, "link", "set", "%sa%d" % (self.prefix, i), "name", "eth0")
            self._ip("-n", ns, "addr", "add", "%s/24" % self.address(i), "dev", "eth0")
            self._ip("-n", ns, "link", "set", "eth0", "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", self.switch, "link", "set", "s%d" % i, "master", "br0")
            self._ip("-n", self.switch, "link", "set", "s%d" % i, "up")

    def namespace(self, i):
        return "%sh%d" % (self.prefix, i)

    def address(self, i):
        return "10.78.0.%d" % (i + 1)

    def command(self, i, argv):
        """argv run in host i's namespace (ip netns exec execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.namespace(i)] + list(argv)

    def link(self, i, up):
        """Host i's switch port up or down (packets dropped, nothing reset: a cable pulled)."""
        self._ip("-n", self.switch, "link", "set", "s%d" % i, "up" if up else "down")
        (self.down.discard if up else self.down.add)(i)

    def partition(self, group):
        """The hosts in `group` onto the second bridge: they reach each other, not the rest."""
        for i in sorted(group):
            self._ip("-n", self.switch, "link", "set", "s%d" % i, "master", "br1")
            self.cut.add(i)

    def heal(self, group=None):
        for i in sorted(self.cut if group is None else group):
            self._ip("-n", self.switch, "link", "set", "s%d" % i, "master", "br0")
            self.cut.discard(i)

    def cut_link(self, i, j, cut=True):
        """Only the link between hosts i and j cut (cut) or mended: a blackhole route to the other's
        address in each of the two namespaces, so neither reaches the other while both still reach
        every other host (packets dropped, nothing reset)."""
        for a, b in ((i, j), (j, i)):
            if cut and (a, b) not in self.blackholed:
                self._ip("-n", self.namespace(a), "route", "add", "blackhole", self.address(b) + "/32")
                self.blackholed.add((a, b))
            elif not cut and (a, b) in self.blackholed:
                self._ip("-n", self.namespace(a), "route", "del", "blackhole", self.address(b) + "/32")
                self.blackholed.discard((a, b))

    def restore(self):
        """Every link up, every host on the main bridge, every cut link mended (between trials)."""
        for i in sorted(self.down):
            self.link(i, True)
        self.heal()
        for a, b in sorted(self.blackholed):
            self.cut_link(a, b, False)

    def raw_link_mbps(self, runs=3, mib=128, a=0, b=1):
        """Plain TCP, one stream, from host a to host b (Python on both sides, as the loopback
        measure): the median of `runs`, MB/s."""
        me = os.path.abspath(__file__)
        rates = []
        for k in range(runs):
            port = str(20000 + k)
            rx = subprocess.Popen(self.command(b, [sys.executable, me, "raw-receive", self.address(b), port,
                                                   str(mib)]), stdout=subprocess.PIPE, text=True)
            try:
                if rx.stdout.readline().strip() != "listening":
                    raise RuntimeError("netns cluster: the raw-link receiver did not start")
                subprocess.run(self.command(a, [sys.executable, me, "raw-send", self.address(b), port, str(mib)]),
                               check=True, timeout=120)
                rates.append(float(rx.stdout.readline()))
            finally:
                kill_and_reap(rx)
        rates.sort()
        return rates[len(rates) // 2]

    def close(self):
        """Kills what still runs in the namespaces, then deletes them."""
        for _ in range(20):
            left = []
            for ns in self.created:
                r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
                left += [int(p) for p in r.stdout.split()]
            if not left:
                break
            for pid in left:
                signal_pid(pid, signal.SIGKILL)
            time.sleep(0.05)
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.created = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def exit_on_sigterm():
    """SIGTERM (ctest's timeout, a kill) becomes SystemExit, so finally blocks and context
    managers run: the namespace cluster is removed, the jobs' processes killed."""
    def handler(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(_raw_main(sys.argv[1:]))
