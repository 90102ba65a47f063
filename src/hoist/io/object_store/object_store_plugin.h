// The contract between open_storage.cc and the object-store module it loads
// (object_store_plugin.cc) in HOIST_OBJECT_STORE_PLUGIN builds. Both sides
// are built from one tree by one compiler, against one abseil, so a C++ type
// may cross. The entry's name carries a version: a change to its signature
// or to ObjectStoreOptions changes the name.
#ifndef HOIST_IO_OBJECT_STORE_OBJECT_STORE_PLUGIN_H_
#define HOIST_IO_OBJECT_STORE_OBJECT_STORE_PLUGIN_H_

#include <memory>

#include "absl/status/statusor.h"
#include "hoist/storage.h"

namespace hoist {

// The module's file name, in the directory of the binary that loads it.
inline constexpr char kObjectStoreModule[] = "libhoist_object_store.so";
// Its entry, declared below.
inline constexpr char kObjectStoreEntry[] = "hoist_open_object_store_v1";

}  // namespace hoist

// Sets `*out` to the Storage of `scheme` ("s3" or "gs").
extern "C" void hoist_open_object_store_v1(
    const char* scheme, const hoist::ObjectStoreOptions* options,
    absl::StatusOr<std::unique_ptr<hoist::Storage>>* out);

#endif  // HOIST_IO_OBJECT_STORE_OBJECT_STORE_PLUGIN_H_
