#include "hoist/base/bytes.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace hoist {

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double value = bytes;
  while (std::fabs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%.0f B", value);
  if (value < 10) return absl::StrFormat("%.2f %s", value, kUnits[unit]);
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

absl::StatusOr<int64_t> ParseBytes(std::string_view text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a byte size (examples: 4096, 64K, 1.5GiB)", text));
  };
  std::string s = absl::AsciiStrToLower(
      absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size())));
  if (s.empty()) return bad();
  char* end = nullptr;
  const double number = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(number) || number < 0) return bad();
  absl::string_view suffix = absl::StripAsciiWhitespace(
      absl::string_view(end, s.c_str() + s.size() - end));
  if (!absl::ConsumeSuffix(&suffix, "ib")) absl::ConsumeSuffix(&suffix, "b");
  double scale = 1;
  if (suffix == "k") {
    scale = kKiB;
  } else if (suffix == "m") {
    scale = kMiB;
  } else if (suffix == "g") {
    scale = kGiB;
  } else if (suffix == "t") {
    scale = static_cast<double>(kGiB) * 1024;
  } else if (!suffix.empty()) {
    return bad();
  }
  const double bytes = number * scale;
  if (bytes >= 9.2e18) return bad();
  return static_cast<int64_t>(std::llround(bytes));
}

}  // namespace hoist
