// Test support for the gloo backend: a temporary file store and a harness that runs ranks as
// threads of the test process, each with its own gloo communicator (shared by the conformance
// suite, the exchange suite and the parameter-server tests).
#pragma once

#include <cadence/transport/gloo/communicator.hpp>

#include "support/thread_harnesses.hpp"
#include "support/threads.hpp"

#include <doctest/doctest.h>

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace cadence_gloo_test {

// A fresh folder under the system's temporary folder, removed with everything in it.
struct temp_store {
  std::string path;
  temp_store() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cadence-gloo-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~temp_store() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_store(const temp_store&) = delete;
  temp_store& operator=(const temp_store&) = delete;
};

inline cadence::transport::gloo_options options_for(const std::string& store,
                                                    const std::string& prefix = "cadence") {
  cadence::transport::gloo_options o;
  o.store_path = store;
  o.prefix = prefix;
  return o;
}

// What the ranks of one run share: a temporary file store. Each rank has its own communicator
// (gloo context and TCP device) over it.
struct gloo_world {
  temp_store store;
  cadence::transport::gloo_communicator join(int r, int n) {
    return cadence::transport::gloo_communicator(r, n, options_for(store.path), std::chrono::seconds(30));
  }
};

}  // namespace cadence_gloo_test

// Ranks as threads of this process: gloo_threads_harness<N>, gloo_harness, gloo_pair_harness.
CADENCE_THREAD_HARNESSES(cadence_gloo_test, gloo, gloo_world);
