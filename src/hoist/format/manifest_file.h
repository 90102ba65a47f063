// A step directory's MANIFEST.json, read and written through Storage.
#ifndef HOIST_FORMAT_MANIFEST_FILE_H_
#define HOIST_FORMAT_MANIFEST_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

// Reads and validates `step_dir`'s MANIFEST.json (at most kMaxManifestBytes,
// checked before reading; see DecodeManifest). kDataLoss also when the
// directory's name (step_N, or a temporary name) says another step than the
// manifest does; the file must be a regular file (Storage::OpenReadable).
absl::StatusOr<Manifest> ReadManifestFile(Storage& storage,
                                          const std::string& step_dir);

}  // namespace hoist

#endif  // HOIST_FORMAT_MANIFEST_FILE_H_
