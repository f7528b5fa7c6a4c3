// The gloo backend's rendezvous: how ranks find each other (a folder every rank can reach, or a
// TCP store one of them serves), the arrival marks that name a rank that never came, and the
// full mesh of TCP connections gloo builds from them, every wait bounded by the construction's
// deadline.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>
#include <cadence/transport/gloo/detail/link.hpp>
#include <cadence/transport/gloo/options.hpp>
#include <cadence/transport/tcp_store.hpp>

#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// Which rendezvous API the installed gloo has; cmake/CadenceGloo.cmake detects it and defines
// CADENCE_GLOO_RENDEZVOUS_SHARED_STORE to 1 when connectFullMesh takes the store as a
// std::shared_ptr (upstream since 2023) instead of a reference (Debian's 2022 snapshot).
#ifndef CADENCE_GLOO_RENDEZVOUS_SHARED_STORE
#define CADENCE_GLOO_RENDEZVOUS_SHARED_STORE 0
#endif

namespace cadence::transport::detail {

// gloo's view of a tcp_store: the keys of one communicator under its prefix, every wait
// bounded by the construction's deadline (and by gloo's own timeout, when shorter).
class gloo_tcp_store final : public ::gloo::rendezvous::Store {
public:
  gloo_tcp_store(tcp_store& store, std::string prefix, deadline d, std::chrono::milliseconds poll)
      : store_(&store), prefix_(std::move(prefix) + "/"), deadline_(d), poll_(poll) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::string(data.begin(), data.end()), deadline_);
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(prefix_ + key, deadline_, poll_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    const deadline d = deadline::at(std::min(deadline_.time_point(), deadline::clock::now() + timeout));
    store_->wait(full, d, poll_);
  }

private:
  tcp_store* store_;
  std::string prefix_;
  deadline deadline_;
  std::chrono::milliseconds poll_;
};

/// gloo writes to its sockets with writev(2), without MSG_NOSIGNAL, so a write to a peer that
/// has died raises SIGPIPE, whose default action kills the whole process. With
/// options.ignore_sigpipe, SIGPIPE is set to SIG_IGN if it is still at its default.
inline void gloo_ignore_sigpipe(const gloo_options& o) noexcept {
  if (!o.ignore_sigpipe) return;
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

/// Rank `rank` of `size` meets the others through options.store_path or options.rendezvous and
/// connects to every one of them. Throws invalid_parameter_error for a store folder that does
/// not exist or is not writable, or a rendezvous address that does not parse or resolve (before
/// waiting), and transport_error naming the missing ranks when the others do not all arrive
/// before `d` (rank 0, when the TCP store it should serve never answers). Rank 0 serves a TCP
/// store in `server` when asked to: the caller keeps it until its set-up exchange with every
/// rank is done, since a rank may read the store until its own connections are up.
inline std::shared_ptr<::gloo::Context> gloo_rendezvous(const call_info& c, const gloo_options& o, int rank,
                                                        int size, const deadline& d,
                                                        std::optional<tcp_store_server>& server) {
  std::vector<int> others;
  for (int p = 0; p < size; ++p)
    if (p != rank) others.push_back(p);
  const bool tcp = !o.rendezvous.empty();
  std::string dir;
  std::optional<tcp_store> store;
  if (tcp) {
    try {
      if (rank == 0 && o.serve_rendezvous) server.emplace(o.rendezvous, o.store);
      store.emplace(o.rendezvous, o.store, d, o.store_poll);
    } catch (const invalid_parameter_error& e) {
      bad_argument(c, e.what());
    } catch (const transport_error& e) {
      if (d.passed()) throw deadline_error(c, {0}, "the rendezvous store at " + o.rendezvous + " never answered");
      throw transport_error(describe(c) + ": " + e.what());
    }
  } else {
    const std::string& folder = o.store_path;
    struct stat st {};
    if (folder.empty() || ::stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      bad_argument(c, "the store folder \"" + folder + "\" does not exist or is not a folder");
    if (::access(folder.c_str(), W_OK | X_OK) != 0)
      bad_argument(c, "the store folder \"" + folder + "\" is not writable (" + std::strerror(errno) + ")");
    dir = folder + "/" + o.prefix;
    if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
      bad_argument(c, "cannot create \"" + dir + "\" in the store folder: " + std::strerror(errno));
  }
  const std::string where =
      tcp ? "the store at " + o.rendezvous + " (prefix \"" + o.prefix + "\")" : "\"" + dir + "\"";

  gloo_ignore_sigpipe(o);  // before connecting: a rank may die during the rendezvous
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    ::gloo::transport::tcp::attr attr;
    if (!o.interface_name.empty())
      attr.iface = o.interface_name;
    else
      attr.hostname = o.hostname;
    device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw transport_error(describe(c) + ": cannot open a TCP device on " +
                          (o.interface_name.empty() ? o.hostname : o.interface_name) + ": " + gloo_reason(e));
  }

  // Our own arrival marks first, polled against the deadline: gloo's store waits would throw
  // "Wait timeout" without saying which rank never came. The TCP store's own errors (its
  // connection broke and did not come back) name this call.
  auto mark = [&](int p) { return "cadence-arrived-" + std::to_string(p); };
  auto arrived = [&](int p) {
    if (!tcp) return ::access((dir + "/" + mark(p)).c_str(), F_OK) == 0;
    try {
      return store->missing({o.prefix + "/" + mark(p)}, d).empty();
    } catch (const transport_error& e) {
      // The deadline passed with the question in flight (a slow answer under load): the loop
      // below then names the ranks not seen, as when it passes between two questions.
      if (d.passed()) return false;
      throw transport_error(describe(c) + ": " + e.what());
    }
  };
  if (tcp) {
    try {
      store->set(o.prefix + "/" + mark(rank), "", d);
    } catch (const transport_error& e) {
      throw transport_error(describe(c) + ": " + e.what());
    }
  } else {
    const std::string mine = dir + "/" + mark(rank), tmp = mine + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fclose(f) != 0 || std::rename(tmp.c_str(), mine.c_str()) != 0)
      bad_argument(c, "cannot write \"" + mine + "\" in the store folder: " + std::strerror(errno));
  }
  for (std::vector<int> missing = others;;) {
    std::vector<int> still;
    for (const int p : missing)
      if (!arrived(p)) still.push_back(p);
    missing = std::move(still);
    if (missing.empty()) break;
    if (d.passed()) throw deadline_error(c, missing, "they never arrived at the rendezvous in " + where);
    std::this_thread::sleep_for(o.store_poll);
  }

  try {
    auto ctx = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(gloo_link::remaining_ms(d));
#if CADENCE_GLOO_RENDEZVOUS_SHARED_STORE
    std::shared_ptr<::gloo::rendezvous::Store> gs;
    if (tcp)
      gs = std::make_shared<gloo_tcp_store>(*store, o.prefix, d, o.store_poll);
    else
      gs = std::make_shared<::gloo::rendezvous::FileStore>(dir);
    ctx->connectFullMesh(gs, device);
#else
    if (tcp) {
      gloo_tcp_store gs(*store, o.prefix, d, o.store_poll);
      ctx->connectFullMesh(gs, device);
    } else {
      ::gloo::rendezvous::FileStore gs(dir);
      ctx->connectFullMesh(gs, device);
    }
#endif
    return ctx;
  } catch (const std::exception& e) {
    if (d.passed()) throw deadline_error(c, others, "connecting: " + gloo_reason(e));
    throw transport_error(describe(c) + ": connecting to " + rank_list(others) + ": " + gloo_reason(e));
  }
}

}  // namespace cadence::transport::detail
