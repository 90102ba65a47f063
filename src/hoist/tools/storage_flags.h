// The CLI's storage flags, for every command (given before or after it):
// they fill the one StorageOptions each command opens its root with, so a
// flag overrides the environment (which the clients read for what no flag
// sets). Keys stay in the environment or a profile: never on a command
// line.
#ifndef HOIST_TOOLS_STORAGE_FLAGS_H_
#define HOIST_TOOLS_STORAGE_FLAGS_H_

#include <CLI/CLI.hpp>

#include "hoist/storage.h"

namespace hoist {

// Adds --s3-endpoint, --s3-region, --aws-profile and --gcs-endpoint to
// `app`, filling `options` as they are parsed; `options` must outlive the
// parse and the commands' callbacks.
void AddStorageFlags(CLI::App& app, StorageOptions& options);

}  // namespace hoist

#endif  // HOIST_TOOLS_STORAGE_FLAGS_H_
