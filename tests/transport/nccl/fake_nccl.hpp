// A fake NCCL and CUDA runtime behind nccl_api, in host memory: ranks are threads of one
// process, "device" buffers are host buffers, and an operation runs when every rank it needs has
// enqueued it (the last one to arrive does the work), so events complete as a GPU's would. Faults
// can be injected: no device, an init that never completes, an asynchronous error, an operation
// that never completes. It records every ncclCommAbort with the thread that called it, the stream
// of every operation and copy, and the device memory still allocated. Copies and memsets run at
// once, so one queued behind an unfinished operation on its stream fails (code 999) instead of
// running out of order. run_ranks (at the end) runs ranks as threads over it.
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

using flag = std::shared_ptr<std::atomic<bool>>;

struct stream {
  std::vector<flag> pending;
  std::uint64_t uses = 0;  // operations, copies and memsets enqueued on it (its owner's thread)
};

// Device blocks allocated and not yet freed, over every world (the tests run one at a time).
inline std::atomic<long> live_device_blocks{0};

// Whether every operation enqueued on `s` has completed (a copy may run at once).
inline bool stream_idle(void* s) {
  auto* st = static_cast<stream*>(s);
  ++st->uses;
  return std::all_of(st->pending.begin(), st->pending.end(), [](const flag& f) { return f->load(); });
}
struct event {
  std::vector<flag> waits;
};

enum class kind { allreduce, broadcast, send, recv };

struct op {
  kind k;
  const void* in;
  void* out;
  std::size_t count;  // elements (allreduce) or bytes
  dtype t;
  reduce_op r;
  int peer;  // root (broadcast) or peer (send, recv)
  flag done;
  bool premul = false;  // all_reduce_op: ncclAvg or a PreMulSum, `scale` times this rank's input
  double scale = 1.0;
};

struct world;

struct group {  // one NCCL communicator: every rank's comm from one unique id
  int nranks = 0;
  int joined = 0;
  bool poisoned = false;  // a rank aborted: nothing more runs, as after ncclCommAbort
  std::map<std::uint64_t, std::vector<std::optional<op>>> collectives;
  std::map<std::pair<int, int>, std::deque<op>> sends, recvs;  // keyed by (src, dst)
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
  explicit world(faults f = {}) : fault(std::move(f)) {}
  world(const world&) = delete;
  world& operator=(const world&) = delete;

  faults fault;
  std::mutex m;
  std::uint64_t next_group = 0;
  std::map<std::uint64_t, std::unique_ptr<group>> groups;
  std::vector<std::unique_ptr<comm>> comms;
  std::vector<abort_record> aborts;
  std::vector<int> set_devices;
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
      return enqueue(handle, s, op{kind::allreduce, in, out, count, t, r, 0, nullptr});
    };
    a.broadcast = [](const void* in, void* out, std::size_t bytes, int root, void* handle,
                     void* s) -> int {
      return enqueue(handle, s, op{kind::broadcast, in, out, bytes, dtype::u8, reduce_op::sum, root, nullptr});
    };
    a.send = [](const void* buf, std::size_t bytes, int peer, void* handle, void* s) -> int {
      return enqueue(handle, s, op{kind::send, buf, nullptr, bytes, dtype::u8, reduce_op::sum, peer, nullptr});
    };
    a.recv = [](void* buf, std::size_t bytes, int peer, void* handle, void* s) -> int {
      return enqueue(handle, s, op{kind::recv, nullptr, buf, bytes, dtype::u8, reduce_op::sum, peer, nullptr});
    };
    a.all_reduce_op = [](const void* in, void* out, std::size_t count, dtype t, int raw, void* handle,
                         void* s) -> int {
      auto* c = static_cast<comm*>(handle);
      op o{kind::allreduce, in, out, count, t, reduce_op::sum, 0, nullptr, true, 1.0};
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
      const auto* w = static_cast<world*>(context);
      *n = w->fault.device_count_error != 0 ? 0 : w->fault.devices;
      return w->fault.device_count_error;
    };
    a.set_device = [](int) -> int { return 0; };
    a.stream_create = [](void** s) -> int {
      *s = new stream;
      return 0;
    };
    a.stream_destroy = [](void* s) -> int {
      delete static_cast<stream*>(s);
      return 0;
    };
    a.event_create = [](void** e) -> int {
      *e = new event;
      return 0;
    };
    a.event_record = [](void* e, void* s) -> int {
      auto* st = static_cast<stream*>(s);
      auto& p = st->pending;
      p.erase(std::remove_if(p.begin(), p.end(), [](const flag& f) { return f->load(); }), p.end());
      static_cast<event*>(e)->waits = p;
      return 0;
    };
    a.event_query = [](void* e) -> int {
      for (const auto& f : static_cast<event*>(e)->waits)
        if (!f->load()) return nccl_codes::cuda_not_ready;
      return 0;
    };
    a.event_destroy = [](void* e) -> int {
      delete static_cast<event*>(e);
      return 0;
    };
    a.cuda_error_string = [](int rc) -> const char* {
      if (rc == 999) return "fake: a copy queued behind an unfinished operation on its stream";
      if (rc == 2) return "out of memory";
      return rc == 100 ? "no CUDA-capable device is detected" : "unknown CUDA error";
    };
    a.memcpy_async = [](void* dst, const void* src, std::size_t bytes, void* s) -> int {
      if (!stream_idle(s)) return 999;
      std::memmove(dst, src, bytes);
      return 0;
    };
    a.memset_async = [](void* p, int value, std::size_t bytes, void* s) -> int {
      if (!stream_idle(s)) return 999;
      std::memset(p, value, bytes);
      return 0;
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

  static int enqueue(void* handle, void* s, op o) {
    auto* c = static_cast<comm*>(handle);
    world* w = c->w;
    std::lock_guard<std::mutex> lock(w->m);
    if (c->aborted || c->destroyed) return 5;  // ncclInvalidUsage
    o.done = std::make_shared<std::atomic<bool>>(false);
    static_cast<stream*>(s)->pending.push_back(o.done);
    ++static_cast<stream*>(s)->uses;
    ++c->ops;
    if (w->fault.async_error_rank == c->rank && c->ops >= w->fault.async_error_at_op) {
      c->async_error = w->fault.async_error_code;
      return 0;
    }
    if (w->fault.hang_rank == c->rank && c->ops >= w->fault.hang_from_op) return 0;
    group& g = *c->g;
    if (o.k == kind::allreduce || o.k == kind::broadcast) {
      auto& slot = g.collectives[++c->collectives];
      slot.resize(static_cast<std::size_t>(g.nranks));
      slot[static_cast<std::size_t>(c->rank)] = o;
      if (!g.poisoned && std::all_of(slot.begin(), slot.end(), [](const auto& x) { return x.has_value(); })) {
        run_collective(slot);
        g.collectives.erase(c->collectives);
      }
      return 0;
    }
    const auto key = o.k == kind::send ? std::make_pair(c->rank, o.peer) : std::make_pair(o.peer, c->rank);
    (o.k == kind::send ? g.sends : g.recvs)[key].push_back(o);
    auto& sq = g.sends[key];
    auto& rq = g.recvs[key];
    while (!g.poisoned && !sq.empty() && !rq.empty()) {
      // NCCL matches the n-th send with the n-th recv and compares no sizes: neither does this.
      std::memcpy(rq.front().out, sq.front().in, std::min(sq.front().count, rq.front().count));
      sq.front().done->store(true);
      rq.front().done->store(true);
      sq.pop_front();
      rq.pop_front();
    }
    return 0;
  }

  static void run_collective(std::vector<std::optional<op>>& slot) {
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
    for (auto& o : slot) o->done->store(true);
  }

  // NCCL's PreMulSum (and ncclAvg on floating types): each rank's input times its own scalar in
  // the element type, summed in rank order.
  template <class T>
  static void premul_sum(std::vector<std::optional<op>>& slot) {
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
