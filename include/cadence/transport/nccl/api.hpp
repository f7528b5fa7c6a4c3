/// \file
/// \ingroup transport
/// The NCCL backend's function table (nccl_api), through which it reaches NCCL and the CUDA
/// runtime, with the result codes it tells apart and its options. Includes no CUDA header, so
/// the protocol (nccl/protocol.hpp) is tested on CPU against a fake table. Include
/// `<cadence/transport/nccl/communicator.hpp>` for the real table.
#pragma once

#include <cadence/transport/communicator.hpp>

#include <chrono>
#include <cstddef>

namespace cadence::transport {
/// \addtogroup transport
/// @{

/// NCCL's unique id (NCCL_UNIQUE_ID_BYTES = 128 bytes), which rank 0 creates and the bootstrap
/// communicator broadcasts.
struct nccl_unique_id {
  /// The id's bytes, as ncclGetUniqueId writes them.
  char bytes[128];
};

/// Result codes as the table returns them: the values of ncclResult_t and cudaError_t that the
/// protocol tells apart (the rest are errors, named by the table's error-string functions).
namespace nccl_codes {
/// ncclSuccess, cudaSuccess: the call succeeded.
inline constexpr int success = 0;
/// ncclInProgress: a non-blocking call still running.
inline constexpr int in_progress = 7;
/// cudaErrorNotReady: an event not yet reached.
inline constexpr int cuda_not_ready = 600;
/// ncclAvg, the reduction all_reduce_op takes for an average.
inline constexpr int op_avg = 4;
}  // namespace nccl_codes

/// Every NCCL and CUDA runtime call the backend makes, as plain function pointers. Handles are
/// opaque: `comm` is an ncclComm_t, `stream` a cudaStream_t, `event` a cudaEvent_t. NCCL calls
/// return ncclResult_t values, CUDA calls cudaError_t values (see nccl_codes). real_nccl_api()
/// (cadence/transport/nccl/communicator.hpp) fills it with NCCL and the CUDA runtime; the tests
/// fill it with a host-memory fake whose ranks are threads.
struct nccl_api {
  /// Passed to the calls that take no handle (get_unique_id, get_device_count): the fake's
  /// world; null for the real table.
  void* context = nullptr;
  // ---- NCCL ----
  /// ncclGetUniqueId: writes a new unique id into `id` (`context`: the table's context).
  int (*get_unique_id)(void* context, nccl_unique_id* id) = nullptr;
  /// ncclCommInitRankConfig with config.blocking = 0: returns at once (success or in_progress);
  /// comm_get_async_error says when the communicator is ready.
  int (*comm_init_rank_nonblocking)(void** comm, int nranks, const nccl_unique_id* id,
                                    int rank) = nullptr;
  /// ncclCommGetAsyncError: the state of a non-blocking communicator (success, in_progress or
  /// an error) into `async_error`.
  int (*comm_get_async_error)(void* comm, int* async_error) = nullptr;
  /// ncclCommAbort: stops the communicator's operations and frees it, without waiting.
  int (*comm_abort)(void* comm) = nullptr;
  /// ncclCommFinalize: starts flushing the communicator's operations before comm_destroy.
  int (*comm_finalize)(void* comm) = nullptr;
  /// ncclCommDestroy: frees a finalized communicator.
  int (*comm_destroy)(void* comm) = nullptr;
  /// ncclAllReduce: `count` elements of `t` reduced with `op`, from `send` into `recv`, enqueued
  /// on `stream`.
  int (*all_reduce)(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                    void* comm, void* stream) = nullptr;
  /// ncclBroadcast: `bytes` bytes from rank `root`'s `send` into every rank's `recv`, enqueued
  /// on `stream`.
  int (*broadcast)(const void* send, void* recv, std::size_t bytes, int root, void* comm,
                   void* stream) = nullptr;
  /// ncclSend: `bytes` bytes from `buf` to rank `peer`, enqueued on `stream`.
  int (*send)(const void* buf, std::size_t bytes, int peer, void* comm, void* stream) = nullptr;
  /// ncclRecv: `bytes` bytes from rank `peer` into `buf`, enqueued on `stream`.
  int (*recv)(void* buf, std::size_t bytes, int peer, void* comm, void* stream) = nullptr;
  /// ncclGetErrorString: the text of an NCCL `result`.
  const char* (*get_error_string)(int result) = nullptr;
  // ---- NCCL, for the collective adapters' device path (cadence/exchange/). Optional: a table
  // without them builds a communicator whose device helpers throw invalid_parameter_error. ----
  /// ncclAllReduce with a raw ncclRedOp_t: nccl_codes::op_avg or one red_op_create_premul_sum
  /// made.
  int (*all_reduce_op)(const void* send, void* recv, std::size_t count, dtype t, int op,
                       void* comm, void* stream) = nullptr;
  /// ncclRedOpCreatePreMulSum with a host scalar (ncclScalarHostImmediate) of the element type
  /// (f32 or f64): every rank's input is multiplied by its own scalar before the sum.
  int (*red_op_create_premul_sum)(int* op, double scalar, dtype t, void* comm) = nullptr;
  /// ncclRedOpDestroy: frees a reduction red_op_create_premul_sum made.
  int (*red_op_destroy)(int op, void* comm) = nullptr;
  // ---- CUDA runtime ----
  /// cudaGetDeviceCount (`context`: the table's context).
  int (*get_device_count)(void* context, int* count) = nullptr;
  /// cudaSetDevice: the calling thread's current device.
  int (*set_device)(int device) = nullptr;
  /// cudaStreamCreateWithFlags(cudaStreamNonBlocking): a new non-blocking stream.
  int (*stream_create)(void** stream) = nullptr;
  /// cudaStreamDestroy.
  int (*stream_destroy)(void* stream) = nullptr;
  /// cudaEventCreateWithFlags(cudaEventDisableTiming): a new event, timing disabled.
  int (*event_create)(void** event) = nullptr;
  /// cudaEventRecord: `event` marks what is enqueued on `stream` so far.
  int (*event_record)(void* event, void* stream) = nullptr;
  /// cudaEventQuery: success once the event is reached, cuda_not_ready before, or an error.
  int (*event_query)(void* event) = nullptr;
  /// cudaEventDestroy.
  int (*event_destroy)(void* event) = nullptr;
  /// cudaStreamWaitEvent: work enqueued on `stream` from now on waits for `event` (as recorded
  /// when this call is made). How the communicator orders its stream after the caller's.
  int (*stream_wait_event)(void* stream, void* event) = nullptr;
  /// cudaGetErrorString: the text of a CUDA `error`.
  const char* (*cuda_error_string)(int error) = nullptr;
  // ---- CUDA runtime, for the collective adapters' device path. Optional, as above. ----
  /// cudaMemcpyAsync, device to device: `bytes` bytes from `src` to `dst`, enqueued on
  /// `stream`.
  int (*memcpy_async)(void* dst, const void* src, std::size_t bytes, void* stream) = nullptr;
  /// cudaMemsetAsync: `bytes` bytes at `p` set to `value`, enqueued on `stream`.
  int (*memset_async)(void* p, int value, std::size_t bytes, void* stream) = nullptr;
  /// cudaMalloc: `bytes` bytes of device memory on the current device, into `p`.
  int (*device_malloc)(void** p, std::size_t bytes) = nullptr;
  /// cudaFree: frees what device_malloc returned.
  int (*device_free)(void* p) = nullptr;
};

/// What an nccl_communicator is built with: its streams, how long it waits to issue an
/// operation, its polling and its shutdown wait.
struct nccl_options {
  /// The stream (a cudaStream_t) the calls without an explicit stream enqueue on. Null: the
  /// communicator creates a non-blocking stream of its own on its device.
  void* stream = nullptr;
  /// The caller's stream: the calls without an explicit stream first make `stream` wait for
  /// everything enqueued here before the call (an event recorded here, cudaStreamWaitEvent on
  /// `stream`), as PyTorch's ProcessGroupNCCL waits on the current stream. Null: the legacy
  /// default stream, where kernels launched without a stream run.
  void* caller_stream = nullptr;
  /// How long starting an operation may wait for a non-blocking communicator to finish issuing
  /// the previous one (ncclInProgress) when the call has no deadline of its own (the
  /// asynchronous forms).
  std::chrono::milliseconds issue_timeout{60000};
  /// Polling: the first waits spin (a small all-reduce completes in microseconds); a call
  /// still waiting after spin_for sleeps poll_sleep between queries.
  std::chrono::microseconds spin_for{20000};
  /// How long a wait sleeps between two queries once spin_for has passed.
  std::chrono::microseconds poll_sleep{50};
  /// How long the destructor waits for ncclCommFinalize before it aborts instead.
  std::chrono::milliseconds shutdown_wait{2000};
};

/// @}
}  // namespace cadence::transport
