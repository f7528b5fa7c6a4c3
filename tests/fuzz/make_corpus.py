#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): a handful of
valid inputs and edge cases each, in the layout the target's comment describes. The files are
committed; rerun this after changing a target's input layout:

  /usr/bin/python3 tests/fuzz/make_corpus.py

A regression input for a bug the fuzzer found is committed beside them by hand (named
regression-<what>), and never rewritten here. Python 3 standard library only.
"""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


# ---- zmq_message: byte 0 (bit 0 rendezvous, bit 1 two frames), size - 1, rank ----

def zmq_header(kind, src, dst, tag=0, coll=0, typ=0, op=0, src_inc=1, dst_inc=1, id_=0, nbytes=0, offset=0,
               step=0, length=0):
    return struct.pack("<BBBBiiiQQQQQII", kind, coll, typ, op, tag, src, dst, src_inc, dst_inc, id_, nbytes, offset,
                       step, length)


def identity(rank, inc):
    return b"C" + struct.pack("<iQ", rank, inc)


def data_path(name, frames, size=3, rank=0, src=1, inc=1, id_bytes=None):
    ident = identity(src, inc) if id_bytes is None else id_bytes
    flags = 2 if len(frames) == 2 else 0
    out = bytes([flags, size - 1, rank, len(ident)]) + ident
    if len(frames) == 2:
        out += struct.pack("<H", len(frames[0])) + frames[0] + frames[1]
    else:
        out += frames[0]
    write("zmq_message", name, out)


def zmq_corpus():
    data = b"payload"
    data_path("eager", [zmq_header(1, 1, 0, tag=3, nbytes=len(data), length=len(data)) + data])
    # The forged message: an eager header whose bytes disagree with what it carries.
    data_path("eager-wrong-size", [zmq_header(1, 1, 0, tag=32767, nbytes=48, length=len(data)) + data])
    data_path("announce", [zmq_header(2, 1, 0, tag=5, id_=7, nbytes=1 << 20)])
    data_path("clear", [zmq_header(3, 1, 0, id_=7)])
    data_path("refuse", [zmq_header(4, 1, 0, id_=7, length=11) + b"wrong size!"])
    data_path("piece", [zmq_header(5, 1, 0, id_=7, offset=4096, length=5), b"bytes"])
    data_path("piece-overflow", [zmq_header(5, 1, 0, id_=7, offset=(1 << 64) - 2, length=5), b"bytes"])
    data_path("credit", [zmq_header(6, 1, 0, offset=65536)])
    data_path("coll-notice", [zmq_header(7, 1, 0, coll=1, id_=1, step=0xFFFFFFFF)])
    data_path("coll-data", [zmq_header(7, 1, 0, coll=2, id_=3, step=1, nbytes=8, length=8) + b"\0" * 8])
    data_path("coll-fail", [zmq_header(8, 1, 0, id_=2, length=4) + b"why?"])
    data_path("bye", [zmq_header(9, 1, 0, id_=4)])
    data_path("withdraw", [zmq_header(10, 1, 0, id_=7)])
    data_path("hello", [zmq_header(11, 1, 0)])
    data_path("stream", [zmq_header(12, 1, 0, tag=1, id_=9, nbytes=4096)])
    data_path("unknown-kind", [zmq_header(200, 1, 0)])
    data_path("short-header", [zmq_header(1, 1, 0)[:40]])
    data_path("bad-identity", [zmq_header(1, 1, 0)], id_bytes=b"X" * 13)
    data_path("huge-length", [zmq_header(1, 1, 0, nbytes=1 << 40, length=0xFFFFFFFF)])
    # The rendezvous: CDZ1, the kind, its fields.
    def rdv(name, kind, body, size=3, rank=1):
        write("zmq_message", name, bytes([1, size - 1, rank]) + b"CDZ1" + bytes([kind]) + body)

    def s(text):
        text = text.encode()
        return struct.pack("<I", len(text)) + text

    rdv("rdv-hello", 1, struct.pack("<ii", 2, 3) + s("tcp://127.0.0.1:40001") + struct.pack("<Q", 0x5EED), rank=0)
    rdv("rdv-welcome", 2, struct.pack("<Qi", 2, 3) + b"".join(struct.pack("<QB", 1, 1) + s("tcp://127.0.0.1:%d" % (40000 + p))
                                                               for p in range(3)))
    rdv("rdv-refused", 3, s("rank 5 is out of range"))
    rdv("rdv-update", 4, struct.pack("<iQ", 2, 3) + s("tcp://10.0.0.2:40002"))
    rdv("rdv-replaced", 5, struct.pack("<Q", 4))
    rdv("rdv-string-claims-4GiB", 3, struct.pack("<I", 0xFFFFFFFF) + b"abc")
    rdv("rdv-truncated-welcome", 2, struct.pack("<Qi", 2, 3) + struct.pack("<QB", 1, 1) + struct.pack("<I", 40))


# ---- tcp_store_request: byte 0 (bit 0 authenticated), then the stream ----

def store_request(op, key, value=b"", code=False):
    key = key.encode() if isinstance(key, str) else key
    return bytes([ord(op)]) + struct.pack(">II", len(key), len(value)) + key + value + (b"\xAA" * 32 if code else b"")


def store_corpus():
    write("tcp_store_request", "set", b"\0" + store_request("S", "addr/1", b"tcp://10.0.0.2:4000"))
    write("tcp_store_request", "get-check", b"\0" + store_request("G", "addr/0") + store_request("C", "running"))
    write("tcp_store_request", "authenticated", b"\1" + store_request("S", "world.zmq", b"tcp://127.0.0.1:1", True) +
          store_request("G", "world.zmq", code=True))
    write("tcp_store_request", "unknown-op", b"\0" + store_request("X", "k"))
    write("tcp_store_request", "empty-key", b"\0" + bytes([ord("G")]) + struct.pack(">II", 0, 0))
    write("tcp_store_request", "key-too-long", b"\0" + bytes([ord("S")]) + struct.pack(">II", 4097, 1) + b"k")
    write("tcp_store_request", "value-claims-4GiB", b"\0" + bytes([ord("S")]) + struct.pack(">II", 1, 0xFFFFFFFF) + b"k")
    write("tcp_store_request", "get-with-value", b"\0" + bytes([ord("G")]) + struct.pack(">II", 1, 3) + b"kabc")
    write("tcp_store_request", "truncated", b"\1" + store_request("S", "addr/2", b"x" * 100, True)[:60])


# ---- ps_protocol: byte 0 (bit 0 worker end, bit 1 two servers, bit 2 bsp), then steps ----

def ps_corpus():
    # Server end, one server: pull as a new process (worker -1, the model's size, request 1),
    # push iteration 1 with its 8 floats (request 2), finish.
    pull = bytes([2, 1, 0, 0, 0, 4, 1, 0])
    push = bytes([0, 2, 4, 0, 0, 8, 1, 9])
    finish = bytes([4, 2, 0, 0, 0, 12, 1, 0])
    write("ps_protocol", "server-pull-push-finish", bytes([0]) + pull + push + finish)
    write("ps_protocol", "server-bsp-two-servers", bytes([6]) + pull + bytes([3, 1, 0, 0, 0, 4, 1, 0]) + push + finish)
    write("ps_protocol", "server-push-huge-count", bytes([0]) + pull + bytes([0, 2, 4, 3, 0, 8, 1, 9]))
    write("ps_protocol", "server-push-negative-count", bytes([0]) + pull + bytes([0, 2, 4, 2, 0, 8, 1, 9]))
    write("ps_protocol", "server-unknown-kind", bytes([0]) + bytes([22, 3, 3, 3, 3, 3, 1, 5]))
    write("ps_protocol", "server-notice-from-worker", bytes([2]) + bytes([8, 2, 0, 0, 0, 4, 1, 0]))
    # Worker end: the pull's weights (32 bytes), a push answered, a refusal with its text.
    ok = bytes([1, 1, 0, 0, 224, 1])
    write("ps_protocol", "worker-replies", bytes([1]) + ok + ok + bytes([1, 1, 8, 2, 112, 1]))
    write("ps_protocol", "worker-refusal-huge-text", bytes([1]) + bytes([1, 1, 0, 2, 3, 1]))
    write("ps_protocol", "worker-refusal-negative-text", bytes([1]) + bytes([1, 1, 0, 2, 2, 1]))
    write("ps_protocol", "worker-stale-reply", bytes([1]) + bytes([1, 1, 0, 0, 224, 4]))


# ---- policy_config: byte 0 (workers - 1), then the string ----

def policy_corpus():
    for i, (workers, config) in enumerate([
            (4, "bsp"), (4, "asp"), (8, "ssp:3"), (8, "dssp:3:15"), (8, "dssp:3:15:median:5"),
            (16, "elastic:15:median:5:opt-bs"), (4, "elastic:4:ewma:0.5:fast"), (4, "elastic:2:mean:3:zipline"),
            (4, "periodic:4"), (4, "elastic-avg:15:last:opt"), (2, "ssp:99999999999999999999"), (2, "dssp:5:2"),
            (2, "elastic:0"), (2, "median:65"), (1, "ewma:1e-300"), (3, "ssp:-1"), (3, "dssp:1:2:median"),
            (1, "elastic:65537")]):
        write("policy_config", "%02d-%s" % (i, config.replace(":", "_")), bytes([workers - 1]) + config.encode())


# ---- push_history: byte 0 (bounds), then the file; trace: byte 0 (bit 0 small bounds), then the file ----

def text_corpora():
    for target, name, flags, text in [
            ("push_history", "integers", 0, b"0:100,200,300,\n1:150,260,380,\n"),
            ("push_history", "decimals", 0, b"0: 1.5, 2e3 ,\r\n\n2:0.25,0.5\n"),
            ("push_history", "strict-small-bounds", 0x0e, b"3:1,2,3\n1:4,5,6\n"),
            ("push_history", "huge-integer", 0, b"0:1,99999999999999999999\n"),
            ("push_history", "duplicate-id", 0, b"1:1,2\n1:3,4\n"),
            ("push_history", "decreasing", 0, b"0:5,4\n"),
            ("push_history", "nan", 0, b"0:1,nan,inf\n"),
            ("push_history", "no-colon", 0, b"12345\n"),
            ("trace", "with-costs", 0, b"# a run\nworker,start,compute,push,pull\n0,0,0.1012,0.0004,0.0003\n"
                                       b"1,0,0.1705,0.0004,0.0003\n0,0.1031,0.0998,0.0004,0.0003\n"),
            ("trace", "without-costs", 1, b"worker,start,compute\r\n0,0,1\r\n1,0.5,1e-3\r\n"),
            ("trace", "missing-worker", 0, b"worker,start,compute\n2,0,1\n"),
            ("trace", "backwards", 0, b"worker,start,compute\n0,1,1\n0,0.5,1\n"),
            ("trace", "worker-huge", 0, b"worker,start,compute\n99999999999999,0,1\n"),
            ("trace", "nul-byte", 0, b"worker,start,compute\n0,0\0,1\n")]:
        write(target, name, bytes([flags]) + text)


def main():
    zmq_corpus()
    store_corpus()
    ps_corpus()
    policy_corpus()
    text_corpora()
    return 0


if __name__ == "__main__":
    sys.exit(main())
