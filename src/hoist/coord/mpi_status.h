// MPI's error codes as absl::Status, for the MPI coordinator's files.
// Private to coord/.
#ifndef HOIST_COORD_MPI_STATUS_H_
#define HOIST_COORD_MPI_STATUS_H_

#include <mpi.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"

namespace hoist {

// kInternal naming `call` and MPI's text, unless `code` is MPI_SUCCESS.
inline absl::Status MpiStatus(int code, const char* call) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return absl::InternalError(
      absl::StrFormat("%s: %s", call, std::string(text, length)));
}

}  // namespace hoist

// Returns from the calling function with the named error unless `call`
// returned MPI_SUCCESS (the communicator's handler is MPI_ERRORS_RETURN).
#define HOIST_MPI(call) RETURN_IF_ERROR(::hoist::MpiStatus((call), #call))

#endif  // HOIST_COORD_MPI_STATUS_H_
