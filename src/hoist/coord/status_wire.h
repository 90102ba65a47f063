// An absl::Status as bytes that one rank sends another through a
// Coordinator, and back: the one encoding every protocol between ranks uses.
#ifndef HOIST_COORD_STATUS_WIRE_H_
#define HOIST_COORD_STATUS_WIRE_H_

#include <string>

#include "absl/status/status.h"

namespace hoist {

// "" for OK, else "CODE:MESSAGE".
std::string EncodeStatus(const absl::Status& status);

// The status EncodeStatus made on rank `rank`, its message prefixed with
// "rank N: "; bytes that are not such an encoding are kUnknown, as is.
absl::Status DecodeStatus(const std::string& bytes, int rank);
// The status EncodeStatus made, as it was (a verdict one rank passes on).
absl::Status DecodeStatusVerbatim(const std::string& bytes);
// `status` as another rank reports it: its message prefixed with "rank N: ".
absl::Status FromRank(const absl::Status& status, int rank);

}  // namespace hoist

#endif  // HOIST_COORD_STATUS_WIRE_H_
