// cadence._membership: a member of a fault-tolerant collective job over ZeroMQ for Python
// (cadence::membership::member on a zmq_communicator), wrapped by cadence.membership and used
// by cadence.torch.FaultTolerantAverager. Its own module, built only where libzmq is found, so
// that cadence._core never needs libzmq. Errors are raised as cadence._core's classes (looked up
// by name) or as this module's SyncFailed, EvictedError and QuorumError.
//
// Threads and the GIL: every call is made on the thread that created the member (the
// communicator's owning thread), and releases the GIL while it communicates; a transaction's
// body, the state's save/load functions and the on_change/on_event callbacks run with the GIL.
#include <cadence/exchange/local_sgd/membership.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/membership/zmq/rendezvous.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;

namespace cadence::python {

namespace {

namespace mb = cadence::membership;
namespace tr = cadence::transport;
using comm_t = tr::zmq_communicator;
using member_t = mb::member<comm_t>;

// This module's exception classes (owned by the module's attributes).
struct membership_types {
  PyObject* sync_failed = nullptr;
  PyObject* evicted = nullptr;
  PyObject* quorum = nullptr;
};
membership_types types;

[[noreturn]] void raise_type(PyObject* type, const char* what) {
  PyErr_SetString(type, what);
  throw nb::python_error();
}

[[noreturn]] void raise_core(const char* name, const char* what) {
  nb::object cls = nb::module_::import_("cadence._core").attr(name);
  raise_type(cls.ptr(), what);
}

// A Python exception raised by a transaction's body, carried through member::transact() (which
// tells the others this member left the sync) as a C++ exception, and raised again outside.
struct body_raised : std::exception {
  const char* what() const noexcept override { return "cadence.membership: the transaction's body raised"; }
};

// f() with the library's exceptions raised as their Python classes. Call it with the GIL held:
// a gil_scoped_release inside f is undone before the handlers run.
template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const nb::python_error&) {
    throw;
  } catch (const mb::sync_failed& e) {
    raise_type(types.sync_failed, e.what());
  } catch (const mb::evicted_error& e) {
    raise_type(types.evicted, e.what());
  } catch (const mb::quorum_error& e) {
    raise_type(types.quorum, e.what());
  } catch (const invalid_parameter_error& e) {
    raise_core("InvalidParameterError", e.what());
  } catch (const parse_error& e) {
    raise_core("ParseError", e.what());
  } catch (const timeout_error& e) {
    raise_core("TimeoutError", e.what());
  } catch (const transport_error& e) {
    raise_core("TransportError", e.what());
  } catch (const error& e) {
    raise_core("Error", e.what());
  }
}

// A writable, C-contiguous CPU buffer seen without copying (a NumPy array, or a torch CPU
// tensor's .numpy()): the object is held while the member may touch its memory.
struct block {
  nb::object owner;
  void* data = nullptr;
  std::size_t bytes = 0;
  std::size_t count = 0;
  tr::dtype type = tr::dtype::u8;
};

tr::dtype dtype_of(const char* format, Py_ssize_t itemsize, const std::string& who) {
  std::string f = format ? format : "B";
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f.erase(0, 1);
  if (f == "f" && itemsize == 4) return tr::dtype::f32;
  if (f == "d" && itemsize == 8) return tr::dtype::f64;
  if ((f == "i" || f == "l" || f == "q") && itemsize == 4) return tr::dtype::i32;
  if ((f == "l" || f == "q") && itemsize == 8) return tr::dtype::i64;
  if ((f == "B" || f == "b" || f == "c") && itemsize == 1) return tr::dtype::u8;
  if (f == "e" && itemsize == 2) return tr::dtype::f16;
  throw invalid_parameter_error(who + ": element type '" + f + "' (" + std::to_string(itemsize) +
                                " bytes) is not one the collectives carry (float32, float64, int32, int64, uint8, "
                                "float16)");
}

block block_of(nb::handle obj, const std::string& who) {
  Py_buffer v;
  if (PyObject_GetBuffer(obj.ptr(), &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
    PyErr_Clear();
    raise_core("ArrayTypeError",
               (who + ": needs a writable, C-contiguous array in CPU memory (a NumPy array, or a torch CPU "
                      "tensor through cadence.membership, which passes tensor.numpy()); got " +
                std::string(Py_TYPE(obj.ptr())->tp_name))
                   .c_str());
  }
  block b;
  b.owner = nb::borrow(obj);
  b.data = v.buf;
  b.bytes = static_cast<std::size_t>(v.len);
  try {
    b.type = dtype_of(v.format, v.itemsize, who);
  } catch (...) {
    PyBuffer_Release(&v);
    throw;
  }
  b.count = b.bytes / tr::dtype_size(b.type);
  PyBuffer_Release(&v);
  return b;
}

tr::reduce_op op_of(const std::string& op) {
  if (op == "sum") return tr::reduce_op::sum;
  if (op == "min") return tr::reduce_op::min;
  if (op == "max") return tr::reduce_op::max;
  throw invalid_parameter_error("cadence.membership: unknown reduce op '" + op + "' (sum, min or max)");
}

// A dict of key, value, key, value, ...: the reports and changes handed to Python.
inline void put(nb::dict&) {}
template <class V, class... Rest>
void put(nb::dict& d, const char* key, const V& value, const Rest&... rest) {
  d[key] = value;
  put(d, rest...);
}
template <class... KeysAndValues>
nb::dict dict_of(const KeysAndValues&... kv) {
  nb::dict d;
  put(d, kv...);
  return d;
}

nb::dict report_dict(const mb::sync_report& r) {
  return dict_of("outcome", mb::outcome_name(r.outcome),
                 "committed", r.committed,
                 "attempts", r.attempts,
                 "reconfigurations", r.reconfigurations);
}

nb::list int_list(const std::vector<int>& v) {
  nb::list l;
  for (int r : v) l.append(r);
  return l;
}

nb::dict quorum_dict(const mb::quorum& q) {
  return dict_of("id", q.id, "ranks", int_list(q.ranks));
}

// f() with the GIL released: the member's and the glue's calls that communicate (and may wait
// seconds for the quorum) let the process's other Python threads run.
template <class F>
auto unlocked(F&& f) -> decltype(f()) {
  nb::gil_scoped_release released;
  return f();
}

// `s` seconds as milliseconds, or an invalid_parameter_error naming `here` and the argument.
std::chrono::milliseconds millis(const std::string& here, double s, const char* name) {
  if (!(s > 0) || s > 1e7)
    throw invalid_parameter_error(here + ": " + name + " must be a positive number of seconds, got " +
                                  std::to_string(s));
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000 + 0.5));
}

// A Python callable given one line at a time (on_event), called with the GIL; an exception it
// raises is reported as unraisable, as `who`'s, since it runs inside a reconfiguration or a
// hold. `f` is read through its address: its owner keeps it, and destroys it with the GIL.
std::function<void(const std::string&)> line_sink(const nb::object& f, const char* who) {
  if (f.is_none()) return {};
  const nb::object* fp = &f;
  return [fp, who](const std::string& line) {
    nb::gil_scoped_acquire gil;
    try {
      (*fp)(line);
    } catch (nb::python_error& e) {
      e.discard_as_unraisable(who);
    }
  };
}

// What the communicator of every process of the job is made from: its slot, its security (a
// secret, or insecure), the membership's heartbeat, its endpoint on `address`, its rendezvous.
struct job_connection {
  int rank = 0;
  int size = 0;
  std::string rendezvous, address, secret_hex;
  bool insecure = false;
  double heartbeat_s = 1.0, connect_timeout_s = 60.0;
};

// The communicator of `c.rank`, constructed without the GIL (a Member's and the rendezvous
// holder's alike). It waits for this rank alone: any process may be a late one or a replacement
// (the first quorum's absentees are bounded by the quorum timeout), and the holder comes before
// its members. `on_bound`, kept by the caller for the communicator's life, is rank 0's
// publication of the address it bound.
std::unique_ptr<comm_t> connect(const std::string& here, const job_connection& c, const mb::timeouts& t,
                                const nb::object& on_bound) {
  if (c.rendezvous.empty()) throw invalid_parameter_error(here + ": needs a rendezvous address (tcp://HOST:PORT)");
  tr::zmq_options zo;
  if (c.insecure) {
    if (!c.secret_hex.empty()) throw invalid_parameter_error(here + ": give a secret or insecure=True, not both");
    zo.security = tr::wire_security::open;
  } else {
    if (c.secret_hex.empty())
      throw invalid_parameter_error(here + ": no job secret: pass secret= (hex, as cadence-chaos-rank's "
                                           "$CADENCE_JOB_SECRET) or insecure=True (loopback only)");
    zo.secret = tr::job_secret::from_hex(c.secret_hex, here + " secret");
  }
  zo.heartbeat_interval = t.heartbeat_interval;
  zo.heartbeat_timeout = t.heartbeat_timeout;
  zo.endpoint = "tcp://" + c.address + ":0";
  zo.wait_for = tr::zmq_wait_for::self;
  zo.rendezvous = c.rendezvous;
  if (c.rank == 0 && !on_bound.is_none()) {
    const nb::object* fp = &on_bound;
    zo.on_rendezvous_bound = [fp](const std::string& a) {
      nb::gil_scoped_acquire gil;
      (*fp)(a);  // a Python error here fails the construction (python_error)
    };
  }
  const tr::deadline until(millis(here, c.connect_timeout_s, "connect_timeout"));
  return unlocked([&] { return std::make_unique<comm_t>(c.rank, c.size, zo, until); });
}

class py_member {
public:
  py_member(const job_connection& c, bool holder, double join_timeout_s, std::size_t min_size, int max_attempts,
            bool sync_initial_state, nb::object on_bound, nb::object on_event) {
    const std::string here = "cadence.membership.Member";
    if (c.size < 1) throw invalid_parameter_error(here + ": size " + std::to_string(c.size) + " must be >= 1");
    if (c.rank < 0 || c.rank >= c.size)
      throw invalid_parameter_error(here + ": rank " + std::to_string(c.rank) + " is out of range for size " +
                                    std::to_string(c.size) + " (ranks 0.." + std::to_string(c.size - 1) + ")");
    if (holder && c.rank == 0)
      throw invalid_parameter_error(here + ": rank 0 holds the rendezvous with holder=True: run "
                                           "cadence.membership.hold_rendezvous there");
    on_bound_ = std::move(on_bound);
    on_event_ = std::move(on_event);

    mb::member_options mo;
    mo.timeouts = mb::timeouts::scaled(millis(here, c.heartbeat_s, "heartbeat"));
    mo.join_timeout = millis(here, join_timeout_s, "join_timeout");
    mo.min_size = min_size;
    mo.max_attempts = max_attempts;
    mo.sync_initial_state = sync_initial_state;
    if (holder) mo.eligible = mb::members_besides_rendezvous(c.size);
    mo.on_event = line_sink(on_event_, "cadence.membership.Member on_event callback");
    comm_ = connect(here, c, mo.timeouts, on_bound_);
    member_ = std::make_unique<member_t>(*comm_, mo);
    // What rejoin() builds the next incarnation from (on_event refers to on_event_, which stays).
    conn_ = c;
    options_ = std::move(mo);
    holder_ = holder;
  }

  ~py_member() { close(); }

  // Destroys the member and its communicator (the sockets close; later calls raise), then lets
  // go of the Python objects it held: the arrays and the callbacks, which often refer back to
  // this member (an averager's bound methods), a cycle Python's collector cannot see through C++.
  void close() {
    closed_ = true;
    if (comm_ || member_) {
      nb::gil_scoped_release unlocked;
      // What runs on the member from another thread (a DiLoCo's streaming fragment) ends first.
      end_attached();
      member_.reset();
      comm_.reset();
    }
    attached_.clear();
    order_.clear();
    held_.clear();
    blobs_.clear();
    changes_.clear();
    kept_.clear();
    on_bound_ = nb::object();
    on_event_ = nb::object();
  }

  member_t& m(const char* what) {
    if (!member_) {
      if (!closed_ && started_)
        throw invalid_parameter_error(std::string("cadence.membership.Member.") + what +
                                      ": the member is closed (its last rejoin() failed: call rejoin() again, or "
                                      "close() it)");
      throw invalid_parameter_error(std::string("cadence.membership.Member.") + what + ": the member is closed");
    }
    return *member_;
  }

  void add_state(nb::handle obj) {
    if (started_) throw invalid_parameter_error("cadence.membership.Member.add_state: register state before start() or join()");
    block b = block_of(obj, "cadence.membership.Member.add_state");
    m("add_state").add_state(mb::buffer(b.data, b.bytes));
    held_.push_back(std::move(b));
    order_.push_back({registration::array, held_.size() - 1});
  }

  void add_blob(std::string name, nb::callable save, nb::callable load) {
    if (started_) throw invalid_parameter_error("cadence.membership.Member.add_blob: register state before start() or join()");
    member_t& mm = m("add_blob");
    blobs_.push_back({std::move(name), std::move(save), std::move(load)});
    register_blob(mm, blobs_.size() - 1);
    order_.push_back({registration::blob, blobs_.size() - 1});
  }

  void on_change(nb::callable f) {
    // The callable stays here, destroyed with the GIL held; the member's function (destroyed
    // without it, in close()) holds only its index.
    member_t& mm = m("on_change");
    changes_.push_back(std::move(f));
    register_change(mm, changes_.size() - 1);
    order_.push_back({registration::change, changes_.size() - 1});
  }

  // A new incarnation of this member in its slot, after the quorum dropped it while it was
  // alive (evicted_error, quorum_error): what is attached (a DiLoCo) ends first (a streaming
  // fragment's thread is joined), then the old member and communicator; a new communicator
  // registers at `rendezvous` (rank 0 may have bound a new address), a new member gets every
  // registration again in its original order (arrays, blobs, on_change callbacks and the
  // attached DiLoCo's, which is made anew on it: every member of the job registers its state
  // in the same order), and joins, through the DiLoCo when one is attached (it receives the
  // donor's global weights, outer state and counters), which overwrites the state with a
  // donor's. A failed attempt leaves no member and no DiLoCo (later calls say so) but keeps
  // what was registered, so rejoin() may be called again.
  void rejoin(const std::string& rendezvous) {
    const std::string here = "cadence.membership.Member.rejoin";
    if (closed_)
      throw invalid_parameter_error(here + ": the member was closed (close()), which let go of its state: make a "
                                           "new Member and join() instead");
    if (!started_)
      throw invalid_parameter_error(here + ": rejoin is for a member that was running: call start() or join() "
                                           "first");
    if (conn_.rank == 0 && !holder_)
      throw invalid_parameter_error(here + ": rank 0 hosts the job's rendezvous, which a new communicator would "
                                           "bind anew where no member looks: restart the job's rank 0 instead, or "
                                           "run the job with hold_rendezvous (holder=True) so that every member may "
                                           "rejoin");
    job_connection c = conn_;
    c.rendezvous = rendezvous;
    drop_incarnation();
    try {
      comm_ = connect(here, c, options_.timeouts, on_bound_);
      member_ = std::make_unique<member_t>(*comm_, options_);
      member_t& mm = *member_;
      for (const registration& r : order_) {
        switch (r.kind) {
          case registration::array: mm.add_state(mb::buffer(held_[r.index].data, held_[r.index].bytes)); break;
          case registration::blob: register_blob(mm, r.index); break;
          case registration::change: register_change(mm, r.index); break;
          case registration::attached: attached_[r.index].remake(mm); break;
        }
      }
      unlocked([&] {
        if (attached_.empty())
          mm.join();
        else
          attached_.front().join();  // one at most (attach())
      });
    } catch (...) {
      drop_incarnation();
      throw;
    }
  }

  void start() {
    started_ = true;
    member_t& mm = m("start");
    unlocked([&] { mm.start(); });
  }

  void join() {
    started_ = true;
    member_t& mm = m("join");
    unlocked([&] { mm.join(); });
  }

  nb::dict transact(nb::callable body, nb::list backup, const std::string& policy) {
    member_t& mm = m("transact");
    mb::on_loss pol;
    if (policy == "retry")
      pol = mb::on_loss::retry;
    else if (policy == "discard")
      pol = mb::on_loss::discard;
    else
      throw invalid_parameter_error("cadence.membership.Member.transact: policy '" + policy +
                                    "' is neither 'retry' nor 'discard'");
    std::vector<block> held;
    std::vector<mb::buffer> bufs;
    for (nb::handle h : backup) {
      held.push_back(block_of(h, "cadence.membership.Member.transact backup"));
      bufs.emplace_back(held.back().data, held.back().bytes);
    }
    std::optional<nb::python_error> raised;
    mb::sync_report r;
    try {
      nb::gil_scoped_release unlocked;
      r = mm.transact(
          [&] {
            nb::gil_scoped_acquire gil;
            pending_ = nullptr;
            try {
              body();
            } catch (nb::python_error& e) {
              // A view call failed because the quorum changed (SyncFailed raised through the
              // body): member::transact() recovers from the C++ exception it stands for.
              if (pending_) std::rethrow_exception(std::exchange(pending_, nullptr));
              raised.emplace(e);
              throw body_raised();
            }
          },
          span<const mb::buffer>(bufs.data(), bufs.size()), pol);
    } catch (const body_raised&) {
      nb::python_error e = *raised;
      raised.reset();
      throw e;
    }
    return report_dict(r);
  }

  // A collective on the quorum's view, for a transaction's body. A sync_failed is kept for the
  // body's wrapper in transact(), which clears it at each attempt (outside a body nothing reads it).
  template <class F>
  void view_call(const char* what, F&& f) {
    member_t& mm = m(what);
    try {
      unlocked([&] { f(mm.view()); });
    } catch (const mb::sync_failed&) {
      pending_ = std::current_exception();
      throw;
    }
  }

  void allreduce(nb::handle obj, const std::string& op) {
    const block b = block_of(obj, "cadence.membership.Member.allreduce");
    const tr::reduce_op o = op_of(op);
    view_call("allreduce", [&](auto& v) { v.allreduce(b.data, b.count, b.type, o); });
  }

  void allreduce_average(nb::handle obj) {
    const block b = block_of(obj, "cadence.membership.Member.allreduce_average");
    if (b.type != tr::dtype::f32 && b.type != tr::dtype::f64)
      throw invalid_parameter_error("cadence.membership.Member.allreduce_average: needs float32 or float64");
    view_call("allreduce_average", [&](auto& v) { v.allreduce_average(b.data, b.count, b.type); });
  }

  void broadcast(nb::handle obj, int root) {
    const block b = block_of(obj, "cadence.membership.Member.broadcast");
    view_call("broadcast", [&](auto& v) { v.broadcast(b.data, b.bytes, root); });
  }

  nb::dict finish() {
    member_t& mm = m("finish");
    return report_dict(unlocked([&] { return mm.finish(); }));
  }

  nb::dict stats() {
    const mb::member_stats s = m("stats").stats();
    return dict_of("reconfigurations", s.reconfigurations,
                   "failed_syncs", s.failed_syncs,
                   "retries", s.retries,
                   "discarded", s.discarded,
                   "healed", s.healed,
                   "state_sent_bytes", s.state_sent_bytes,
                   "state_received_bytes", s.state_received_bytes,
                   "state_receive_seconds", s.state_receive_seconds,
                   "drained_messages", s.drained_messages,
                   "last_reconfiguration_seconds", s.last_reconfiguration_seconds);
  }

  int rank() { return comm_ ? comm_->rank() : -1; }
  int size() { return comm_ ? comm_->size() : 0; }
  std::uint64_t committed() { return m("committed").committed(); }
  std::uint64_t state_hash() { return m("state_hash").state_hash(); }
  std::uint64_t nonce() { return m("nonce").nonce(); }
  nb::dict quorum() { return quorum_dict(m("quorum").current()); }
  int view_rank() { return m("view_rank").view().rank(); }
  // Holds `o` until close(): a DiLoCo whose reconfiguration hook the member calls must live as
  // long as the member does.
  void keep(nb::object o) { kept_.push_back(std::move(o)); }

  // What an object built on the member (a DiLoCo: exchange::diloco_member registers state and
  // an on_change hook with the member it is given) gives the member so that it follows the
  // member's incarnations. `remake(m)` builds it anew on rejoin()'s new member `m`, at its place
  // in the registration order (with the GIL); `join()` joins that member through it (without the
  // GIL); `end()` ends it before its member goes (without the GIL: it joins a thread whose
  // callbacks may need the GIL), at close() and rejoin(). The functions refer to their object,
  // which must live until close() (keep()). One at most: a member runs one DiLoCo's syncs.
  struct attachment {
    std::function<void(member_t&)> remake;
    std::function<void()> join;
    std::function<void()> end;
  };
  void check_attach(const std::string& here) const {
    if (!attached_.empty())
      throw invalid_parameter_error(here + ": a DiLoCo is already attached to this member (every sync of a member goes "
                                           "through its one DiLoCo): make another Member for another DiLoCo");
  }
  void attach(const std::string& here, attachment a) {
    check_attach(here);
    attached_.push_back(std::move(a));
    order_.push_back({registration::attached, attached_.size() - 1});
  }
  bool started() const noexcept { return started_; }
  void mark_started() noexcept { started_ = true; }

private:
  // State: comm_ and member_ are one incarnation (rejoin() replaces both, close() ends them);
  // held_, blobs_, changes_ and attached_ are what every incarnation registers, in the order
  // order_ lists (rejoin() replays it); conn_, options_ and holder_ are what it is built from;
  // kept_ holds the attached objects' Python side; closed_ is set by close() only.
  struct blob {
    std::string name;
    nb::callable save, load;
  };
  // One registration with the member, in the order made: element `index` of held_, blobs_,
  // changes_ or attached_.
  struct registration {
    enum kind_t { array, blob, change, attached } kind;
    std::size_t index;
  };

  // Registers blob i of blobs_ with `mm` (add_blob, and again at every rejoin()).
  void register_blob(member_t& mm, std::size_t i) {
    const std::string who = "cadence.membership: state '" + blobs_[i].name + "'";
    mm.add_state(
        blobs_[i].name,
        [this, i, who]() {
          nb::gil_scoped_acquire gil;
          nb::object r = blobs_[i].save();
          if (!nb::isinstance<nb::bytes>(r)) throw error(who + ": save() must return bytes");
          const nb::bytes b = nb::borrow<nb::bytes>(r);
          const auto* p = static_cast<const unsigned char*>(static_cast<const void*>(b.c_str()));
          return std::vector<unsigned char>(p, p + b.size());
        },
        [this, i](const std::vector<unsigned char>& v) {
          nb::gil_scoped_acquire gil;
          blobs_[i].load(nb::bytes(reinterpret_cast<const char*>(v.data()), v.size()));
        });
  }

  // Registers callback i of changes_ with `mm` (on_change, and again at every rejoin()).
  void register_change(member_t& mm, std::size_t i) {
    mm.on_change([this, i](const mb::change& c) {
      nb::gil_scoped_acquire gil;
      try {
        changes_[i](dict_of("before", quorum_dict(c.before),
                            "after", quorum_dict(c.after),
                            "lost", int_list(c.lost),
                            "admitted", int_list(c.admitted),
                            "healed", c.healed,
                            "committed", c.committed));
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("cadence.membership.Member on_change callback");  // inside a reconfiguration
      }
    });
  }

  // What is attached ends (without the GIL): before its member goes.
  void end_attached() {
    for (attachment& a : attached_) a.end();
  }

  // Ends the current incarnation, what is attached first, without the GIL (its sockets close;
  // the member's callbacks hold only indices into what stays here).
  void drop_incarnation() {
    nb::gil_scoped_release released;
    end_attached();
    member_.reset();
    comm_.reset();
  }

  std::unique_ptr<comm_t> comm_;
  std::unique_ptr<member_t> member_;
  std::vector<block> held_;
  std::vector<blob> blobs_;
  std::vector<nb::callable> changes_;
  std::vector<attachment> attached_;
  std::vector<registration> order_;
  std::vector<nb::object> kept_;
  nb::object on_bound_, on_event_;
  std::exception_ptr pending_;
  job_connection conn_;
  mb::member_options options_;
  bool holder_ = false;
  bool started_ = false;
  bool closed_ = false;
};

// exchange::diloco_member on a Member: DiLoCo's outer steps as transactions of the quorum. The
// member (its Python object) and the weights are held while this lives; its syncs are C++ only,
// so they run without the GIL. Attached to the member (py_member::attach): when the member
// rejoins, d_ is made anew on the new incarnation from what it was built from (the weights,
// the parsed config; a fresh outer optimizer, the donor's state replacing it at the join) and
// joins through it; between a failed rejoin() and a successful one d_ is null and every call
// raises the member's "its last rejoin() failed".
class py_diloco {
public:
  py_diloco(nb::object member, nb::list weights, const std::string& config) : owner_(std::move(member)) {
    py_member& pm = nb::cast<py_member&>(owner_);
    if (pm.started())
      throw invalid_parameter_error("cadence.membership.DiLoCo: make it before the member's start() or join()");
    for (nb::handle h : weights) {
      block b = block_of(h, "cadence.membership.DiLoCo weights");
      if (b.type != tr::dtype::f32)
        throw invalid_parameter_error("cadence.membership.DiLoCo: the weights must be float32 (the outer state is)");
      refs_.emplace_back(static_cast<float*>(b.data), b.count);
      held_.push_back(std::move(b));
    }
    if (refs_.empty()) throw invalid_parameter_error("cadence.membership.DiLoCo: no weights");
    config_ = exchange::parse_diloco_config(config);
    // The schedule is checked here, for the job's size, rather than at start().
    (void)exchange::outer_schedule(config_.options.schedule, static_cast<std::size_t>(pm.size()),
                                   config_.options.history);
    member_t& mm = pm.m("DiLoCo");
    pm.check_attach("cadence.membership.DiLoCo");  // before d_ registers anything with the member
    make(mm);
    // Attached once made (a failed construction leaves nothing that refers to this object). A
    // streaming fragment's thread uses the member: end() joins it before the member goes (the
    // member keeps this object until then, Member._keep).
    pm.attach("cadence.membership.DiLoCo",
              {[this](member_t& m) { make(m); }, [this] { d_->join(); }, [this] { end(); }});
  }
  py_diloco(const py_diloco&) = delete;
  py_diloco& operator=(const py_diloco&) = delete;
  // Joins a streaming fragment's thread, whose callbacks may need the GIL.
  ~py_diloco() {
    if (!d_) return;
    nb::gil_scoped_release unlocked;
    d_.reset();
  }

  // The glue, after checking that its member is still open (Member.close() destroys the member
  // it refers to).
  exchange::diloco_member<comm_t>& d(const char* what) {
    (void)nb::cast<py_member&>(owner_).m(what);
    return *d_;
  }

  void start() {
    exchange::diloco_member<comm_t>& dm = d("DiLoCo.start");
    nb::cast<py_member&>(owner_).mark_started();
    unlocked([&] { dm.start(); });
  }
  void join() {
    exchange::diloco_member<comm_t>& dm = d("DiLoCo.join");
    nb::cast<py_member&>(owner_).mark_started();
    unlocked([&] { dm.join(); });
  }
  bool step_done(double seconds) {
    if (!(seconds > 0) || seconds > 1e6)
      throw invalid_parameter_error("cadence.membership.DiLoCo.step_done: the step's duration " +
                                    std::to_string(seconds) + " s is not a positive number of seconds");
    const auto us = static_cast<std::int64_t>(seconds * 1e6 + 0.5);
    return d("DiLoCo.step_done").step_done(us < 1 ? std::int64_t{1} : us);
  }
  nb::dict sync() {
    exchange::diloco_member<comm_t>& dm = d("DiLoCo.sync");
    return report_dict(unlocked([&] { return dm.sync(); }));
  }
  nb::dict finish() {
    exchange::diloco_member<comm_t>& dm = d("DiLoCo.finish");
    return report_dict(unlocked([&] { return dm.finish(); }));
  }
  bool due() { return d("DiLoCo.due").due(); }
  bool in_flight() { return d("DiLoCo.in_flight").in_flight(); }
  // diloco_member::request_stop(): an atomic flag, so any Python thread (or a signal handler).
  void request_stop() { d("DiLoCo.request_stop").request_stop(); }
  bool stop_requested() { return d("DiLoCo.stop_requested").stop_requested(); }
  bool stop_agreed() { return d("DiLoCo.stop_agreed").stop_agreed(); }
  // diloco_member::outer_steps(): while a streaming fragment is in flight, the count after the
  // fragment that last completed (its thread owns the adapter's).
  std::uint64_t outer_steps() { return d("DiLoCo.outer_steps").outer_steps(); }
  std::uint64_t global_hash() { return d("DiLoCo.global_hash").global_hash(); }
  // diloco_member::checkpoint(): the arrays as bytes (membership.py makes NumPy arrays of them).
  nb::dict state_dict() {
    const exchange::diloco_checkpoint c = d("DiLoCo.state_dict").checkpoint();
    nb::dict r;
    r["global_weights"] = nb::bytes(c.global_weights.data(), c.global_weights.size() * 4);
    r["outer_state"] = nb::bytes(c.outer_state.data(), c.outer_state.size() * 4);
    r["syncs"] = c.syncs;
    r["fragment_steps"] = c.fragment_steps;
    r["stale_contributions"] = c.stale_contributions;
    r["max_staleness"] = c.max_staleness;
    r["clock"] = c.clock;
    nb::list steps;
    for (std::uint64_t x : c.fragment_outer_steps) steps.append(x);
    r["fragment_outer_steps"] = steps;
    return r;
  }
  // diloco_member::restore(), from what membership.py made of a state_dict(): the arrays as
  // float32 bytes, the counters as ints.
  void load_state_dict(nb::bytes global, nb::bytes state, std::uint64_t syncs, std::uint64_t fragment_steps,
                       std::uint64_t stale, std::int64_t max_staleness, std::uint64_t clock, nb::list steps) {
    exchange::diloco_member<comm_t>& dm = d("DiLoCo.load_state_dict");
    if (nb::cast<py_member&>(owner_).started())
      throw invalid_parameter_error("cadence.membership.DiLoCo.load_state_dict: called after start() or join(); "
                                    "call it before start()");
    exchange::diloco_checkpoint c;
    const auto* g = reinterpret_cast<const float*>(global.c_str());
    const auto* s = reinterpret_cast<const float*>(state.c_str());
    c.global_weights.assign(g, g + global.size() / 4);
    c.outer_state.assign(s, s + state.size() / 4);
    c.syncs = syncs;
    c.fragment_steps = fragment_steps;
    c.stale_contributions = stale;
    c.max_staleness = max_staleness;
    c.clock = clock;
    for (nb::handle h : steps) c.fragment_outer_steps.push_back(nb::cast<std::uint64_t>(h));
    dm.restore(c);
  }

private:
  // d_ on member `m` (the constructor's, or rejoin()'s new incarnation): a fresh outer
  // optimizer, the same weights and options; a stop this process asked for before goes on.
  void make(member_t& m) {
    d_ = std::make_unique<exchange::diloco_member<comm_t>>(m, span<const exchange::tensor_ref>(refs_),
                                                           exchange::make_outer_optimizer(config_.outer),
                                                           config_.options);
    if (asked_) d_->request_stop();
  }
  // Ends d_ (its streaming fragment's thread is joined), remembering a stop it was asked for.
  void end() {
    if (!d_) return;
    asked_ = asked_ || d_->stop_requested();
    d_.reset();
  }

  nb::object owner_;  // the py_member: outlives d_, which holds its member
  std::vector<block> held_;
  std::vector<exchange::tensor_ref> refs_;  // into held_
  exchange::diloco_config config_;
  bool asked_ = false;  // request_stop() on an ended d_
  std::unique_ptr<exchange::diloco_member<comm_t>> d_;
};

// Rank 0 of the job, holding its rendezvous outside the quorum (membership::hold_rendezvous)
// until `stop()` returns true (asked with the GIL at every tick; an exception it raises ends
// the hold and propagates) or, with exit_when_empty > 0 seconds, until every member slot has
// registered and none has been alive that long. The report as a dict.
nb::dict hold_rendezvous(const job_connection& c, double exit_when_empty_s, nb::object stop, nb::object on_bound,
                         nb::object on_event) {
  const std::string here = "cadence.membership.hold_rendezvous";
  (void)mb::members_besides_rendezvous(c.size);  // a job with no member is refused before it binds
  if (!(exit_when_empty_s >= 0) || exit_when_empty_s > 1e7)
    throw invalid_parameter_error(here + ": exit_when_empty must be a number of seconds >= 0 (0: never), got " +
                                  std::to_string(exit_when_empty_s));
  const mb::timeouts t = mb::timeouts::scaled(millis(here, c.heartbeat_s, "heartbeat"));
  mb::rendezvous_options ro;
  ro.exit_when_empty = std::chrono::milliseconds(static_cast<std::int64_t>(exit_when_empty_s * 1000 + 0.5));
  ro.on_event = line_sink(on_event, "cadence.membership.hold_rendezvous on_event callback");
  std::unique_ptr<comm_t> comm = connect(here, c, t, on_bound);
  std::optional<nb::python_error> raised;
  const auto asked = [&] {
    nb::gil_scoped_acquire gil;
    try {
      // Ctrl-C reaches a hold that never runs Python code otherwise.
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
      if (stop.is_none()) return false;
      const nb::object said = stop();
      const int truth = PyObject_IsTrue(said.ptr());
      if (truth < 0) throw nb::python_error();
      return truth == 1;
    } catch (nb::python_error& e) {
      raised.emplace(e);
      return true;
    }
  };
  const mb::rendezvous_report r = unlocked([&] {
    const mb::rendezvous_report held = mb::hold_rendezvous(*comm, asked, ro);
    comm.reset();  // its sockets close here, without the GIL
    return held;
  });
  if (raised) {
    nb::python_error e = *raised;
    raised.reset();
    throw e;
  }
  return dict_of("registrations", r.registrations,
                 "losses", r.losses,
                 "alive", r.alive,
                 "emptied", r.emptied,
                 "seconds", r.seconds);
}

PyObject* make_type(nb::module_& m, const char* name, PyObject* base, const char* doc) {
  const std::string qualified = std::string("cadence.membership.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::steal(t);
  return t;
}

}  // namespace

}  // namespace cadence::python

NB_MODULE(_membership, m) {
  namespace py = cadence::python;
  using py::guarded;
  using py::py_member;
  m.doc() = "A fault-tolerant collective member over ZeroMQ; use cadence.membership, not this module.";
  nb::module_ core = nb::module_::import_("cadence._core");
  py::types.sync_failed = py::make_type(
      m, "SyncFailed", core.attr("TransportError").ptr(),
      "A collective of a transaction failed because the quorum changed under it. Raised from "
      "Member.allreduce and friends inside a transaction's body: let it propagate, and "
      "Member.transact re-forms the quorum and retries or discards the sync.");
  py::types.evicted = py::make_type(
      m, "EvictedError", core.attr("Error").ptr(),
      "This member is no longer in the quorum: come back as a new incarnation, in this process "
      "(Member.rejoin) or as a new one (Member.join).");
  py::types.quorum = py::make_type(m, "QuorumError", core.attr("Error").ptr(),
                                   "The quorum cannot form or re-form (too few members left).");

  nb::class_<py_member>(m, "_Member")
      .def(
          "__init__",
          [](py_member* self, int rank, int size, std::string rendezvous, std::string address, std::string secret,
             bool insecure, double heartbeat, double join_timeout, double connect_timeout, std::size_t min_size,
             int max_attempts, bool sync_initial_state, bool holder, nb::object on_bound, nb::object on_event) {
            guarded([&] {
              const py::job_connection c{rank, size, std::move(rendezvous), std::move(address), std::move(secret),
                                         insecure, heartbeat, connect_timeout};
              new (self) py_member(c, holder, join_timeout, min_size, max_attempts, sync_initial_state,
                                   std::move(on_bound), std::move(on_event));
            });
          },
          nb::arg("rank"), nb::arg("size"), nb::arg("rendezvous"), nb::arg("address"), nb::arg("secret"),
          nb::arg("insecure"), nb::arg("heartbeat"), nb::arg("join_timeout"), nb::arg("connect_timeout"),
          nb::arg("min_size"), nb::arg("max_attempts"), nb::arg("sync_initial_state"), nb::arg("holder"),
          nb::arg("on_bound").none(), nb::arg("on_event").none())
      .def("close", [](py_member& s) { guarded([&] { s.close(); }); })
      .def("_keep", [](py_member& s, nb::object o) { s.keep(std::move(o)); })
      .def("add_state", [](py_member& s, nb::handle a) { guarded([&] { s.add_state(a); }); })
      .def("add_blob", [](py_member& s, std::string name, nb::callable save, nb::callable load) {
        guarded([&] { s.add_blob(std::move(name), std::move(save), std::move(load)); });
      })
      .def("on_change", [](py_member& s, nb::callable f) { guarded([&] { s.on_change(std::move(f)); }); })
      .def("start", [](py_member& s) { guarded([&] { s.start(); }); })
      .def("join", [](py_member& s) { guarded([&] { s.join(); }); })
      .def("rejoin", [](py_member& s, const std::string& rendezvous) { guarded([&] { s.rejoin(rendezvous); }); },
           nb::arg("rendezvous"))
      .def("transact", [](py_member& s, nb::callable body, nb::list backup, const std::string& policy) {
        return guarded([&] { return s.transact(std::move(body), std::move(backup), policy); });
      })
      .def("allreduce", [](py_member& s, nb::handle a, const std::string& op) { guarded([&] { s.allreduce(a, op); }); })
      .def("allreduce_average", [](py_member& s, nb::handle a) { guarded([&] { s.allreduce_average(a); }); })
      .def("broadcast", [](py_member& s, nb::handle a, int root) { guarded([&] { s.broadcast(a, root); }); })
      .def("finish", [](py_member& s) { return guarded([&] { return s.finish(); }); })
      .def("stats", [](py_member& s) { return guarded([&] { return s.stats(); }); })
      .def_prop_ro("rank", [](py_member& s) { return s.rank(); })
      .def_prop_ro("size", [](py_member& s) { return s.size(); })
      .def_prop_ro("committed", [](py_member& s) { return guarded([&] { return s.committed(); }); })
      .def_prop_ro("state_hash", [](py_member& s) { return guarded([&] { return s.state_hash(); }); })
      .def_prop_ro("nonce", [](py_member& s) { return guarded([&] { return s.nonce(); }); })
      .def_prop_ro("quorum", [](py_member& s) { return guarded([&] { return s.quorum(); }); })
      .def_prop_ro("view_rank", [](py_member& s) { return guarded([&] { return s.view_rank(); }); });

  m.def(
      "_hold_rendezvous",
      [](int size, std::string rendezvous, std::string address, std::string secret, bool insecure, double heartbeat,
         double connect_timeout, double exit_when_empty, nb::object stop, nb::object on_bound, nb::object on_event) {
        return guarded([&] {
          const py::job_connection c{0, size, std::move(rendezvous), std::move(address), std::move(secret),
                                     insecure, heartbeat, connect_timeout};
          return py::hold_rendezvous(c, exit_when_empty, std::move(stop), std::move(on_bound), std::move(on_event));
        });
      },
      nb::arg("size"), nb::arg("rendezvous"), nb::arg("address"), nb::arg("secret"), nb::arg("insecure"),
      nb::arg("heartbeat"), nb::arg("connect_timeout"), nb::arg("exit_when_empty"), nb::arg("stop").none(),
      nb::arg("on_bound").none(), nb::arg("on_event").none());

  nb::class_<py::py_diloco>(m, "_DiLoCo")
      .def(
          "__init__",
          [](py::py_diloco* self, nb::object member, nb::list weights, const std::string& config) {
            guarded([&] { new (self) py::py_diloco(std::move(member), std::move(weights), config); });
          },
          nb::arg("member"), nb::arg("weights"), nb::arg("config"))
      .def("start", [](py::py_diloco& s) { guarded([&] { s.start(); }); })
      .def("join", [](py::py_diloco& s) { guarded([&] { s.join(); }); })
      .def("step_done", [](py::py_diloco& s, double seconds) { return guarded([&] { return s.step_done(seconds); }); })
      .def("sync", [](py::py_diloco& s) { return guarded([&] { return s.sync(); }); })
      .def("finish", [](py::py_diloco& s) { return guarded([&] { return s.finish(); }); })
      .def_prop_ro("due", [](py::py_diloco& s) { return guarded([&] { return s.due(); }); })
      .def_prop_ro("in_flight", [](py::py_diloco& s) { return guarded([&] { return s.in_flight(); }); })
      .def("request_stop", [](py::py_diloco& s) { guarded([&] { s.request_stop(); }); })
      .def_prop_ro("stop_requested", [](py::py_diloco& s) { return guarded([&] { return s.stop_requested(); }); })
      .def_prop_ro("stop_agreed", [](py::py_diloco& s) { return guarded([&] { return s.stop_agreed(); }); })
      .def_prop_ro("outer_steps", [](py::py_diloco& s) { return guarded([&] { return s.outer_steps(); }); })
      .def_prop_ro("global_hash", [](py::py_diloco& s) { return guarded([&] { return s.global_hash(); }); })
      .def("state_dict", [](py::py_diloco& s) { return guarded([&] { return s.state_dict(); }); })
      .def("load_state_dict",
           [](py::py_diloco& s, nb::bytes global, nb::bytes state, std::uint64_t syncs, std::uint64_t fragment_steps,
              std::uint64_t stale, std::int64_t max_staleness, std::uint64_t clock, nb::list steps) {
             guarded([&] {
               s.load_state_dict(std::move(global), std::move(state), syncs, fragment_steps, stale, max_staleness,
                                 clock, std::move(steps));
             });
           });
}
