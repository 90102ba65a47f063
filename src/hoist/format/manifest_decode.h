// DecodeManifest's two ways, for the checks that hold them to each other
// (the manifest fuzzer). Private to format/ and its tests.
#ifndef HOIST_FORMAT_MANIFEST_DECODE_H_
#define HOIST_FORMAT_MANIFEST_DECODE_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "hoist/manifest.h"

namespace hoist {

// DecodeManifest the whole-document way only: the same manifest, or the
// same error, as DecodeManifest, which decodes hoist's own key order one
// array at a time and comes here for anything else.
absl::StatusOr<Manifest> DecodeManifestDocument(std::string_view json);

}  // namespace hoist

#endif  // HOIST_FORMAT_MANIFEST_DECODE_H_
