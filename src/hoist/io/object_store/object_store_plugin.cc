// The object-store module (HOIST_OBJECT_STORE_PLUGIN builds: the Python
// wheel): S3 and GCS, with Arrow's libraries, in a shared object of their
// own that open_storage.cc loads at the first s3:// or gs:// root, so that
// `import hoist` and every POSIX feature work without pyarrow installed.
// Its entry is the one symbol it exports.
#include "hoist/io/object_store/object_store_plugin.h"

#include <string_view>

#include "hoist/io/object_store/object_storage.h"

extern "C" __attribute__((visibility("default"))) void
hoist_open_object_store_v1(
    const char* scheme, const hoist::ObjectStoreOptions* options,
    absl::StatusOr<std::unique_ptr<hoist::Storage>>* out) {
  *out = std::string_view(scheme) == "s3" ? hoist::MakeS3Storage(*options)
                                          : hoist::MakeGcsStorage(*options);
}
