// What the MPI backend needs of MPI itself: how a message larger than MPI's int count travels
// (a derived datatype), the host dtypes' MPI types, and MPI's error text.
#pragma once

#include <cadence/core/error.hpp>
#include <cadence/transport/communicator.hpp>
#include <cadence/transport/detail/call.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace cadence::transport::detail {

/// How `bytes` travel as one MPI message when MPI's int count cannot hold them: `blocks` blocks
/// of `block` bytes (a contiguous datatype) followed by `rest` bytes. For bytes <= limit:
/// blocks == 0 and rest == bytes (plain MPI_BYTE).
struct mpi_layout {
  std::size_t block = 0;
  std::size_t blocks = 0;
  std::size_t rest = 0;
  bool plain() const noexcept { return blocks == 0; }
};
/// limit in [1, INT_MAX]; throws std::length_error when even the blocks overflow int.
inline mpi_layout mpi_layout_of(std::size_t bytes, std::size_t limit) {
  if (bytes <= limit) return {limit, 0, bytes};
  const mpi_layout l{limit, bytes / limit, bytes % limit};
  if (l.blocks > static_cast<std::size_t>(INT_MAX))
    throw std::length_error("cadence: " + std::to_string(bytes) + " bytes need more than INT_MAX blocks of " +
                            std::to_string(limit));
  return l;
}

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

/// Whether an MPI return code is MPI_ERR_TRUNCATE (a message longer than its receive).
inline bool mpi_truncated(int rc) {
  int cls = 0;
  MPI_Error_class(rc, &cls);
  return cls == MPI_ERR_TRUNCATE;
}

/// The MPI type of a host dtype; f16 and bf16 have none.
inline MPI_Datatype mpi_type(const call_info& c, dtype t) {
  switch (t) {
    case dtype::f32: return MPI_FLOAT;
    case dtype::f64: return MPI_DOUBLE;
    case dtype::i32: return MPI_INT32_T;
    case dtype::i64: return MPI_INT64_T;
    case dtype::u8: return MPI_UINT8_T;
    case dtype::f16:
    case dtype::bf16: break;
  }
  bad_argument(c, std::string("dtype ") + dtype_name(t) + " has no MPI host type (it is for device backends such as NCCL)");
}

/// A call's MPI return code: anything but success is the call's transport_error.
inline void check_mpi(const call_info& c, int rc) {
  if (rc != MPI_SUCCESS) throw transport_error(describe(c) + ": " + mpi_error_string(rc));
}

}  // namespace cadence::transport::detail
