#include "hoist/model/mesh_flag.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace hoist {

absl::StatusOr<std::pair<int64_t, int64_t>> ParseMeshFlag(
    const std::string& text) {
  const size_t x = text.find('x');
  int64_t data = 0, model = 0;
  if (x == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(text).substr(0, x), &data) ||
      !absl::SimpleAtoi(absl::string_view(text).substr(x + 1), &model) ||
      data < 1 || model < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--mesh '%s' is not DATAxMODEL with positive sizes, e.g. 2x4", text));
  }
  return std::make_pair(data, model);
}

}  // namespace hoist
