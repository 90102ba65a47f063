#include "hoist/coord/status_wire.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hoist {

std::string EncodeStatus(const absl::Status& status) {
  if (status.ok()) return std::string();
  return absl::StrCat(static_cast<int>(status.code()), ":", status.message());
}

absl::Status DecodeStatusVerbatim(const std::string& bytes) {
  if (bytes.empty()) return absl::OkStatus();
  const size_t colon = bytes.find(':');
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(bytes.substr(0, colon), &code)) {
    return absl::UnknownError(bytes);
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      bytes.substr(colon + 1));
}

absl::Status FromRank(const absl::Status& status, int rank) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrFormat("rank %d: %s", rank, status.message()));
}

absl::Status DecodeStatus(const std::string& bytes, int rank) {
  return FromRank(DecodeStatusVerbatim(bytes), rank);
}

}  // namespace hoist
