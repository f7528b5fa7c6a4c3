// Test support: named events between the ranks of a test, threads and processes alike, so a
// fault test waits for the state it needs (a worker evicted, a rank failed) instead of sleeping
// against a deadline. An event is an empty file in a folder every rank of the run knows; wait()
// polls for it every 2 ms, up to a limit that only catches a hang.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>

namespace cadence_test {

class events {
public:
  /// A fresh folder under the system's temporary folder, removed with the object.
  events() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cadence-events-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("cadence_test::events: mkdtemp failed");
    dir_ = tmpl;
    owner_ = true;
  }
  /// The folder another rank made (a process of an MPI job, given the path).
  explicit events(std::string dir) : dir_(std::move(dir)) {}
  events(const events&) = delete;
  events& operator=(const events&) = delete;
  ~events() {
    if (!owner_) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  const std::string& dir() const noexcept { return dir_; }

  /// Posts `name` (idempotent).
  void post(const std::string& name) const {
    std::ofstream(path(name)).flush();
  }
  bool posted(const std::string& name) const {
    std::error_code ec;
    return std::filesystem::exists(path(name), ec);
  }
  /// Waits until `name` is posted; false when `limit` passed first (a hang: fail the test).
  bool wait(const std::string& name, std::chrono::milliseconds limit = std::chrono::seconds(60)) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!posted(name)) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  /// Waits until every rank in [0, n) but `except` has posted `name` + "." + its rank.
  bool wait_ranks(const std::string& name, int n, int except,
                  std::chrono::milliseconds limit = std::chrono::seconds(60)) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (int r = 0; r < n; ++r) {
      if (r == except) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (!wait(name + "." + std::to_string(r), std::max(left, std::chrono::milliseconds(0)))) return false;
    }
    return true;
  }
  /// Posts `name` + "." + `rank`.
  void post_rank(const std::string& name, int rank) const { post(name + "." + std::to_string(rank)); }

private:
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
  bool owner_ = false;
};

/// The events of the suite run in progress: set by the harnesses (inproc, gloo, MPI) around
/// each run, so shared suite bodies (which take only a communicator) can reach them.
inline const events*& current_events_slot() {
  static const events* current = nullptr;
  return current;
}
inline const events& current_events() {
  const events* e = current_events_slot();
  if (e == nullptr) throw std::logic_error("cadence_test::current_events: no harness run in progress");
  return *e;
}

/// Makes `e` the current events for its lifetime (one harness run).
class scoped_events {
public:
  explicit scoped_events(const events& e) : previous_(current_events_slot()) { current_events_slot() = &e; }
  ~scoped_events() { current_events_slot() = previous_; }
  scoped_events(const scoped_events&) = delete;
  scoped_events& operator=(const scoped_events&) = delete;

private:
  const events* previous_;
};

}  // namespace cadence_test
