// Test support: ranks as processes, for the fault tests that kill, stop and resume a rank. The
// test executable starts itself again as each rank (/proc/self/exe with a flag its main()
// recognizes, see tests_or_rank), injects the faults from the test process, and waits for every
// rank with an upper bound that only catches a hang. Inside a rank there is no doctest: checks
// throw rank_check_failed, and rank_main turns an escaping exception into exit status 1 with the
// reason on stderr. The steps of a scenario wait for states (events.hpp), never for a time.
// Ranks as threads of one process: threads.hpp.
#pragma once

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cadence_test {

// ---- in the test process ----

/// One rank running as a child process of the test; `who` names it in failures ("rank 2").
struct rank_process {
  std::string who;
  pid_t pid = -1;
  int status = 0;
  bool done = false;

  /// The fault-injection steps: SIGKILL (a crash), SIGSTOP (a hang: silent, sockets open),
  /// SIGCONT (the hung rank resumes).
  void kill() const { ::kill(pid, SIGKILL); }
  void stop() const { ::kill(pid, SIGSTOP); }
  void resume() const { ::kill(pid, SIGCONT); }

  bool exited_ok() const { return done && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  bool killed() const { return done && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }
};

/// Starts this executable again with `args` (args[0] is what the process is called, args[1]
/// the flag its main() takes as "run one rank", then the rank's own arguments).
inline rank_process start_rank(std::string who, const std::vector<std::string>& args) {
  rank_process p;
  p.who = std::move(who);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  p.pid = ::fork();
  if (p.pid == 0) {
    ::execv("/proc/self/exe", argv.data());
    std::_Exit(127);
  }
  if (p.pid < 0) throw std::runtime_error("cadence_test::start_rank: fork failed for " + p.who);
  return p;
}

/// Waits for every rank to end; a rank still running at `limit` (a hang) is killed and fails
/// the test, named.
inline void wait_ranks(std::vector<rank_process>& ranks, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    bool all = true;
    for (auto& k : ranks) {
      if (k.done) continue;
      if (::waitpid(k.pid, &k.status, WNOHANG) == k.pid)
        k.done = true;
      else
        all = false;
    }
    if (all) return;
    if (std::chrono::steady_clock::now() >= until) {
      for (auto& k : ranks) {
        if (k.done) continue;
        k.kill();
        ::waitpid(k.pid, &k.status, 0);
        k.done = true;
        FAIL_CHECK(k.who << " was still running after " << limit.count() << " s and was killed");
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

/// The rank exited with status 0: its own checks passed (else its stderr says why).
inline void check_exited(const rank_process& k) {
  CHECK_MESSAGE(k.exited_ok(), k.who << " failed (status " << k.status << "; its stderr says why)");
}
/// The rank died of the SIGKILL the test (or the rank itself) sent.
inline void check_killed(const rank_process& k) {
  CHECK_MESSAGE(k.killed(), k.who << " did not die of SIGKILL (status " << k.status << ")");
}

// ---- in a rank ----

/// A check inside a rank failed: rank_main prints it and exits 1.
struct rank_check_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A check inside a rank, where doctest's macros do not reach the test process.
inline void rank_check(bool ok, const std::string& what) {
  if (!ok) throw rank_check_failed("check failed: " + what);
}

/// Runs f, which must throw E mentioning `needle`; returns its message.
template <class E, class F>
std::string rank_expect_throw(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const E& e) {
    rank_check(std::string(e.what()).find(needle) != std::string::npos,
               std::string("\"") + e.what() + "\" should mention \"" + needle + "\"");
    return e.what();
  }
  throw rank_check_failed("expected an exception mentioning \"" + needle + "\"");
}

/// A rank's exit status: f()'s, or 1 when an exception escapes it (printed, named by `who`).
template <class F>
int rank_main(const std::string& who, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}

/// The body of a test runner's main() (compiled with DOCTEST_CONFIG_IMPLEMENT) whose tests
/// start ranks as processes: with `flag` as its first argument it runs one rank, else the tests.
inline int tests_or_rank(int argc, char** argv, const char* flag, int (*rank)(int, char**)) {
  if (argc > 1 && std::strcmp(argv[1], flag) == 0) return rank(argc, argv);
  doctest::Context context(argc, argv);
  return context.run();
}

}  // namespace cadence_test
