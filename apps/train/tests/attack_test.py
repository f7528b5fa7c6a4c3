#!/usr/bin/python3
"""Attacks a running cadence-train job over ZeroMQ from outside it, at the socket level, and
checks that the honest run does not notice (docs/testing.md, "The attack test").

It starts an honest run under launch-gloo.sh (1 server + 2 workers, --transport zmq,
--rendezvous on loopback so that rank 0 serves the TCP store, the job secret from the
launcher, softmax model, --policy bsp so that every worker must take part in every iteration)
and, once the server prints "<policy> [1/1]: running", attacks every TCP port rank 0 listens on
(found in /proc: its ZeroMQ socket and its TCP store) without the job secret:

  garbage          4 KiB of random bytes on a fresh connection; rank 0 must close it
  truncated        a ZMTP greeting cut after 10 bytes, and a CURVE greeting followed by half a
                   HELLO command; the attacker closes them
  huge_claim       a CURVE greeting, then a command frame whose long header claims 8 GiB; rank 0
                   must close it without reading (ZMQ_MAXMSGSIZE)
  forged_null      a ZMTP 3.0 greeting with the NULL mechanism and a READY command naming a
                   DEALER whose routing id is worker 1's ('C' + rank + incarnation, written by
                   hand); rank 0 (CURVE only) must close it
  silent           8 connections to each port that send nothing, held until the run ends
  store_garbage    64 bytes of garbage as the store handshake (nonce + proof); the store must
                   answer with its refusal (32 zero bytes) and close, and name it on stderr
  store_silent     a store connection that never authenticates, held until the run ends

Then it waits for the run to end and checks: the launcher exits 0; rank 0's JSON report has one
object whose "workers" is 2, "evicted" is [], "iterations" > 0 and one transfer time per worker;
rank 0's peak resident memory (VmHWM in /proc/<pid>/status, read until it exits) stays under
--memory-limit-mb. Every wait is for a state (a line, an EOF, an exit), bounded only to catch a
hang. Prints one JSON object on stdout (what was sent, how rank 0 answered, its VmHWM) and
exits 1 when a check fails, 0 when all hold.

  /usr/bin/python3 apps/train/tests/attack_test.py --train build/bin/cadence-train
  /usr/bin/python3 apps/train/tests/attack_test.py --train build/bin/cadence-train --no-attack

--no-attack runs the honest job alone and reports its VmHWM (how the limit was chosen: see
docs/testing.md). Python 3 standard library only; Linux (/proc).
"""

import argparse
import json
import os
import queue
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time

HANG = 60.0  # seconds: any single wait longer than this is a hang, not a slow machine


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True, help="the cadence-train executable")
    p.add_argument("--launch", default=os.path.join(here, "..", "launch-gloo.sh"), help="launch-gloo.sh")
    p.add_argument("--seconds", type=int, default=5, help="seconds the honest policy runs (default 5)")
    p.add_argument("--memory-limit-mb", type=int, default=512,
                   help="rank 0's VmHWM must stay below this (default 512 MiB)")
    p.add_argument("--no-attack", action="store_true", help="run the honest job alone (the baseline)")
    a = p.parse_args(argv)
    if a.seconds < 2:
        p.error("--seconds: expected at least 2, got %d" % a.seconds)
    return a


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def listening_ports(pid):
    """The TCP ports process pid listens on (IPv4 and IPv6), from /proc."""
    inodes = set()
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]", link)
            if m:
                inodes.add(m.group(1))
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return ports


def vm_hwm_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Job:
    """The honest run: the launcher, its stderr read line by line, rank 0's memory watched."""

    def __init__(self, args):
        self.store_port = free_port()
        cmd = ["bash", args.launch, "-n", "3", "--timeout", "300", args.train, "--transport", "zmq",
               "--rendezvous", "127.0.0.1:%d" % self.store_port, "--policy", "bsp", "--model", "softmax",
               "--seconds", str(args.seconds), "--json"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.stderr = []
        self.hwm = 0
        self.rank0 = None
        self.stdout = ""
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._out.start()

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.stderr.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def _read_stdout(self):
        self.stdout = self.proc.stdout.read()

    def wait_line(self, pattern, what):
        """The first line (from now on) matching pattern; fails on the run's end or a hang."""
        deadline = time.monotonic() + HANG
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no '%s' line within %.0f s (a hang)" % (what, HANG))
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError("the run ended before its '%s' line" % what)
            m = re.search(pattern, line)
            if m:
                return m

    def watch_memory(self, pid):
        self.rank0 = pid

        def loop():
            while True:
                v = vm_hwm_kib(pid)
                if v is None:
                    return
                self.hwm = max(self.hwm, v)
                time.sleep(0.01)

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return t

    def finish(self):
        rc = self.proc.wait(timeout=300)
        self._out.join(timeout=HANG)
        return rc


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=HANG)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_until_closed(s):
    """Reads until the peer closes (EOF or reset); returns the bytes it sent before."""
    got = b""
    s.settimeout(HANG)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError("the peer kept a hostile connection open for %.0f s" % HANG)
    finally:
        s.close()
    return got


def zmtp_greeting(mechanism):
    return (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + mechanism.ljust(20, b"\x00") + b"\x00" +
            b"\x00" * 31)


def zmtp_command(name, body):
    data = bytes([len(name)]) + name + body
    if len(data) < 256:
        return bytes([0x04, len(data)]) + data
    return bytes([0x06]) + struct.pack(">Q", len(data)) + data


def zmtp_property(name, value):
    return bytes([len(name)]) + name + struct.pack(">I", len(value)) + value


def forged_identity(rank, incarnation):
    return b"C" + struct.pack("<i", rank) + struct.pack("<Q", incarnation)


def attack_zmq(port, report):
    rng = random.Random(port)
    # garbage: rank 0 must close it
    s = connect(port)
    s.sendall(bytes(rng.getrandbits(8) for _ in range(4096)))
    read_until_closed(s)
    report.append({"port": port, "attack": "garbage", "closed_by_rank0": True})
    # truncated greeting, truncated HELLO: we close
    s = connect(port)
    s.sendall(zmtp_greeting(b"NULL")[:10])
    s.close()
    s = connect(port)
    s.sendall(zmtp_greeting(b"CURVE") + bytes([0x04, 200]) + b"\x05HELLO" + b"\x00" * 44)
    s.close()
    report.append({"port": port, "attack": "truncated", "closed_by_rank0": False})
    # a command claiming 8 GiB
    s = connect(port)
    s.sendall(zmtp_greeting(b"CURVE") + b"\x06" + struct.pack(">Q", 8 << 30) + b"\x05HELLO" + b"\x00" * 1024)
    read_until_closed(s)
    report.append({"port": port, "attack": "huge_claim", "claimed_bytes": 8 << 30, "closed_by_rank0": True})
    # NULL handshake with worker 1's routing id (rank 2, incarnations 0..3 tried)
    for inc in range(4):
        s = connect(port)
        ready = zmtp_command(b"READY", zmtp_property(b"Socket-Type", b"DEALER") +
                             zmtp_property(b"Identity", forged_identity(2, inc)))
        s.sendall(zmtp_greeting(b"NULL") + ready)
        # and a message as worker 1 would send one, should the handshake have been taken
        try:
            s.sendall(b"\x01\x00" + b"\x00\x40" + b"\x00" * 64)
        except OSError:
            pass
        read_until_closed(s)
    report.append({"port": port, "attack": "forged_null", "tries": 4, "closed_by_rank0": True})


def attack_store(port, report, held):
    # garbage as the handshake: the store refuses (32 zero bytes) and closes
    s = connect(port)
    s.sendall(os.urandom(64))
    got = read_until_closed(s)
    greeting = 4 + 1 + 32
    if len(got) != greeting + 32 or got[greeting:] != b"\x00" * 32:
        raise AssertionError("the TCP store answered a forged handshake with %d bytes, not its greeting and "
                             "a refusal of 32 zero bytes" % len(got))
    report.append({"port": port, "attack": "store_garbage", "closed_by_rank0": True, "refusal": True})
    # truncated handshake and a request head claiming 4 GiB before any handshake: we close
    s = connect(port)
    s.sendall(b"\x01" + struct.pack(">II", 5, 0xFFFFFFFF))
    s.close()
    report.append({"port": port, "attack": "store_truncated", "closed_by_rank0": False})
    held.append(connect(port))
    report.append({"port": port, "attack": "store_silent", "connections": 1})


def main(argv):
    args = parse_args(argv)
    job = Job(args)
    result = {"attacked": not args.no_attack, "attacks": [], "failures": []}
    held = []
    try:
        pids = [int(x) for x in job.wait_line(r"rank pids: ([\d ]+)", "rank pids").group(1).split()]
        watcher = job.watch_memory(pids[0])
        job.wait_line(r"\[1/1\]: running", "running")
        ports = listening_ports(pids[0])
        if job.store_port not in ports:
            raise AssertionError("rank 0 (pid %d) does not listen on its TCP store port %d (it listens on %s)" %
                                 (pids[0], job.store_port, sorted(ports)))
        zmq_ports = sorted(ports - {job.store_port})
        if not zmq_ports:
            raise AssertionError("rank 0 (pid %d) listens on no port but its TCP store's" % pids[0])
        result["ports"] = {"store": job.store_port, "zmq": zmq_ports}
        if not args.no_attack:
            for port in zmq_ports + [job.store_port]:
                for _ in range(8):
                    held.append(connect(port))
                result["attacks"].append({"port": port, "attack": "silent", "connections": 8})
            for port in zmq_ports:
                attack_zmq(port, result["attacks"])
            attack_store(job.store_port, result["attacks"], held)
            if job.proc.poll() is not None or vm_hwm_kib(pids[0]) is None:
                raise AssertionError("the run ended before the attacks were done: raise --seconds (%d)" % args.seconds)
            # The store names the forged handshake on rank 0's stderr.
            job.wait_line(r"does not hold the job secret", "does not hold the job secret")
        rc = job.finish()
        watcher.join(timeout=HANG)
        result["launcher_status"] = rc
        result["rank0_vm_hwm_kib"] = job.hwm
        if rc != 0:
            result["failures"].append("the launcher exited with status %d" % rc)
        try:
            report = json.loads(job.stdout)
        except ValueError:
            report = None
            result["failures"].append("rank 0 printed no JSON report: %r" % job.stdout[:200])
        if report is not None:
            result["report"] = report
            if len(report) != 1:
                result["failures"].append("the report has %d objects, not 1" % len(report))
            for r in report:
                if r.get("workers") != 2:
                    result["failures"].append("%s: %s workers, not 2" % (r.get("policy"), r.get("workers")))
                if r.get("evicted") != []:
                    result["failures"].append("%s: evicted %s" % (r.get("policy"), r.get("evicted")))
                if not r.get("iterations", 0) > 0:
                    result["failures"].append("%s: no iterations" % r.get("policy"))
                if len(r.get("worker_transfer_seconds", [])) != 2:
                    result["failures"].append("%s: not every worker's result" % r.get("policy"))
        if job.hwm == 0:
            result["failures"].append("rank 0's VmHWM was never read")
        elif job.hwm > args.memory_limit_mb * 1024:
            result["failures"].append("rank 0's VmHWM %d KiB is above the limit %d MiB" %
                                      (job.hwm, args.memory_limit_mb))
    except AssertionError as e:
        result["failures"].append(str(e))
        try:
            job.proc.kill()
        except OSError:
            pass
    finally:
        for s in held:
            s.close()
    print(json.dumps(result, indent=1))
    if result["failures"]:
        sys.stderr.write("attack_test: FAILED:\n  " + "\n  ".join(result["failures"]) + "\nits stderr:\n" +
                         "".join(job.stderr))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
