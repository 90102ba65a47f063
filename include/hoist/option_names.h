// The names of the manager's option enums, as the CLI and Python spell
// them: one table each, so that no front end parses them on its own.
// Parse* is kInvalidArgument naming the option and the names it takes.
#ifndef HOIST_OPTION_NAMES_H_
#define HOIST_OPTION_NAMES_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/checkpoint_manager.h"

namespace hoist {

// "posix", "io_uring".
absl::StatusOr<IoEngine> ParseIoEngine(std::string_view name);
std::string IoEngineName(IoEngine engine);
std::vector<std::string> IoEngineNames();

// "normal", "low", "idle".
absl::StatusOr<CheckpointManagerOptions::BackgroundPriority>
ParseBackgroundPriority(std::string_view name);
std::string BackgroundPriorityName(
    CheckpointManagerOptions::BackgroundPriority priority);

// "wait", "skip".
absl::StatusOr<CheckpointManagerOptions::WhenBusy> ParseWhenBusy(
    std::string_view name);
std::string WhenBusyName(CheckpointManagerOptions::WhenBusy when_busy);

// "auto", "always", "never".
absl::StatusOr<RestoreOptions::SharedReads> ParseSharedReads(
    std::string_view name);
std::string SharedReadsName(RestoreOptions::SharedReads shared_reads);

}  // namespace hoist

#endif  // HOIST_OPTION_NAMES_H_
