// Cadence's stand-in for gloo/common/memory.h, which gloo's TCP headers include but Debian's
// libgloo-dev (0.0~git20220518) does not install. cmake/CadenceGloo.cmake adds this folder to
// cadence::gloo's include path only when the installed gloo lacks the header and these
// declarations make gloo/transport/tcp/unbound_buffer.h compile. The communicator reads
// completion counts of gloo's TCP buffers (gloo_peek) and never creates, copies or destroys a
// gloo object through these declarations: gloo's own compiled code does that with its own
// definitions, whose layout (one std::shared_ptr) these match.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;

// The root reference a TCP unbound buffer holds to itself (gloo hands out weak references to
// its pairs).
template <typename T>
class ShareableNonOwningPtr final {
public:
  explicit ShareableNonOwningPtr(T* t) : ptr_(t, [](T*) {}) {}
  ShareableNonOwningPtr(const ShareableNonOwningPtr&) = delete;
  ShareableNonOwningPtr& operator=(const ShareableNonOwningPtr&) = delete;

protected:
  std::shared_ptr<T> ptr_;
  friend class WeakNonOwningPtr<T>;
};

template <typename T>
class WeakNonOwningPtr final {
public:
  WeakNonOwningPtr() = default;
  explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T>& root) : ptr_(root.ptr_) {}

protected:
  std::weak_ptr<T> ptr_;
};

}  // namespace gloo
