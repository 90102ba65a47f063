#include "hoist/option_names.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"

namespace hoist {
namespace {

template <typename E>
using NameTable = absl::Span<const std::pair<E, std::string_view>>;

template <typename E>
std::vector<std::string> Names(NameTable<E> table) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.emplace_back(entry.second);
  return names;
}

template <typename E>
absl::StatusOr<E> Parse(std::string_view option, std::string_view name,
                        NameTable<E> table) {
  for (const auto& [value, spelled] : table) {
    if (spelled == name) return value;
  }
  // "'a', 'b' or 'c'"
  std::vector<std::string> names = Names(table);
  for (std::string& n : names) n = absl::StrCat("'", n, "'");
  const std::string last = names.back();
  names.pop_back();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s '%s': use %s%s%s", option, name, absl::StrJoin(names, ", "),
      names.empty() ? "" : " or ", last));
}

template <typename E>
std::string Name(E value, NameTable<E> table) {
  for (const auto& [known, spelled] : table) {
    if (known == value) return std::string(spelled);
  }
  return "?";
}

using Priority = CheckpointManagerOptions::BackgroundPriority;
using WhenBusy = CheckpointManagerOptions::WhenBusy;
using Shared = RestoreOptions::SharedReads;

constexpr std::pair<IoEngine, std::string_view> kIoEngines[] = {
    {IoEngine::kPosix, "posix"}, {IoEngine::kIoUring, "io_uring"}};
constexpr std::pair<Priority, std::string_view> kPriorities[] = {
    {Priority::kLow, "low"},
    {Priority::kIdle, "idle"},
    {Priority::kNormal, "normal"}};
constexpr std::pair<WhenBusy, std::string_view> kWhenBusy[] = {
    {WhenBusy::kWait, "wait"}, {WhenBusy::kSkip, "skip"}};
constexpr std::pair<Shared, std::string_view> kSharedReads[] = {
    {Shared::kAuto, "auto"},
    {Shared::kAlways, "always"},
    {Shared::kNever, "never"}};

}  // namespace

absl::StatusOr<IoEngine> ParseIoEngine(std::string_view name) {
  return Parse<IoEngine>("io", name, kIoEngines);
}
std::string IoEngineName(IoEngine engine) {
  return Name<IoEngine>(engine, kIoEngines);
}
std::vector<std::string> IoEngineNames() { return Names<IoEngine>(kIoEngines); }

absl::StatusOr<Priority> ParseBackgroundPriority(std::string_view name) {
  return Parse<Priority>("background_priority", name, kPriorities);
}
std::string BackgroundPriorityName(Priority priority) {
  return Name<Priority>(priority, kPriorities);
}

absl::StatusOr<WhenBusy> ParseWhenBusy(std::string_view name) {
  return Parse<WhenBusy>("when_busy", name, kWhenBusy);
}
std::string WhenBusyName(WhenBusy when_busy) {
  return Name<WhenBusy>(when_busy, kWhenBusy);
}

absl::StatusOr<Shared> ParseSharedReads(std::string_view name) {
  return Parse<Shared>("shared_reads", name, kSharedReads);
}
std::string SharedReadsName(Shared shared_reads) {
  return Name<Shared>(shared_reads, kSharedReads);
}

}  // namespace hoist
