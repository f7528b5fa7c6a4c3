/// \file
/// \ingroup transport
/// The NCCL backend (target cadence::nccl): real_nccl_api(), the function table filled with
/// NCCL and the CUDA runtime, for nccl_communicator (cadence/transport/nccl/protocol.hpp). Host
/// code: any C++17 compiler builds it with the CUDA toolkit's headers, no nvcc needed. The
/// header to include for NCCL.
#pragma once

#include <cadence/transport/communicator.hpp>
#include <cadence/transport/nccl/protocol.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstring>

#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < 21400
#error "cadence::nccl needs NCCL 2.14 or later (non-blocking ncclCommInitRankConfig)"
#endif

namespace cadence::transport {

namespace detail {

static_assert(sizeof(nccl_unique_id) == sizeof(ncclUniqueId),
              "cadence: nccl_unique_id must hold NCCL_UNIQUE_ID_BYTES");

inline ncclDataType_t nccl_type(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
  }
  return ncclUint8;
}

inline ncclRedOp_t nccl_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
    case reduce_op::sum: break;
  }
  return ncclSum;
}

inline ncclComm_t nccl_comm(void* comm) noexcept { return static_cast<ncclComm_t>(comm); }
inline cudaStream_t cuda_stream(void* s) noexcept { return static_cast<cudaStream_t>(s); }
inline cudaEvent_t cuda_event(void* e) noexcept { return static_cast<cudaEvent_t>(e); }

}  // namespace detail

/// \addtogroup transport
/// @{

/// The table of the real NCCL and CUDA runtime functions (see nccl_api).
inline nccl_api real_nccl_api() {
  nccl_api a;
  a.context = nullptr;
  a.get_unique_id = [](void*, nccl_unique_id* id) -> int {
    ncclUniqueId u;
    const ncclResult_t rc = ncclGetUniqueId(&u);
    if (rc == ncclSuccess) std::memcpy(id->bytes, &u, sizeof u);
    return static_cast<int>(rc);
  };
  a.comm_init_rank_nonblocking = [](void** comm, int nranks, const nccl_unique_id* id,
                                    int rank) -> int {
    ncclUniqueId u;
    std::memcpy(&u, id->bytes, sizeof u);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&c, nranks, u, rank, &config);
    *comm = c;
    return static_cast<int>(rc);
  };
  a.comm_get_async_error = [](void* comm, int* async_error) -> int {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(detail::nccl_comm(comm), &state);
    *async_error = static_cast<int>(state);
    return static_cast<int>(rc);
  };
  a.comm_abort = [](void* comm) -> int {
    return static_cast<int>(ncclCommAbort(detail::nccl_comm(comm)));
  };
  a.comm_finalize = [](void* comm) -> int {
    return static_cast<int>(ncclCommFinalize(detail::nccl_comm(comm)));
  };
  a.comm_destroy = [](void* comm) -> int {
    return static_cast<int>(ncclCommDestroy(detail::nccl_comm(comm)));
  };
  a.all_reduce = [](const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                    void* comm, void* stream) -> int {
    return static_cast<int>(ncclAllReduce(send, recv, count, detail::nccl_type(t),
                                          detail::nccl_op(op), detail::nccl_comm(comm),
                                          detail::cuda_stream(stream)));
  };
  a.broadcast = [](const void* send, void* recv, std::size_t bytes, int root, void* comm,
                   void* stream) -> int {
    return static_cast<int>(ncclBroadcast(send, recv, bytes, ncclUint8, root,
                                          detail::nccl_comm(comm), detail::cuda_stream(stream)));
  };
  a.send = [](const void* buf, std::size_t bytes, int peer, void* comm, void* stream) -> int {
    return static_cast<int>(ncclSend(buf, bytes, ncclUint8, peer, detail::nccl_comm(comm),
                                     detail::cuda_stream(stream)));
  };
  a.recv = [](void* buf, std::size_t bytes, int peer, void* comm, void* stream) -> int {
    return static_cast<int>(ncclRecv(buf, bytes, ncclUint8, peer, detail::nccl_comm(comm),
                                     detail::cuda_stream(stream)));
  };
  a.get_error_string = [](int rc) -> const char* {
    return ncclGetErrorString(static_cast<ncclResult_t>(rc));
  };
  a.all_reduce_op = [](const void* send, void* recv, std::size_t count, dtype t, int op,
                       void* comm, void* stream) -> int {
    return static_cast<int>(ncclAllReduce(send, recv, count, detail::nccl_type(t),
                                          static_cast<ncclRedOp_t>(op), detail::nccl_comm(comm),
                                          detail::cuda_stream(stream)));
  };
  a.red_op_create_premul_sum = [](int* op, double scalar, dtype t, void* comm) -> int {
    // The scalar has the element type; ncclScalarHostImmediate reads it during this call.
    const float f = static_cast<float>(scalar);
    const double d = scalar;
    void* value = t == dtype::f32 ? static_cast<void*>(const_cast<float*>(&f))
                                  : static_cast<void*>(const_cast<double*>(&d));
    ncclRedOp_t out{};
    const ncclResult_t rc = ncclRedOpCreatePreMulSum(&out, value, detail::nccl_type(t),
                                                     ncclScalarHostImmediate, detail::nccl_comm(comm));
    *op = static_cast<int>(out);
    return static_cast<int>(rc);
  };
  a.red_op_destroy = [](int op, void* comm) -> int {
    return static_cast<int>(ncclRedOpDestroy(static_cast<ncclRedOp_t>(op), detail::nccl_comm(comm)));
  };
  a.get_device_count = [](void*, int* n) -> int { return static_cast<int>(cudaGetDeviceCount(n)); };
  a.set_device = [](int device) -> int { return static_cast<int>(cudaSetDevice(device)); };
  a.stream_create = [](void** stream) -> int {
    cudaStream_t s = nullptr;
    const cudaError_t rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *stream = s;
    return static_cast<int>(rc);
  };
  a.stream_destroy = [](void* stream) -> int {
    return static_cast<int>(cudaStreamDestroy(detail::cuda_stream(stream)));
  };
  a.event_create = [](void** event) -> int {
    cudaEvent_t e = nullptr;
    const cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    *event = e;
    return static_cast<int>(rc);
  };
  a.event_record = [](void* event, void* stream) -> int {
    return static_cast<int>(
        cudaEventRecord(detail::cuda_event(event), detail::cuda_stream(stream)));
  };
  a.event_query = [](void* event) -> int {
    return static_cast<int>(cudaEventQuery(detail::cuda_event(event)));
  };
  a.event_destroy = [](void* event) -> int {
    return static_cast<int>(cudaEventDestroy(detail::cuda_event(event)));
  };
  a.stream_wait_event = [](void* stream, void* event) -> int {
    return static_cast<int>(cudaStreamWaitEvent(detail::cuda_stream(stream), detail::cuda_event(event), 0));
  };
  a.cuda_error_string = [](int rc) -> const char* {
    return cudaGetErrorString(static_cast<cudaError_t>(rc));
  };
  a.memcpy_async = [](void* dst, const void* src, std::size_t bytes, void* stream) -> int {
    return static_cast<int>(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, detail::cuda_stream(stream)));
  };
  a.memset_async = [](void* p, int value, std::size_t bytes, void* stream) -> int {
    return static_cast<int>(cudaMemsetAsync(p, value, bytes, detail::cuda_stream(stream)));
  };
  a.device_malloc = [](void** p, std::size_t bytes) -> int { return static_cast<int>(cudaMalloc(p, bytes)); };
  a.device_free = [](void* p) -> int { return static_cast<int>(cudaFree(p)); };
  return a;
}

/// @}

static_assert(nccl_codes::success == ncclSuccess && nccl_codes::success == cudaSuccess,
              "cadence: nccl_codes::success must mirror ncclSuccess and cudaSuccess");
static_assert(nccl_codes::in_progress == ncclInProgress,
              "cadence: nccl_codes::in_progress must mirror ncclInProgress");
static_assert(nccl_codes::cuda_not_ready == cudaErrorNotReady,
              "cadence: nccl_codes::cuda_not_ready must mirror cudaErrorNotReady");
static_assert(nccl_codes::op_avg == ncclAvg, "cadence: nccl_codes::op_avg must mirror ncclAvg");

}  // namespace cadence::transport
