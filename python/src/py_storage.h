// storage_options from Python (a dict of names to strings) as the
// engine's storage options.
#ifndef HOIST_PYTHON_PY_STORAGE_H_
#define HOIST_PYTHON_PY_STORAGE_H_

#include <map>
#include <string>

#include "hoist/storage.h"

namespace hoist {

// storage_options (names to strings) as ObjectStoreOptions; ValueError for
// a name it does not have or a number that is not one. Secrets are never
// repeated in an error.
ObjectStoreOptions ObjectStoreOptionsOf(
    const std::map<std::string, std::string>& given);

// storage_options as the StorageOptions of a URL (either kind of object
// store).
StorageOptions StorageOptionsOf(
    const std::map<std::string, std::string>& given);

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_STORAGE_H_
