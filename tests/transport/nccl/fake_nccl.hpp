// A fake NCCL and CUDA runtime behind nccl_api, in host memory: ranks are threads of one
// process, "device" buffers are host buffers. Streams are asynchronous, as a GPU's are: what is
// enqueued on a stream (NCCL operations, copies, memsets, event records, waits on events, and
// "kernels" a test launches with world::launch) runs only when someone synchronises with it
// (cudaEventQuery on an event behind it), in stream order, and a stream waiting on an event first
// runs the stream the event was recorded on, up to it. So an adapter that does not order its
// stream after the caller's reads a gradient before the caller's kernel has written it, and its
// test fails. An NCCL operation runs when every rank it needs has reached it on its stream (the
// last one to arrive does the work), so events complete as a GPU's would. The legacy default
// stream (null) is one per device, as cudaSetDevice selects it for the calling thread. Faults can
// be injected: no device, an init that never completes, an asynchronous error, an operation that
// never completes. It records every ncclCommAbort with the thread that called it, what was
// enqueued on every stream, and the device memory still allocated. run_ranks (at the end) runs
// ranks as threads over it.
#pragma once

#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/reduce.hpp>
#include <cadence/transport/inproc.hpp>
#include <cadence/transport/nccl/protocol.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_fake_nccl {

using namespace cadence::transport;

struct faults {
  int devices = 8;                        // what cudaGetDeviceCount reports
  int device_count_error = 0;             // nonzero: cudaGetDeviceCount fails with it
  std::vector<int> init_never_completes;  // ranks whose init stays in progress forever
  int async_error_rank = -1;              // this rank's communicator reports async_error_code
  std::uint64_t async_error_at_op = 1;    // at its n-th operation (1-based), which never runs
  int async_error_code = 6;               // ncclRemoteError
  int hang_rank = -1;                     // this rank's operations never run (a stuck kernel)
  std::uint64_t hang_from_op = 1;         // from its n-th operation on
};

// Device blocks allocated and not yet freed, over every world (the tests run one at a time).
inline std::atomic<long> live_device_blocks{0};

struct world;
struct comm;
struct stream;

enum class kind { allreduce, broadcast, send, recv };

struct op {
  kind k = kind::allreduce;
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;  // elements (allreduce) or bytes
  dtype t = dtype::u8;
  reduce_op r = reduce_op::sum;
  int peer = 0;  // root (broadcast) or peer (send, recv)
  bool premul = false;  // all_reduce_op: ncclAvg or a PreMulSum, `scale` times this rank's input
  double scale = 1.0;
  comm* c = nullptr;
  std::uint64_t slot = 0;  // collectives: its index among its communicator's, from the enqueue
  bool never = false;      // a fault: it never runs
  bool entered = false;    // it reached the head of its stream and takes part
  bool done = false;
};
using op_ptr = std::shared_ptr<op>;

// One piece of work on a stream, run in order when the stream is driven.
struct item {
  enum class what { op, copy, memset, host, record, wait } k = what::host;
  op_ptr o;                   // op
  void* dst = nullptr;        // copy, memset
  const void* src = nullptr;  // copy
  std::size_t bytes = 0;      // copy, memset
  int value = 0;              // memset
  std::function<void()> fn;   // host: a test's "kernel"
  stream* waited = nullptr;   // wait: the stream the event was recorded on
  std::uint64_t until = 0;    // wait: how far that stream must have run
  std::uint64_t position = 0;  // this item's place in its stream

  item() = default;
  /// A copy of `n` bytes from `from` to `to`, or a memset of them to `v`.
  item(what kind, void* to, const void* from, std::size_t n, int v = 0)
      : k(kind), dst(to), src(from), bytes(n), value(v) {}
};

struct stream {
  world* w = nullptr;
  int device = 0;
  std::deque<item> q;
  std::uint64_t enqueued = 0, executed = 0;  // positions: items enqueued, items run
  std::uint64_t uses = 0;     // NCCL operations, copies and memsets enqueued on it
  std::uint64_t records = 0;  // event records enqueued on it
  std::uint64_t waits = 0;    // waits on events enqueued on it
};

struct event {
  stream* on = nullptr;  // the stream of its latest record (null: never recorded)
  std::uint64_t position = 0;
};

struct group {  // one NCCL communicator: every rank's comm from one unique id
  int nranks = 0;
  int joined = 0;
  bool poisoned = false;  // a rank aborted: nothing more runs, as after ncclCommAbort
  std::map<std::uint64_t, std::vector<op_ptr>> collectives;
  std::map<std::pair<int, int>, std::deque<op_ptr>> sends, recvs;  // keyed by (src, dst)
};

struct comm {
  world* w = nullptr;
  group* g = nullptr;
  int rank = 0;
  bool init_stuck = false;
  bool aborted = false;
  bool finalized = false;
  bool destroyed = false;
  int async_error = 0;
  std::uint64_t ops = 0;
  std::uint64_t collectives = 0;
  std::map<int, double> premul_ops;  // live ncclRedOpCreatePreMulSum operators and their scalars
  int next_op = 5;                   // after ncclAvg, as NCCL numbers them
};

struct abort_record {
  int rank;
  std::thread::id thread;
};

// What cudaSetDevice and the world's device count set for the calling thread: which world and
// device the null stream (the legacy default stream) and new streams belong to.
struct thread_state {
  world* w = nullptr;
  int device = 0;
};
inline thread_local thread_state current;
// The world most recently made: streams and events created on a thread that has not selected a
// device yet belong to it (the tests run one world at a time).
inline std::atomic<world*> latest{nullptr};
inline world* world_of_thread() { return current.w != nullptr ? current.w : latest.load(); }

inline float half_to_float(std::uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                   : std::ldexp(1.0f + static_cast<float>(m) / 1024.0f, e - 15);
  return sign ? -v : v;
}
inline std::uint16_t float_to_half(float f) {  // normal values, as the tests use
  const std::uint16_t sign = f < 0 ? 0x8000 : 0;
  f = std::fabs(f);
  if (f == 0.0f) return sign;
  int e = 0;
  const float m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)
  const auto mant = static_cast<std::uint16_t>(std::lround((m * 2.0f - 1.0f) * 1024.0f));
  return static_cast<std::uint16_t>(sign | ((e - 1 + 15) << 10) | mant);
}
inline float bf16_to_float(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline std::uint16_t float_to_bf16(float f) {  // truncating: exact for the tests' values
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof f);
  return static_cast<std::uint16_t>(bits >> 16);
}

struct world {
  explicit world(faults f = {}) : fault(std::move(f)) { latest = this; }
  ~world() {
    world* self = this;
    latest.compare_exchange_strong(self, nullptr);
    if (current.w == this) current.w = nullptr;
  }
  world(const world&) = delete;
  world& operator=(const world&) = delete;

  faults fault;
  std::mutex m;
  std::uint64_t next_group = 0;
  std::map<std::uint64_t, std::unique_ptr<group>> groups;
  std::vector<std::unique_ptr<comm>> comms;
  std::vector<std::unique_ptr<stream>> streams;  // every stream, null ones included, until the world goes
  std::vector<std::unique_ptr<event>> events;
  std::map<int, stream*> default_streams;  // per device: the legacy default stream
  std::vector<abort_record> aborts;
  int finalized = 0;
  int destroyed = 0;
  int premul_created = 0, premul_destroyed = 0;

  int live_premul_ops() {
    std::lock_guard<std::mutex> lock(m);
    return premul_created - premul_destroyed;
  }

  std::vector<abort_record> abort_log() {
    std::lock_guard<std::mutex> lock(m);
    return aborts;
  }
  int destroyed_count() {
    std::lock_guard<std::mutex> lock(m);
    return destroyed;
  }
  std::size_t group_count() {
    std::lock_guard<std::mutex> lock(m);
    return groups.size();
  }

  /// A "kernel": `fn` runs on `s` (null: this thread's device's legacy default stream) when the
  /// stream is driven there, in order with the rest of its work. It must not call the fake.
  void launch(void* s, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(m);
    item it;
    it.k = item::what::host;
    it.fn = std::move(fn);
    push(stream_of(s), std::move(it));
  }

  /// What was enqueued on `s` (null: the legacy default stream of this thread's device).
  stream& stream_info(void* s) {
    std::lock_guard<std::mutex> lock(m);
    return *stream_of(s);
  }

  // ---- streams (under m) ----

  // A stream handle as the table passes it: null is the calling thread's device's legacy
  // default stream.
  stream* stream_of(void* s) {
    if (s != nullptr) return static_cast<stream*>(s);
    stream*& d = default_streams[current.device];
    if (d == nullptr) {
      streams.push_back(std::make_unique<stream>());
      d = streams.back().get();
      d->w = this;
      d->device = current.device;
    }
    return d;
  }

  static void push(stream* st, item it) {
    it.position = ++st->enqueued;
    st->q.push_back(std::move(it));
  }

  // Enqueues a copy or a memset on stream s (the thread's current stream when s is null).
  static int enqueue_use(void* s, item it) {
    world* w = s != nullptr ? static_cast<stream*>(s)->w : world_of_thread();
    std::lock_guard<std::mutex> lock(w->m);
    stream* st = w->stream_of(s);
    push(st, std::move(it));
    ++st->uses;
    return 0;
  }

  // Runs `st`'s work in order as far as it can: up to an NCCL operation the other ranks have not
  // reached yet, or a wait on an event whose stream cannot get there.
  void drive(stream* st, int depth = 0) {
    while (!st->q.empty()) {
      item& it = st->q.front();
      switch (it.k) {
        case item::what::copy:
          if (it.bytes != 0) std::memmove(it.dst, it.src, it.bytes);
          break;
        case item::what::memset:
          if (it.bytes != 0) std::memset(it.dst, it.value, it.bytes);
          break;
        case item::what::host:
          it.fn();
          break;
        case item::what::record:
          break;
        case item::what::wait:
          if (it.waited->executed < it.until && depth < 8) drive(it.waited, depth + 1);
          if (it.waited->executed < it.until) return;
          break;
        case item::what::op:
          if (!it.o->entered) enter(it.o);
          if (!it.o->done) return;
          break;
      }
      st->executed = it.position;
      st->q.pop_front();
    }
  }

  // An operation reached the head of its stream: it takes part, and runs once every rank it
  // needs has reached its own.
  static void enter(const op_ptr& o) {
    o->entered = true;
    comm* c = o->c;
    group& g = *c->g;
    if (o->never || g.poisoned || c->aborted) return;
    if (o->k == kind::allreduce || o->k == kind::broadcast) {
      auto& slot = g.collectives[o->slot];
      slot.resize(static_cast<std::size_t>(g.nranks));
      slot[static_cast<std::size_t>(c->rank)] = o;
      if (std::all_of(slot.begin(), slot.end(), [](const op_ptr& x) { return x != nullptr; })) {
        run_collective(slot);
        g.collectives.erase(o->slot);
      }
      return;
    }
    const auto key = o->k == kind::send ? std::make_pair(c->rank, o->peer) : std::make_pair(o->peer, c->rank);
    (o->k == kind::send ? g.sends : g.recvs)[key].push_back(o);
    auto& sq = g.sends[key];
    auto& rq = g.recvs[key];
    while (!sq.empty() && !rq.empty()) {
      // NCCL matches the n-th send with the n-th recv and compares no sizes: neither does this.
      std::memcpy(rq.front()->out, sq.front()->in, std::min(sq.front()->count, rq.front()->count));
      sq.front()->done = true;
      rq.front()->done = true;
      sq.pop_front();
      rq.pop_front();
    }
  }

  nccl_api api() {
    nccl_api a;
    a.context = this;
    a.get_unique_id = [](void* context, nccl_unique_id* id) -> int {
      auto* w = static_cast<world*>(context);
      std::lock_guard<std::mutex> lock(w->m);
      const std::uint64_t gid = ++w->next_group;
      std::memset(id->bytes, 0, sizeof id->bytes);
      std::memcpy(id->bytes, &w, sizeof w);
      std::memcpy(id->bytes + sizeof w, &gid, sizeof gid);
      return 0;
    };
    a.comm_init_rank_nonblocking = [](void** out, int nranks, const nccl_unique_id* id,
                                      int rank) -> int {
      world* w = nullptr;
      std::uint64_t gid = 0;
      std::memcpy(&w, id->bytes, sizeof w);
      std::memcpy(&gid, id->bytes + sizeof w, sizeof gid);
      std::lock_guard<std::mutex> lock(w->m);
      auto& g = w->groups[gid];
      if (!g) {
        g = std::make_unique<group>();
        g->nranks = nranks;
      }
      if (g->nranks != nranks || rank < 0 || rank >= nranks) return 4;  // ncclInvalidArgument
      w->comms.push_back(std::make_unique<comm>());
      comm* c = w->comms.back().get();
      c->w = w;
      c->g = g.get();
      c->rank = rank;
      const auto& stuck = w->fault.init_never_completes;
      c->init_stuck = std::find(stuck.begin(), stuck.end(), rank) != stuck.end();
      if (!c->init_stuck) ++g->joined;
      *out = c;
      return nccl_codes::in_progress;
    };
    a.comm_get_async_error = [](void* handle, int* state) -> int {
      auto* c = static_cast<comm*>(handle);
      std::lock_guard<std::mutex> lock(c->w->m);
      if (c->aborted || c->destroyed) return 5;  // ncclInvalidUsage: a freed communicator
      if (c->init_stuck || c->g->joined < c->g->nranks)
        *state = nccl_codes::in_progress;
      else
        *state = c->async_error;
      return 0;
    };
    a.comm_abort = [](void* handle) -> int {
      auto* c = static_cast<comm*>(handle);
      std::lock_guard<std::mutex> lock(c->w->m);
      c->aborted = true;
      c->g->poisoned = true;
      c->w->aborts.push_back({c->rank, std::this_thread::get_id()});
      return 0;
    };
    a.comm_finalize = [](void* handle) -> int {
      auto* c = static_cast<comm*>(handle);
      std::lock_guard<std::mutex> lock(c->w->m);
      c->finalized = true;
      ++c->w->finalized;
      return nccl_codes::in_progress;  // as a non-blocking communicator answers
    };
    a.comm_destroy = [](void* handle) -> int {
      auto* c = static_cast<comm*>(handle);
      std::lock_guard<std::mutex> lock(c->w->m);
      c->destroyed = true;
      ++c->w->destroyed;
      return 0;
    };
    a.all_reduce = [](const void* in, void* out, std::size_t count, dtype t, reduce_op r,
                      void* handle, void* s) -> int {
      op o;
      o.k = kind::allreduce, o.in = in, o.out = out, o.count = count, o.t = t, o.r = r;
      return enqueue(handle, s, o);
    };
    a.broadcast = [](const void* in, void* out, std::size_t bytes, int root, void* handle,
                     void* s) -> int {
      op o;
      o.k = kind::broadcast, o.in = in, o.out = out, o.count = bytes, o.peer = root;
      return enqueue(handle, s, o);
    };
    a.send = [](const void* buf, std::size_t bytes, int peer, void* handle, void* s) -> int {
      op o;
      o.k = kind::send, o.in = buf, o.count = bytes, o.peer = peer;
      return enqueue(handle, s, o);
    };
    a.recv = [](void* buf, std::size_t bytes, int peer, void* handle, void* s) -> int {
      op o;
      o.k = kind::recv, o.out = buf, o.count = bytes, o.peer = peer;
      return enqueue(handle, s, o);
    };
    a.all_reduce_op = [](const void* in, void* out, std::size_t count, dtype t, int raw, void* handle,
                         void* s) -> int {
      auto* c = static_cast<comm*>(handle);
      op o;
      o.k = kind::allreduce, o.in = in, o.out = out, o.count = count, o.t = t, o.premul = true;
      {
        std::lock_guard<std::mutex> lock(c->w->m);
        if (raw == nccl_codes::op_avg) {
          o.scale = 1.0 / c->g->nranks;  // as NCCL: PreMulSum by 1/nranks for floating types
        } else {
          const auto it = c->premul_ops.find(raw);
          if (it == c->premul_ops.end()) return 4;  // ncclInvalidArgument
          o.scale = it->second;
        }
      }
      if (t != dtype::f32 && t != dtype::f64) return 4;
      return enqueue(handle, s, o);
    };
    a.red_op_create_premul_sum = [](int* out, double scalar, dtype t, void* handle) -> int {
      auto* c = static_cast<comm*>(handle);
      std::lock_guard<std::mutex> lock(c->w->m);
      if (c->aborted || c->destroyed) return 5;
      if (t != dtype::f32 && t != dtype::f64) return 4;
      *out = c->next_op++;
      c->premul_ops[*out] = scalar;
      ++c->w->premul_created;
      return 0;
    };
    a.red_op_destroy = [](int o, void* handle) -> int {
      auto* c = static_cast<comm*>(handle);
      std::lock_guard<std::mutex> lock(c->w->m);
      if (c->premul_ops.erase(o) == 0) return 4;
      ++c->w->premul_destroyed;
      return 0;
    };
    a.get_error_string = [](int rc) -> const char* {
      switch (rc) {
        case 0: return "no error";
        case 1: return "unhandled cuda error";
        case 2: return "unhandled system error";
        case 3: return "internal error";
        case 4: return "invalid argument";
        case 5: return "invalid usage";
        case 6: return "remote process exited or there was a network error";
        case 7: return "NCCL operation in progress";
        default: return "unknown result code";
      }
    };
    a.get_device_count = [](void* context, int* n) -> int {
      auto* w = static_cast<world*>(context);
      current.w = w;
      *n = w->fault.device_count_error != 0 ? 0 : w->fault.devices;
      return w->fault.device_count_error;
    };
    a.set_device = [](int device) -> int {
      current.device = device;
      return 0;
    };
    a.stream_create = [](void** s) -> int {
      world* w = world_of_thread();
      if (w == nullptr) return 1;  // no device selected on this thread
      std::lock_guard<std::mutex> lock(w->m);
      w->streams.push_back(std::make_unique<stream>());
      w->streams.back()->w = w;
      w->streams.back()->device = current.device;
      *s = w->streams.back().get();
      return 0;
    };
    a.stream_destroy = [](void* s) -> int {
      // Its work still runs (as CUDA's does); the world keeps the stream until it goes.
      auto* st = static_cast<stream*>(s);
      std::lock_guard<std::mutex> lock(st->w->m);
      st->w->drive(st);
      return 0;
    };
    a.event_create = [](void** e) -> int {
      world* w = world_of_thread();
      if (w == nullptr) return 1;
      std::lock_guard<std::mutex> lock(w->m);
      w->events.push_back(std::make_unique<event>());
      *e = w->events.back().get();
      return 0;
    };
    a.event_record = [](void* e, void* s) -> int {
      world* w = s != nullptr ? static_cast<stream*>(s)->w : world_of_thread();
      std::lock_guard<std::mutex> lock(w->m);
      stream* st = w->stream_of(s);
      item it;
      it.k = item::what::record;
      push(st, std::move(it));
      ++st->records;
      auto* ev = static_cast<event*>(e);
      ev->on = st;
      ev->position = st->enqueued;
      return 0;
    };
    a.event_query = [](void* e) -> int {
      auto* ev = static_cast<event*>(e);
      if (ev->on == nullptr) return 0;  // never recorded: complete, as CUDA says
      std::lock_guard<std::mutex> lock(ev->on->w->m);
      ev->on->w->drive(ev->on);
      return ev->on->executed >= ev->position ? 0 : nccl_codes::cuda_not_ready;
    };
    a.event_destroy = [](void*) -> int { return 0; };  // the world keeps it until it goes
    a.stream_wait_event = [](void* s, void* e) -> int {
      auto* ev = static_cast<event*>(e);
      if (ev->on == nullptr) return 0;  // never recorded: nothing to wait for
      world* w = ev->on->w;
      std::lock_guard<std::mutex> lock(w->m);
      stream* st = w->stream_of(s);
      item it;
      it.k = item::what::wait;
      it.waited = ev->on;
      it.until = ev->position;  // the record as it is now: a later record does not move the wait
      push(st, std::move(it));
      ++st->waits;
      return 0;
    };
    a.cuda_error_string = [](int rc) -> const char* {
      if (rc == 2) return "out of memory";
      return rc == 100 ? "no CUDA-capable device is detected" : "unknown CUDA error";
    };
    a.memcpy_async = [](void* dst, const void* src, std::size_t bytes, void* s) -> int {
      return enqueue_use(s, item(item::what::copy, dst, src, bytes));
    };
    a.memset_async = [](void* p, int value, std::size_t bytes, void* s) -> int {
      return enqueue_use(s, item(item::what::memset, p, nullptr, bytes, value));
    };
    a.device_malloc = [](void** p, std::size_t bytes) -> int {
      *p = std::malloc(bytes);
      if (*p == nullptr) return 2;  // cudaErrorMemoryAllocation
      ++live_device_blocks;
      return 0;
    };
    a.device_free = [](void* p) -> int {
      if (p != nullptr) --live_device_blocks;
      std::free(p);
      return 0;
    };
    return a;
  }

  // An NCCL operation enqueued on its stream: it takes part only once the stream is driven to
  // it. A collective's slot is its index among its communicator's, fixed here (issue order).
  static int enqueue(void* handle, void* s, op o) {
    auto* c = static_cast<comm*>(handle);
    world* w = c->w;
    std::lock_guard<std::mutex> lock(w->m);
    if (c->aborted || c->destroyed) return 5;  // ncclInvalidUsage
    auto p = std::make_shared<op>(o);
    p->c = c;
    ++c->ops;
    if (w->fault.async_error_rank == c->rank && c->ops >= w->fault.async_error_at_op) {
      c->async_error = w->fault.async_error_code;
      p->never = true;
    }
    if (w->fault.hang_rank == c->rank && c->ops >= w->fault.hang_from_op) p->never = true;
    if (p->k == kind::allreduce || p->k == kind::broadcast) p->slot = ++c->collectives;
    stream* st = w->stream_of(s);
    item it;
    it.k = item::what::op;
    it.o = std::move(p);
    push(st, std::move(it));
    ++st->uses;
    return 0;
  }

  static void run_collective(std::vector<op_ptr>& slot) {
    const op& first = *slot[0];
    if (first.k == kind::broadcast) {
      const op& root = *slot[static_cast<std::size_t>(first.peer)];
      std::vector<unsigned char> data(static_cast<const unsigned char*>(root.in),
                                      static_cast<const unsigned char*>(root.in) + root.count);
      for (auto& o : slot) std::memcpy(o->out, data.data(), std::min(o->count, data.size()));
    } else if (first.premul) {
      if (first.t == dtype::f32)
        premul_sum<float>(slot);
      else
        premul_sum<double>(slot);
    } else {
      const std::size_t bytes = first.count * dtype_size(first.t);
      std::vector<unsigned char> acc(static_cast<const unsigned char*>(first.in),
                                     static_cast<const unsigned char*>(first.in) + bytes);
      for (std::size_t r = 1; r < slot.size(); ++r) reduce(acc.data(), slot[r]->in, first.count, first.t, first.r);
      for (auto& o : slot) std::memcpy(o->out, acc.data(), bytes);
    }
    for (auto& o : slot) o->done = true;
  }

  // NCCL's PreMulSum (and ncclAvg on floating types): each rank's input times its own scalar in
  // the element type, summed in rank order.
  template <class T>
  static void premul_sum(std::vector<op_ptr>& slot) {
    const std::size_t count = slot[0]->count;
    std::vector<T> acc(count, T(0));
    for (std::size_t r = 0; r < slot.size(); ++r) {
      const auto scale = static_cast<T>(slot[r]->scale);
      const auto* in = static_cast<const T*>(slot[r]->in);
      for (std::size_t i = 0; i < count; ++i) acc[i] = r == 0 ? scale * in[i] : acc[i] + scale * in[i];
    }
    for (auto& o : slot) std::memcpy(o->out, acc.data(), count * sizeof(T));
  }

  static void reduce(void* acc, const void* in, std::size_t count, dtype t, reduce_op r) {
    if (detail::host_reducible(t)) {
      detail::reduce_into(acc, in, count, t, r);
      return;
    }
    auto* a = static_cast<std::uint16_t*>(acc);
    const auto* b = static_cast<const std::uint16_t*>(in);
    for (std::size_t i = 0; i < count; ++i) {
      const float x = t == dtype::f16 ? half_to_float(a[i]) : bf16_to_float(a[i]);
      const float y = t == dtype::f16 ? half_to_float(b[i]) : bf16_to_float(b[i]);
      const float z = r == reduce_op::sum ? x + y : r == reduce_op::min ? std::min(x, y) : std::max(x, y);
      a[i] = t == dtype::f16 ? float_to_half(z) : float_to_bf16(z);
    }
  }
};

// ---- ranks as threads over the fake ----

// Runs n ranks as threads: rank r joins an in-process world (its control communicator) and
// bootstraps an nccl_communicator over fw (bulk) on it, then runs body(r, control, bulk).
// Returns what each rank's escaping exception said, indexed by rank (empty: it returned).
template <class Body>
std::vector<std::string> run_ranks(world& fw, int n, Body body) {
  const nccl_api api = fw.api();
  inproc_world control_world(n);
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto control = control_world.join(r);
        nccl_communicator bulk(api, control, r, {}, std::chrono::seconds(30));
        body(r, control, bulk);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The same over a fake with no faults.
template <class Body>
std::vector<std::string> run_ranks(int n, Body body) {
  world fw;
  return run_ranks(fw, n, body);
}

}  // namespace cadence_fake_nccl
