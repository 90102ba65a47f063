// Human-readable byte sizes for summaries, logs and the CLI.
#ifndef HOIST_BASE_BYTES_H_
#define HOIST_BASE_BYTES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace hoist {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;

// Formats `bytes` with a binary unit: "512 B", "4.0 KiB", "1.50 GiB".
std::string FormatBytes(double bytes);

// Parses "4096", "64K", "64KiB", "1.5G", "2 MiB" (binary units; case and a
// trailing "B"/"iB" are ignored). Returns kInvalidArgument naming the text for
// anything else, negative sizes, or sizes that do not fit in int64_t.
absl::StatusOr<int64_t> ParseBytes(std::string_view text);

}  // namespace hoist

#endif  // HOIST_BASE_BYTES_H_
