// cadence-bench-membership: what the membership layer (include/cadence/membership/) costs when
// nothing fails, and how fast it brings a joiner up to date: issue 36's two measures without a
// fault. ZeroMQ ranks as threads on 127.0.0.1, authenticated (a job secret; the transfer also
// open), each rank holding two communicators: a plain one and one under a membership::member.
//
//   all-reduce      per size, the plain communicator's all-reduce (f32 sum) against the same
//                   all-reduce on the member's quorum view inside member::transact() (the
//                   fault-tolerant one: its notices, its ring over point-to-point calls, the
//                   commit), in interleaved blocks; the median pair's bus bandwidths and
//                   ft_of_plain = plain time / fault-tolerant time.
//   state transfer  the last rank's member communicator closes (as after kill -9) and a new one in
//                   its slot joins (member::join): the survivors re-form, admit it at their next
//                   sync point and stream it the registered state; the joiner's received bytes
//                   over its state_receive_seconds, against a raw send/receive of the same bytes
//                   between two plain communicators of the same security (the link rate here):
//                   of_raw (ours_of_plain) = transfer rate / raw rate. Twice, on fresh
//                   communicators: authenticated and encrypted (row state_transfer), then open
//                   sockets, no CURVE (row transfer_open); key `security` says which. Each
//                   is --reps pairs (a raw send, then a leave and join, so both meet the same
//                   load), the pair of the median ratio reported, with the ratio's spread
//                   (of_plain_min, of_plain_max) over `transfers` pairs.
//
//   gloo            (built with cadence::gloo) the membership over ZeroMQ and the data over gloo
//                   (membership::quorum_group, membership/gloo/group.hpp): gloo_rebuild, the re-creation
//                   of a gloo communicator among the ranks as the group does it on a new quorum
//                   (the old one destroyed, a new one built under a fresh prefix through the
//                   job's TCP store), p50 and max over --rebuilds trials; gloo_allreduce rows, a
//                   plain gloo_communicator's all-reduce against the group's inside
//                   quorum_group::transact() (its vote on the view included).
//
//   cadence-bench-membership [--ranks 4] [--min-bytes 1048576] [--max-bytes 16777216] [--reps 5]
//                            [--state-bytes 67108864] [--rebuilds 20] [--json | --csv]
//
// Not part of the library.
#include "support/command_line.hpp"
#include "support/measure.hpp"
#include "support/report.hpp"
#include "support/backends.hpp"

#include <cadence/membership/member.hpp>
#include <cadence/transport/zmq/communicator.hpp>
#ifdef CADENCE_BENCH_WITH_GLOO
#include <cadence/membership/gloo/group.hpp>
#include <cadence/transport/gloo/communicator.hpp>
#include <cadence/transport/tcp_store.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace mb = cadence::membership;
using cadence::transport::dtype;
using cadence::transport::reduce_op;
using cadence::transport::zmq_communicator;
using cadence::transport::zmq_options;
using cadence::tools::usage_error;
using clock_type = std::chrono::steady_clock;

struct config : cadence_bench::common_config {
  std::size_t state_bytes = std::size_t{64} << 20;
  int rebuilds = 20;
  std::string gloo_store;  // the job's TCP store (gloo builds): set by run()
  cadence::transport::tcp_store_options gloo_store_options;
};

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

mb::member_options member_options() {
  mb::member_options o;
  o.timeouts = mb::timeouts::scaled(std::chrono::milliseconds(1000));  // heartbeat 1 s < op < quorum
  return o;
}

// A rank's ZeroMQ options: authenticated and encrypted (the job secret), or open sockets
// (wire_security::open, no CURVE) where `open`.
zmq_options rank_options(int rank, cadence_bench::thread_rendezvous& meet, bool open = false) {
  zmq_options o = cadence_bench::zmq_thread_options<zmq_options>(rank, meet);
  if (open) {
    o.secret = {};
    o.security = cadence::transport::wire_security::open;
  }
  return o;
}

zmq_options with_heartbeats(zmq_options o, const mb::member_options& m) {
  o.heartbeat_interval = m.timeouts.heartbeat_interval;
  o.heartbeat_timeout = m.timeouts.heartbeat_timeout;
  return o;
}

// One security's state transfers: the joiner's (raw send, transfer) pairs and rank 0's
// reconfigurations that admitted it, one per rep.
struct transfer_results {
  struct pair {
    double raw_seconds, receive_seconds, join_seconds;  // the raw send; the joiner's state_receive_seconds; its join()
  };
  std::vector<pair> pairs;
  std::vector<double> reconfiguration_seconds;
};

// What every rank measured; rank 0's are printed.
struct shared_results {
  std::mutex m;
  std::vector<cadence_bench::row> rows;
  transfer_results transfers[2];  // authenticated, open
  std::vector<double> rebuild_seconds;  // rank 0's, one per gloo re-creation
};

// A barrier of the ranks (threads) that also returns the mean of one value per rank.
class line_up {
public:
  explicit line_up(int n) : n_(n), b_(n) {}
  double mean(double v) { return b_.arrive_and_sum(v) / n_; }
  void operator()() { b_.arrive_and_sum(0); }
  // Rank `rank` failed with `why`: the others stop at their next meeting point, naming it.
  void abandon(int rank, const std::string& why) { b_.abandon("rank " + std::to_string(rank) + " failed: " + why); }

private:
  int n_;
  cadence_bench::summing_barrier b_;
};

// One all-reduce size: `reps` interleaved (plain, fault-tolerant) blocks of `iters` calls each;
// the median pair of per-call times (seconds, the mean over the ranks).
std::pair<double, double> time_allreduce(zmq_communicator& plain, mb::member<zmq_communicator>& m, line_up& sync,
                                         std::vector<float>& buf, int reps, int iters) {
  std::vector<std::pair<double, double>> pairs;
  for (int rep = 0; rep < reps; ++rep) {
    const cadence::transport::deadline d(std::chrono::seconds(120));
    sync();
    auto t0 = clock_type::now();
    for (int i = 0; i < iters; ++i) plain.allreduce(buf.data(), buf.size(), dtype::f32, reduce_op::sum, d);
    const double plain_s = sync.mean(seconds_since(t0));
    t0 = clock_type::now();
    for (int i = 0; i < iters; ++i)
      m.transact([&] { m.view().allreduce(buf.data(), buf.size(), dtype::f32, reduce_op::sum, d); });
    const double ft_s = sync.mean(seconds_since(t0));
    pairs.emplace_back(plain_s / iters, ft_s / iters);
  }
  return cadence_bench::median_pair(pairs);
}

cadence_bench::row make_row(const char* op, std::size_t bytes, double plain_s, double ours_s, double plain_gbps,
                            double ours_gbps) {
  cadence_bench::row r;
  r["op"] = op;
  r["bytes"] = bytes;
  r["plain_us"] = plain_s * 1e6;
  r["ours_us"] = ours_s * 1e6;
  r["plain_GBps"] = plain_gbps;
  r["ours_GBps"] = ours_gbps;
  r["ours_of_plain"] = ours_gbps / plain_gbps;
  return r;
}

#ifdef CADENCE_BENCH_WITH_GLOO
using cadence::transport::gloo_communicator;

cadence::transport::gloo_options gloo_opts(const config& cfg) {
  cadence::transport::gloo_options o;
  o.rendezvous = cfg.gloo_store;
  o.store = cfg.gloo_store_options;
  o.serve_rendezvous = false;
  return o;
}

// The gloo rows: the re-creation time (rank 0's, from a common start to its new communicator
// built, the old one destroyed first as quorum_group does), then the all-reduce of a plain gloo
// communicator against the quorum_group's inside its transact(), interleaved as time_allreduce.
void gloo_rows(int rank, const config& cfg, mb::member<zmq_communicator>& m, line_up& sync, shared_results& out) {
  const int n = cfg.ranks;
  const auto make = mb::gloo_group_factory(gloo_opts(cfg));
  std::unique_ptr<gloo_communicator> old;
  for (int i = 0; i <= cfg.rebuilds; ++i) {
    mb::group_spec s;
    for (int r = 0; r < n; ++r) s.ranks.push_back(r);
    s.rank = rank;
    s.size = n;
    s.prefix = "bench-rebuild-" + std::to_string(i);
    s.until = std::chrono::seconds(60);
    sync();
    const auto t0 = clock_type::now();
    old.reset();
    old = make(s);
    const double took = seconds_since(t0);
    if (rank == 0 && i > 0) out.rebuild_seconds.push_back(took);  // the first has no old one to close
  }
  old.reset();
  auto plain = make({0, [&] {
                       std::vector<int> v;
                       for (int r = 0; r < n; ++r) v.push_back(r);
                       return v;
                     }(),
                     rank, n, "bench-plain", std::chrono::seconds(60)});
  auto group = mb::make_gloo_group(m, gloo_opts(cfg), "bench-data");
  for (const std::size_t bytes : cadence_bench::sizes(cfg.min_bytes, cfg.max_bytes, 4)) {
    std::vector<float> buf(bytes / sizeof(float), 1.0f);
    const int iters = cadence_bench::iterations_for(bytes, std::size_t{64} << 20, 20);
    std::vector<std::pair<double, double>> pairs;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      const cadence::transport::deadline d(std::chrono::seconds(120));
      sync();
      auto t0 = clock_type::now();
      for (int i = 0; i < iters; ++i) plain->allreduce(buf.data(), buf.size(), dtype::f32, reduce_op::sum, d);
      const double plain_s = sync.mean(seconds_since(t0));
      t0 = clock_type::now();
      for (int i = 0; i < iters; ++i)
        group->transact([&] { group->allreduce(buf.data(), buf.size(), dtype::f32, reduce_op::sum, d); });
      const double ft_s = sync.mean(seconds_since(t0));
      pairs.emplace_back(plain_s / iters, ft_s / iters);
    }
    const auto [plain_s, ft_s] = cadence_bench::median_pair(pairs);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(out.m);
      out.rows.push_back(make_row("gloo_allreduce", bytes, plain_s, ft_s,
                                  cadence_bench::allreduce_busbw(bytes, n, plain_s * 1e6),
                                  cadence_bench::allreduce_busbw(bytes, n, ft_s * 1e6)));
    }
  }
  if (group->stats().builds != 1)
    throw std::runtime_error("the gloo group was built " + std::to_string(group->stats().builds) +
                             " times without a fault: " + group->stats().last_error);
  sync();  // every rank is done with gloo before any closes its communicators
}
#endif

// The raw link and the state transfer on communicators of one security (open or
// authenticated), made for them and closed after: `reps` pairs, each a raw send then a
// transfer, so both meet the same load. The raw link: the state's bytes from rank 0 to the
// joiner's rank on plain communicators (the membership's donor is the lowest member), timed at
// the receiver. The transfer: the joiner's member and its communicator close (its peers see it
// lost at once) and a new one in its slot joins; the survivors sync until they have lost the
// joiner's rank and taken it back.
void transfer_pairs(int rank, const config& cfg, bool open, cadence_bench::thread_rendezvous& meet_plain,
                    cadence_bench::thread_rendezvous& meet_member, line_up& sync, transfer_results& out,
                    std::mutex& out_m) {
  const int n = cfg.ranks;
  const int joiner = n - 1;
  const mb::member_options mo = member_options();
  zmq_communicator plain(rank, n, rank_options(rank, meet_plain, open), std::chrono::seconds(120));
  std::vector<float> state(cfg.state_bytes / sizeof(float), 1.0f);
  auto comm = std::make_unique<zmq_communicator>(rank, n, with_heartbeats(rank_options(rank, meet_member, open), mo),
                                                 std::chrono::seconds(120));
  auto m = std::make_unique<mb::member<zmq_communicator>>(*comm, mo);
  m->add_state(mb::buffer(state));
  m->start();
  // One untimed send first: the first pair does not pay for the plain connection's set-up.
  if (rank == 0) plain.send(state.data(), cfg.state_bytes, joiner, 7, std::chrono::seconds(120));
  if (rank == joiner) plain.recv(state.data(), cfg.state_bytes, 0, 7, std::chrono::seconds(120));
  for (int rep = 0; rep < cfg.reps; ++rep) {
    sync();
    const auto t0 = clock_type::now();
    if (rank == 0) plain.send(state.data(), cfg.state_bytes, joiner, 7, std::chrono::seconds(120));
    if (rank == joiner) plain.recv(state.data(), cfg.state_bytes, 0, 7, std::chrono::seconds(120));
    const double raw_s = sync.mean(rank == joiner ? seconds_since(t0) * n : 0.0);
    // Every member syncs (counting its members) until a committed sync had all n: the survivors
    // from here (losing the joiner's old process, admitting the new one), the joiner once it
    // joined. They leave together, after the same sync: a member that stopped syncing while
    // another still counted on it would stall that one's syncs.
    auto sync_until_full = [&] {
      std::vector<float> count(1);
      do {
        m->transact([&] {
          count[0] = 1.0f;
          m->view().allreduce(count.data(), count.size(), dtype::f32, reduce_op::sum);
        });
      } while (count[0] != static_cast<float>(n));
    };
    if (rank != joiner) {
      sync_until_full();
      if (rank == 0) out.reconfiguration_seconds.push_back(m->stats().last_reconfiguration_seconds);
    } else {
      m.reset();
      comm.reset();
      zmq_options o = with_heartbeats(rank_options(rank, meet_member, open), mo);
      o.wait_for = cadence::transport::zmq_wait_for::self;  // a running world
      comm = std::make_unique<zmq_communicator>(rank, n, o, std::chrono::seconds(120));
      m = std::make_unique<mb::member<zmq_communicator>>(*comm, mo);
      std::fill(state.begin(), state.end(), 0.0f);
      m->add_state(mb::buffer(state));
      const auto j0 = clock_type::now();
      m->join();
      const double join_s = seconds_since(j0);
      const mb::member_stats st = m->stats();
      if (st.state_received_bytes != cfg.state_bytes || state.front() != 1.0f || state.back() != 1.0f)
        throw std::runtime_error("the joiner's state is not the members' after join() (transfer " +
                                 std::to_string(rep + 1) + (open ? ", open" : ", authenticated") + ")");
      {
        std::lock_guard<std::mutex> lock(out_m);
        out.pairs.push_back({raw_s, st.state_receive_seconds, join_s});
      }
      sync_until_full();
    }
    sync();  // the joiner has its state
  }
  sync();  // every member is done before any closes
}

// The communicators' meeting points: the all-reduce rows', then each security's transfers'.
struct meeting_points {
  cadence_bench::thread_rendezvous plain, member, transfer_plain[2], transfer_member[2];
};

// Rank `rank` of the job: the all-reduce rows, then the raw link and the state transfer (the
// last rank leaves and joins again), authenticated and then open.
void run_rank(int rank, const config& cfg, meeting_points& meet, line_up& sync, shared_results& out) {
  const int n = cfg.ranks;
  const mb::member_options mo = member_options();
  zmq_communicator plain(rank, n, rank_options(rank, meet.plain), std::chrono::seconds(120));
  {
    std::vector<float> state(cfg.state_bytes / sizeof(float), 1.0f);
    zmq_communicator comm(rank, n, with_heartbeats(rank_options(rank, meet.member), mo), std::chrono::seconds(120));
    mb::member<zmq_communicator> m(comm, mo);
    m.add_state(mb::buffer(state));
    m.start();
    for (const std::size_t bytes : cadence_bench::sizes(cfg.min_bytes, cfg.max_bytes, 4)) {
      std::vector<float> buf(bytes / sizeof(float), 1.0f);
      const int iters = cadence_bench::iterations_for(bytes, std::size_t{64} << 20, 20);
      const auto [plain_s, ft_s] = time_allreduce(plain, m, sync, buf, cfg.reps, iters);
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(out.m);
        out.rows.push_back(make_row("allreduce", bytes, plain_s, ft_s, cadence_bench::allreduce_busbw(bytes, n, plain_s * 1e6),
                                    cadence_bench::allreduce_busbw(bytes, n, ft_s * 1e6)));
      }
    }
#ifdef CADENCE_BENCH_WITH_GLOO
    gloo_rows(rank, cfg, m, sync, out);
#endif
    sync();  // every rank is done with its member before any closes it
  }
  for (const bool open : {false, true})
    transfer_pairs(rank, cfg, open, meet.transfer_plain[open], meet.transfer_member[open], sync, out.transfers[open], out.m);
}

int run(int argc, char** argv) {
  config cfg;
  cfg.ranks = 4;
  cfg.min_bytes = std::size_t{1} << 20;
  cfg.max_bytes = std::size_t{16} << 20;
  cadence::tools::command_line cli(
      "usage: cadence-bench-membership [--ranks N] [--min-bytes B] [--max-bytes B] [--reps R]\n"
      "         [--state-bytes S] [--rebuilds K] [--json | --csv]\n",
      "", 17);
  cadence_bench::add_common_flags(
      cli, cfg,
      {{"--ranks", "ZeroMQ ranks as threads on 127.0.0.1 (default 4, at least 2)"},
       {"--min-bytes", "smallest all-reduce (default 1 MiB; sizes go x4 up to --max-bytes)"},
       {"--max-bytes", "largest all-reduce (default 16 MiB)"},
       {"--reps", "plain/fault-tolerant pairs per size, median reported; raw sends (default 5)"},
       {"--json", "one JSON array, an object per row"},
       {"--csv", "a header row and a line per row, the JSON's keys as columns"}});
  cli.add_option("--state-bytes", cfg.state_bytes, "the registered state a joiner receives (default 64 MiB)")
      ->option_text("S")
      ->check(cadence::tools::integer<std::size_t>(4, SIZE_MAX));
  cli.add_option("--rebuilds", cfg.rebuilds,
                 "gloo re-creations timed, p50 and max reported (default 20; builds with gloo only)")
      ->option_text("K")
      ->check(cadence::tools::integer<int>(1, 100000));
  if (!cadence_bench::read_flags(cli, cfg, argc, argv)) return 0;
  if (cfg.ranks < 2) throw usage_error("--ranks: at least 2 (one leaves and joins again), got " + std::to_string(cfg.ranks));
  if (cfg.min_bytes % sizeof(float) != 0 || cfg.max_bytes % sizeof(float) != 0 || cfg.max_bytes < cfg.min_bytes)
    throw usage_error("--min-bytes, --max-bytes: multiples of 4 with min <= max, got " + std::to_string(cfg.min_bytes) +
                      " and " + std::to_string(cfg.max_bytes));
  if (cfg.state_bytes % sizeof(float) != 0)
    throw usage_error("--state-bytes: a multiple of 4, got " + std::to_string(cfg.state_bytes));
#ifdef CADENCE_BENCH_WITH_GLOO
  // The job's rendezvous for gloo: a store that outlives every communicator (as a launcher's).
  cfg.gloo_store_options.secret = cadence::transport::job_secret::generate();
  cadence::transport::tcp_store_server gloo_store("127.0.0.1:0", cfg.gloo_store_options);
  cfg.gloo_store = gloo_store.address();
#endif
  meeting_points meet;
  line_up sync(cfg.ranks);
  shared_results out;
  cadence_bench::run_ranks_as_threads(cfg.ranks, [&](int r) {
    try {
      run_rank(r, cfg, meet, sync, out);
    } catch (const std::exception& e) {
      sync.abandon(r, e.what());  // the others would wait for it at the next meeting point
      throw;
    }
  });
  // The transfer rows, one per security: the (raw send, transfer) pair of the median ratio (one
  // noisy pair does not decide), with the spread of the ratio over the pairs.
  using transfer_pair = transfer_results::pair;
  auto of_raw = [](const transfer_pair& x) { return x.raw_seconds / x.receive_seconds; };
  std::vector<transfer_pair> sorted[2];
  for (const bool open : {false, true}) {
    std::vector<transfer_pair>& pairs = sorted[open];
    pairs = out.transfers[open].pairs;
    std::sort(pairs.begin(), pairs.end(), [&](const auto& a, const auto& b) { return of_raw(a) < of_raw(b); });
    const transfer_pair& mid = pairs[pairs.size() / 2];
    const double bytes = static_cast<double>(cfg.state_bytes);
    cadence_bench::row r = make_row(open ? "transfer_open" : "state_transfer", cfg.state_bytes, mid.raw_seconds,
                                    mid.receive_seconds, bytes / mid.raw_seconds / 1e9, bytes / mid.receive_seconds / 1e9);
    r["security"] = open ? "open" : "authenticated";  // of the transfer and its raw send alike
    r["transfers"] = pairs.size();
    r["of_plain_min"] = of_raw(pairs.front());
    r["of_plain_max"] = of_raw(pairs.back());
    out.rows.push_back(r);
  }
  cadence_bench::table t;
  t.title = "membership over ZeroMQ, " + std::to_string(cfg.ranks) +
            " ranks as threads on 127.0.0.1: all-reduce bus bandwidth, plain against fault-tolerant "
            "(member::transact on the quorum view); state transfer to a joiner against a raw send";
  t.columns = {cadence_bench::text_column("op", -15, "op"), cadence_bench::text_column("bytes", 10, "bytes"),
               cadence_bench::number_column("plain us", 11, "plain_us", "%.1f"),
               cadence_bench::number_column("ours us", 11, "ours_us", "%.1f"),
               cadence_bench::number_column("plain GB/s", 11, "plain_GBps", "%.3f"),
               cadence_bench::number_column("ours GB/s", 10, "ours_GBps", "%.3f"),
               cadence_bench::number_column("ours/plain", 11, "ours_of_plain", "%.2f")};
  std::vector<cadence_bench::row> rows = out.rows;
  std::vector<double> rebuilds = out.rebuild_seconds;
  std::sort(rebuilds.begin(), rebuilds.end());
  const double rebuild_p50 = rebuilds.empty() ? 0 : rebuilds[rebuilds.size() / 2];
  const double rebuild_max = rebuilds.empty() ? 0 : rebuilds.back();
  if (!rebuilds.empty() && (cfg.json || cfg.csv)) {
    // Its own keys (the table prints it as a line below instead).
    cadence_bench::row r;
    r["op"] = "gloo_rebuild";
    r["ranks"] = cfg.ranks;
    r["trials"] = rebuilds.size();
    r["p50_ms"] = rebuild_p50 * 1e3;
    r["max_ms"] = rebuild_max * 1e3;
    rows.push_back(r);
  }
  cadence_bench::print(rows, cfg, t);
  if (!cfg.json && !cfg.csv && !rebuilds.empty())
    std::printf("gloo re-creation among %d ranks (the old communicator closed, a new one built through the TCP "
                "store): p50 %.1f ms, max %.1f ms over %zu trials\n",
                cfg.ranks, rebuild_p50 * 1e3, rebuild_max * 1e3, rebuilds.size());
  if (!cfg.json && !cfg.csv) {
    const transfer_pair& mid = sorted[0][sorted[0].size() / 2];
    std::vector<double> reconfigurations = out.transfers[0].reconfiguration_seconds;
    std::sort(reconfigurations.begin(), reconfigurations.end());
    std::printf("joiner: join() took %.1f ms (request to state in place), %llu state bytes received; rank 0's "
                "reconfiguration that admitted it took %.1f ms\n",
                mid.join_seconds * 1e3, static_cast<unsigned long long>(cfg.state_bytes),
                reconfigurations[reconfigurations.size() / 2] * 1e3);
    for (const bool open : {false, true})
      std::printf("%s: %zu (raw send, transfer) pairs on %s sockets, the median pair above; ours/plain from %.2f to "
                  "%.2f\n",
                  open ? "transfer_open" : "state_transfer", sorted[open].size(),
                  open ? "open" : "authenticated", of_raw(sorted[open].front()), of_raw(sorted[open].back()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return cadence::tools::guarded_main("cadence-bench-membership", run, argc, argv); }
