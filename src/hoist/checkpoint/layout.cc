#include "hoist/checkpoint/layout.h"

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace hoist {

std::string StepDirName(int64_t step) {
  return absl::StrFormat("step_%08d", step);
}

std::optional<int64_t> ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() < kPrefix.size() + 8 || name.substr(0, 5) != kPrefix) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(kPrefix.size());
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()),
                        &step)) {
    return std::nullopt;
  }
  if (StepDirName(step) != name) return std::nullopt;  // one spelling only
  return step;
}

std::string TmpStepDirName(int64_t step) {
  std::random_device random;
  const uint64_t nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
  return absl::StrFormat(".%s.tmp-%016x", StepDirName(step), nonce);
}

bool IsTmpStepDirName(std::string_view name) {
  return absl::StartsWith(absl::string_view(name.data(), name.size()),
                          ".step_") &&
         absl::StrContains(absl::string_view(name.data(), name.size()),
                           ".tmp-");
}

}  // namespace hoist
