// The device memory behind thrust_zipline_workspace: grow-only device allocations and a pool
// that serves Thrust's temporary storage, so repeated solves stop allocating.
#pragma once

#include <cadence/thrust/config.hpp>

#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace cadence::detail {

inline void* device_allocate(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
#if CADENCE_THRUST_CUDA
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes),
             ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  return p;
#else
  void* p = std::malloc(bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
#endif
}

inline void device_free(void* p) noexcept {
  if (p == nullptr) return;
#if CADENCE_THRUST_CUDA
  (void)cudaFree(p);  // cudaFree waits for work still using p; a failure here cannot be acted on
#else
  std::free(p);
#endif
}

/// One grow-only device allocation.
class device_bytes {
public:
  device_bytes() = default;
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
  device_bytes(device_bytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_bytes& operator=(device_bytes&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~device_bytes() { release(); }

  /// Room for count U's; old contents are not kept.
  template <class U>
  U* get(std::size_t count) {
    const std::size_t bytes = count * sizeof(U);
    if (bytes > size_ || p_ == nullptr) {
      release();
      p_ = device_allocate(bytes);
      size_ = bytes;
    }
    return static_cast<U*>(p_);
  }
  std::size_t size() const noexcept { return size_; }
  void release() noexcept {
    device_free(p_);
    p_ = nullptr;
    size_ = 0;
  }

private:
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

/// Thrust's temporary storage (sort and scan scratch), cached across calls. Blocks are reused
/// in stream order, which is why one workspace must not serve two streams at once.
class temp_pool {
public:
  temp_pool() = default;
  temp_pool(const temp_pool&) = delete;
  temp_pool& operator=(const temp_pool&) = delete;
  temp_pool(temp_pool&& o) noexcept : blocks_(std::move(o.blocks_)) { o.blocks_.clear(); }
  temp_pool& operator=(temp_pool&& o) noexcept {
    if (this != &o) {
      release();
      blocks_ = std::move(o.blocks_);
      o.blocks_.clear();
    }
    return *this;
  }
  ~temp_pool() { release(); }

  char* allocate(std::size_t bytes) {
    block* best = nullptr;
    for (auto& b : blocks_)
      if (!b.used && b.size >= bytes && (best == nullptr || b.size < best->size)) best = &b;
    if (best == nullptr) {
      blocks_.push_back(block{static_cast<char*>(device_allocate(bytes)), bytes, false});
      best = &blocks_.back();
    }
    best->used = true;
    return best->p;
  }
  void deallocate(char* p) noexcept {
    for (auto& b : blocks_)
      if (b.p == p) b.used = false;
  }
  std::size_t size() const noexcept {
    std::size_t s = 0;
    for (const auto& b : blocks_) s += b.size;
    return s;
  }
  void release() noexcept {
    for (auto& b : blocks_) device_free(b.p);
    blocks_.clear();
  }

private:
  struct block {
    char* p;
    std::size_t size;
    bool used;
  };
  std::vector<block> blocks_;
};

/// The allocator Thrust's execution policies take for temporary storage.
struct temp_allocator {
  using value_type = char;
  temp_pool* pool;
  char* allocate(std::ptrdiff_t bytes) { return pool->allocate(static_cast<std::size_t>(bytes)); }
  void deallocate(char* p, std::size_t) noexcept { pool->deallocate(p); }
};

}  // namespace cadence::detail
