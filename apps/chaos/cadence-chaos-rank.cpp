// cadence-chaos-rank: one rank of a collective job that survives faults, for the chaos soak
// (chaos_soak.py, docs/collective.md "Chaos soak"). A process over ZeroMQ on a membership member
// and its quorum view averages its parameters (periodic_averager every --period local steps, or
// the bucketed all-reducer's gradients every step with --mode bsp) inside transact(), and
// prints one JSON line per event on stdout, flushed, for the soak to check: start, every
// committed sync (step, quorum, state hash), every reconfiguration, the first commit after a
// loss (the member's time from detecting it), the state received, done. --join makes it a
// restarted or late process that joins the running job; --holder makes rank 0 hold only the
// rendezvous (the members are ranks 1..N-1); --rejoin N brings a process the quorum dropped
// while it lived back as a new incarnation in its slot, up to N times (the library's
// membership::rejoining_member, which runs every sync here). An application, not part of the
// library.
#include <cadence/exchange/bucketed_allreducer.hpp>
#include <cadence/exchange/periodic_averager.hpp>
#include <cadence/membership/member.hpp>
#include <cadence/membership/rejoin.hpp>
#include <cadence/membership/zmq/rendezvous.hpp>
#include <cadence/transport/zmq/communicator.hpp>

#include "flags.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace mb = cadence::membership;
namespace tr = cadence::transport;
using cadence::tools::usage_error;
using json = nlohmann::json;
using zmq_member = mb::member<tr::zmq_communicator>;
using view_t = mb::quorum_view<tr::zmq_communicator>;

struct options {
  int rank = -1, size = 0;
  std::string rendezvous, rendezvous_file, secret_file, hold_file, address = "127.0.0.1", mode = "periodic";
  bool join = false, insecure = false, holder = false;
  double mib = 4;
  std::size_t period = 2;
  std::uint64_t syncs = 100;
  int step_ms = 2, heartbeat_ms = 1000, join_timeout_ms = 30000, connect_timeout_ms = 30000;
  int rejoin = 0;
};

const char* const usage =
    "usage: cadence-chaos-rank --rank R --size N (--rendezvous tcp://H:P | --rendezvous-file F) [options]\n";

options parse(int argc, char** argv, std::string& help) {
  using namespace cadence::tools;
  options o;
  command_line cli(usage,
                   "One rank of a fault-tolerant collective job over ZeroMQ (the chaos soak's process):\n"
                   "averages its parameters on a membership quorum and prints one JSON line per\n"
                   "event on stdout. Exit status: 0 done, 3 evicted or no quorum left (a faulted\n"
                   "rank's fate), 2 bad command line, 1 any other error.",
                   24);
  cli.add_option("--rank", o.rank, "this process's rank (its slot)")->option_text("R")->check(integer<int>(0, 1 << 16));
  cli.add_option("--size", o.size, "ranks in the job (slots)")->option_text("N")->check(integer<int>(1, 1 << 16));
  cli.add_option("--rendezvous", o.rendezvous,
                 "rank 0 binds this ZeroMQ address (port 0: any), the others register there")
      ->option_text("tcp://H:P");
  cli.add_option("--rendezvous-file", o.rendezvous_file,
                 "rank 0 writes the address it bound here; the others wait for the file\n"
                 "(with --rendezvous on rank 0: binds that, then writes it)")
      ->option_text("F");
  cli.add_option("--address", o.address, "the address this process binds its endpoint on (default 127.0.0.1)")
      ->option_text("A");
  cli.add_option("--secret-file", o.secret_file,
                 "the job secret, a key file (mode 600) holding its hex (default:\n$CADENCE_JOB_SECRET)")
      ->option_text("F");
  cli.add_flag("--insecure", o.insecure, "no job secret: nothing authenticated or encrypted (loopback only)");
  cli.add_flag("--join", o.join,
               "a restarted or late process: joins the running job (not rank 0: it holds the\n"
               "rendezvous, which a new process cannot take over)");
  cli.add_flag("--holder", o.holder,
               "rank 0 only holds the rendezvous (membership::hold_rendezvous) and is in no\n"
               "quorum; the members are ranks 1..N-1, any of which may be restarted (every\n"
               "process of the job is given it)");
  cli.add_option("--rejoin", o.rejoin,
                 "dropped by the quorum while alive (evicted, or no quorum on its side), come\n"
                 "back: a new communicator in this slot that joins and receives the state, at\n"
                 "most N attempts (default 0: stop, exit 3). Not on rank 0 without --holder:\n"
                 "it hosts the rendezvous, which a new communicator cannot take over")
      ->option_text("N")
      ->check(integer<int>(0, 1000));
  cli.add_option("--mode", o.mode, "periodic (default: periodic_averager, retried on a fault) or bsp\n"
                                   "(bucketed_allreducer every step, a failed step discarded)")
      ->option_text("M")
      ->check(one_of({"periodic", "bsp"}));
  cli.add_option("--mib", o.mib, "MiB of parameters (default 4)")->option_text("X")->check(positive(4096));
  cli.add_option("--period", o.period, "periodic: local steps between syncs (default 2)")
      ->option_text("K")
      ->check(integer<std::size_t>(1, 1000000));
  cli.add_option("--syncs", o.syncs, "stop once the job has committed this many syncs (default 100)")
      ->option_text("N")
      ->check(integer<std::uint64_t>(1, std::uint64_t{1} << 40));
  cli.add_option("--hold-file", o.hold_file,
                 "go on past --syncs while this file exists (the soak removes it once every\n"
                 "fault is absorbed, so the job cannot end under a joiner); the members decide\n"
                 "together in each sync, so all stop after the same one")
      ->option_text("F");
  // The durations: whole milliseconds in [min, max].
  const auto milliseconds = [&cli](const char* name, int& value, int min, int max, const char* description) {
    cli.add_option(name, value, description)->option_text("MS")->check(integer<int>(min, max));
  };
  milliseconds("--step-ms", o.step_ms, 0, 60000, "milliseconds a local step sleeps (its compute; default 2)");
  milliseconds("--heartbeat-ms", o.heartbeat_ms, 10, 600000,
               "the heartbeat timeout; op = 4x, quorum = 8x (membership::timeouts::scaled;\ndefault 1000)");
  milliseconds("--join-timeout-ms", o.join_timeout_ms, 1, 3600000, "--join: the wait to be admitted (default 30000)");
  milliseconds("--connect-timeout-ms", o.connect_timeout_ms, 1, 3600000,
               "the wait for the rendezvous file and the communicator's construction\n(default 30000)");
  cli.at_most_one_of({"--secret-file", "--insecure"});
  if (!cli.read(argc, argv)) {
    help = cli.help();
    return o;
  }
  if (o.rank < 0 || o.size == 0) throw usage_error("needs --rank and --size (see --help)");
  if (o.rank >= o.size)
    throw usage_error("--rank " + std::to_string(o.rank) + " is out of range for --size " + std::to_string(o.size) +
                      " (ranks 0.." + std::to_string(o.size - 1) + ")");
  if (o.rendezvous.empty() && o.rendezvous_file.empty()) throw usage_error("needs --rendezvous or --rendezvous-file");
  if (o.rank == 0 && o.rendezvous.empty()) o.rendezvous = "tcp://" + o.address + ":0";
  if (o.join && o.rank == 0)
    throw usage_error("--join: rank 0 cannot rejoin: it holds the job's rendezvous, and a new process cannot take "
                      "it over (the others registered with the old one; docs/transports.md, ZeroMQ)");
  if (o.holder && o.size < 2) throw usage_error("--holder needs --size 2 or more (rank 0 and a member)");
  return o;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One JSON object per line, flushed: the soak reads them as they come.
void emit(json j) {
  j["t"] = now_seconds();
  const std::string line = j.dump();
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The rendezvous address a rank other than 0 registers at: --rendezvous, or the first line of
// --rendezvous-file once rank 0 has written it (it renames a finished file into place).
std::string rendezvous_of(const options& o) {
  if (!o.rendezvous.empty()) return o.rendezvous;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.connect_timeout_ms);
  for (;;) {
    std::ifstream in(o.rendezvous_file);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    if (std::chrono::steady_clock::now() >= until)
      throw cadence::error("--rendezvous-file " + o.rendezvous_file + ": no address written there within " +
                           std::to_string(o.connect_timeout_ms) + " ms (is rank 0 running?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void publish(const std::string& file, const std::string& address) {
  const std::string tmp = file + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << address << '\n';
    if (!out) throw cadence::error("--rendezvous-file " + file + ": cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0)
    throw cadence::error("--rendezvous-file " + file + ": cannot rename " + tmp + " into place");
}

tr::job_secret secret_of(const options& o) {
  if (!o.secret_file.empty()) return tr::job_secret::from_file(o.secret_file);
  tr::job_secret s = tr::job_secret::from_environment();
  if (s.empty())
    throw usage_error("no job secret: set $CADENCE_JOB_SECRET (hex), give --secret-file, or --insecure on loopback");
  return s;
}

json ranks_of(const mb::quorum& q) { return json(q.ranks); }

// --holder on rank 0: holds the rendezvous until every member has gone for a heartbeat timeout,
// with a line per registration and loss, and a done line with the counts.
int hold(const options& o, tr::zmq_communicator& comm) {
  emit({{"event", "start"}, {"rank", 0}, {"pid", static_cast<long>(::getpid())}, {"holder", true}});
  mb::rendezvous_options ro;
  ro.exit_when_empty = std::chrono::milliseconds(o.heartbeat_ms);
  ro.on_event = [](const std::string& line) { emit({{"event", "rendezvous"}, {"rank", 0}, {"line", line}}); };
  const mb::rendezvous_report r = mb::hold_rendezvous(comm, [] { return false; }, ro);
  emit({{"event", "done"}, {"rank", 0}, {"holder", true}, {"registrations", r.registrations}, {"losses", r.losses},
        {"seconds", r.seconds}});
  return 0;
}

// The state that outlives a member: every incarnation registers the same blocks, and a rejoin's
// join() overwrites them with a donor's.
struct replica {
  std::vector<double> params, grads;
  // --hold-file: whether the job goes on past --syncs, agreed in every sync (the maximum over
  // the members of "the file exists"), so every member stops after the same sync. Part of the
  // state, so a newcomer admitted at a sync knows it; written only once the sync's all-reduce
  // of it has completed here (a failed attempt leaves the last agreed value).
  std::vector<double> hold;
  std::uint64_t local = 0;  // local steps so far (the step's increment depends on it)
};

// What one incarnation's member has reported, kept for the lines below: made anew with each
// incarnation, as its member's counts start afresh.
struct life_log {
  std::optional<double> detected_at;  // a loss was seen: when (the reconfiguration's start)
  std::vector<int> lost_pending;
  mb::member_stats last;
};

// The communicator of an incarnation in this rank's slot: `attempt` 0 for the first life; a
// rejoin attempt waits at most a quorum timeout to connect (and the helper as long to be admitted).
std::unique_ptr<tr::zmq_communicator> connect(const options& o, const tr::job_secret& secret, const mb::timeouts& t,
                                              int attempt) {
  auto connect_timeout = std::chrono::milliseconds(o.connect_timeout_ms);
  if (attempt > 0) connect_timeout = std::min(connect_timeout, t.quorum);
  tr::zmq_options zo;
  if (o.insecure) {
    zo.security = tr::wire_security::open;
  } else {
    zo.secret = secret;
  }
  zo.heartbeat_interval = t.heartbeat_interval;
  zo.heartbeat_timeout = t.heartbeat_timeout;
  zo.endpoint = "tcp://" + o.address + ":0";
  // Every process may be a late one (a slot still absent waits: a late joiner's, or the first
  // quorum's, which the quorum timeout bounds), so construction waits for this rank alone.
  zo.wait_for = tr::zmq_wait_for::self;
  if (o.rank == 0) {
    zo.rendezvous = o.rendezvous;
    if (!o.rendezvous_file.empty()) zo.on_rendezvous_bound = [&o](const std::string& a) { publish(o.rendezvous_file, a); };
  } else {
    options read = o;  // a rejoin reads the file again (the same address while rank 0 lives)
    read.connect_timeout_ms = static_cast<int>(connect_timeout.count());
    zo.rendezvous = rendezvous_of(read);
  }
  return std::make_unique<tr::zmq_communicator>(o.rank, o.size, zo, tr::deadline(connect_timeout));
}

// The rank's lives, on membership::rejoining_member (include/cadence/membership/rejoin.hpp): the
// first incarnation starts (or, --join, joins); with --rejoin N, one the quorum drops while it
// syncs (evicted_error or quorum_error) is followed by new ones in the same slot that join, at
// most N attempts in all (a failed connection or join counts as one, followed by the next a
// heartbeat interval later). A drop in the closing sync ends the process: the job's end is agreed.
int run(const options& o) {
  tr::job_secret secret;
  if (!o.insecure) secret = secret_of(o);
  mb::member_options mo;
  mo.timeouts = mb::timeouts::scaled(std::chrono::milliseconds(o.heartbeat_ms));
  mo.join_timeout = std::chrono::milliseconds(o.join_timeout_ms);
  if (o.holder && o.rank == 0) {
    const std::unique_ptr<tr::zmq_communicator> comm = connect(o, secret, mo.timeouts, 0);
    return hold(o, *comm);
  }
  if (o.holder) mo.eligible = mb::members_besides_rendezvous(o.size);
  const auto elements = static_cast<std::size_t>(o.mib * 1024 * 1024 / sizeof(double));
  replica st{std::vector<double>(elements, 1.0), std::vector<double>(elements, 0.0),
             std::vector<double>(1, o.hold_file.empty() ? 0.0 : 1.0), 0};
  std::vector<double>& params = st.params;
  std::vector<double>& grads = st.grads;
  std::vector<double>& hold = st.hold;

  mb::rejoin_options ro;
  // Rank 0 without --holder hosts the rendezvous: a new communicator cannot take it over, so
  // its drop ends it as without --rejoin.
  ro.may_rejoin = !(o.rank == 0 && !o.holder);
  ro.max_attempts = ro.may_rejoin ? o.rejoin : 0;
  ro.on_rejoin = [&o](const mb::rejoin_attempt& a) {
    emit({{"event", "rejoin"}, {"rank", o.rank}, {"attempt", a.attempt}, {"reason", mb::drop_reason_name(a.reason)},
          {"seconds", a.seconds}, {"message", a.message}});
  };
  std::unique_ptr<life_log> log;  // the current incarnation's
  mb::rejoining_member<tr::zmq_communicator> h(
      [&](int attempt) { return connect(o, secret, mo.timeouts, attempt); }, mo,
      [&](zmq_member& m) {
        m.add_state(params);
        if (!o.hold_file.empty()) m.add_state(hold);
        log = std::make_unique<life_log>();
        log->last = m.stats();
        m.on_change([&o, &m, lg = log.get()](const mb::change& c) {
          const mb::member_stats s = m.stats();
          const double t = now_seconds();
          emit({{"event", "reconfig"}, {"rank", o.rank}, {"quorum", c.after.id}, {"before", ranks_of(c.before)},
                {"members", ranks_of(c.after)}, {"lost", c.lost}, {"admitted", c.admitted}, {"healed", c.healed},
                {"step", c.committed}, {"seconds", s.last_reconfiguration_seconds}});
          if (!c.lost.empty() && c.before.id != 0) {  // not the first quorum's absentees
            if (!lg->detected_at) lg->detected_at = t - s.last_reconfiguration_seconds;
            lg->lost_pending.insert(lg->lost_pending.end(), c.lost.begin(), c.lost.end());
          }
          if (s.state_received_bytes > lg->last.state_received_bytes)
            emit({{"event", "state"}, {"rank", o.rank}, {"bytes", s.state_received_bytes - lg->last.state_received_bytes},
                  {"seconds", s.state_receive_seconds - lg->last.state_receive_seconds}, {"step", c.committed}});
          lg->last = s;
        });
      },
      ro);

  // The start line of an incarnation once it is in: which rejoin attempt admitted it, and the
  // time from the drop, when it rejoined.
  const auto started = [&](bool join, const mb::rejoin_report* again) {
    const zmq_member& m = h.incarnation();
    json start = {{"event", "start"},
                  {"rank", o.rank},
                  {"pid", static_cast<long>(::getpid())},
                  {"join", join},
                  {"quorum", m.current().id},
                  {"members", ranks_of(m.current())},
                  {"step", m.committed()},
                  {"state_bytes", params.size() * sizeof(double)},
                  {"mode", o.mode}};
    if (again) {
      start["rejoin"] = h.attempts();
      start["rejoin_seconds"] = again->rejoin_seconds;
    }
    emit(start);
  };
  if (o.join)
    h.join();
  else
    h.start();
  started(o.join, nullptr);

  // The adapters run on one incarnation's view: made again after a rejoin.
  std::optional<cadence::exchange::periodic_averager<view_t>> avg;
  std::optional<cadence::exchange::bucketed_allreducer<view_t>> reducer;
  const auto adapters = [&] {
    reducer.reset();
    avg.emplace(h.view(), o.mode == "periodic" ? o.period : 1);
    if (o.mode == "bsp") {
      reducer.emplace(h.view());
      reducer->add(grads.data(), grads.size());
    }
  };
  adapters();
  const auto agree_on_hold = [&] {
    if (o.hold_file.empty()) return;
    double h0 = ::access(o.hold_file.c_str(), F_OK) == 0 ? 1.0 : 0.0;
    h.view().allreduce(&h0, 1, cadence::transport::dtype::f64, cadence::transport::reduce_op::max);
    hold[0] = h0;
  };
  const auto step = [&] {  // deterministic per rank and local step: sparse, cheap, distinct
    ++st.local;
    const double d = 0.01 * (o.rank + 1) + 0.001 * static_cast<double>(st.local % 7);
    if (o.mode == "periodic")
      for (std::size_t i = 0; i < params.size(); i += 97) params[i] += d;
    else
      for (std::size_t i = 0; i < grads.size(); i += 97) grads[i] = d;
    if (o.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
  };

  while (h.incarnation().committed() < o.syncs || hold[0] != 0.0) {
    mb::rejoin_report r;
    if (o.mode == "periodic") {
      step();
      if (!avg->step_done()) continue;
      r = h.transact(
          [&] {
            // Before the average: a retry calls sync() again, which a sync that completed here
            // (and a later collective failed) would refuse as not due.
            agree_on_hold();
            avg->sync({cadence::exchange::tensor_ref(params.data(), params.size())});
          },
          {params});
      if (!r.rejoined && r.outcome != mb::outcome::committed) avg->restart_period();
    } else {
      step();
      // The optimizer step inside the sync's body: a newcomer admitted when this sync commits
      // receives the state as the body left it (before transact() returns), so an update
      // applied after transact() would be missing from its copy (one step behind for good).
      r = h.transact(
          [&] {
            reducer->average();
            // After the average (the sync is then committed wherever this completes, and healed
            // from there elsewhere), before the update (a discarded attempt leaves params as they were).
            agree_on_hold();
            for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.5 * grads[i];
          },
          {grads}, mb::on_loss::discard);
    }
    if (r.rejoined) {  // a new incarnation holds the quorum's state: its start line, new adapters
      started(true, &r);
      adapters();
      continue;
    }
    const zmq_member& m = h.incarnation();
    if (r.outcome == mb::outcome::discarded) {
      emit({{"event", "discarded"}, {"rank", o.rank}, {"step", m.committed()}, {"quorum", m.current().id},
            {"attempts", r.attempts}});
      continue;
    }
    // A committed sync's state is the same on every member that committed it (the soak compares
    // the hashes per step); a healed member holds a donor's state as it stood at the donor's
    // next sync point, so its hash is reported apart.
    emit({{"event", r.outcome == mb::outcome::committed ? "commit" : "healed"}, {"rank", o.rank}, {"step", r.committed},
          {"quorum", m.current().id}, {"members", ranks_of(m.current())}, {"hash", hex(m.state_hash())},
          {"attempts", r.attempts}});
    if (r.outcome == mb::outcome::committed && log->detected_at) {
      emit({{"event", "recovered"}, {"rank", o.rank}, {"lost", log->lost_pending}, {"step", r.committed},
            {"seconds", now_seconds() - *log->detected_at}});
      log->detected_at.reset();
      log->lost_pending.clear();
    }
  }
  // The closing sync (member::finish(), docs/collective.md, "The end of the job"): a last sync
  // committed here and failed on a member that missed a lost peer's last message is healed on
  // that member through it; without it, that member would run the last sync again without this
  // one, and the job would end with two states. It changes no state; `done`'s step counts it.
  // A drop there ends the process (the helper does not rejoin in finish()).
  h.finish();
  const zmq_member& m = h.incarnation();
  const mb::member_stats s = m.stats();
  emit({{"event", "done"}, {"rank", o.rank}, {"step", m.committed()}, {"quorum", m.current().id},
        {"members", ranks_of(m.current())}, {"hash", hex(m.state_hash())}, {"reconfigurations", s.reconfigurations},
        {"failed_syncs", s.failed_syncs}, {"retries", s.retries}, {"discarded", s.discarded},
        {"state_sent_bytes", s.state_sent_bytes}, {"state_received_bytes", s.state_received_bytes}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string help;
  options o;
  try {
    o = parse(argc, argv, help);
    if (!help.empty()) {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
    return run(o);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "cadence-chaos-rank: error: %s\n", e.what());
    return 2;
  } catch (const mb::evicted_error& e) {
    // A stopped process that comes back finds the quorum gone on without it: its expected fate.
    emit({{"event", "stopped"}, {"rank", o.rank}, {"reason", "evicted"}, {"message", e.what()}});
    std::fprintf(stderr, "cadence-chaos-rank (rank %d): evicted: %s\n", o.rank, e.what());
    return 3;
  } catch (const mb::quorum_error& e) {
    emit({{"event", "stopped"}, {"rank", o.rank}, {"reason", "quorum"}, {"message", e.what()}});
    std::fprintf(stderr, "cadence-chaos-rank (rank %d): no quorum: %s\n", o.rank, e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cadence-chaos-rank (rank %d): error: %s\n", o.rank, e.what());
    return 1;
  }
}
