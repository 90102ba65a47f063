// libFuzzer target: manifest decoding (hoist/1, hoist/2 and split hoist/3).
// Any input either fails with a status or decodes to a manifest that
// encodes, as one document and split, and decodes back to itself; the
// streamed decoding and the whole document's agree (the same manifest, or
// the same error); nothing crashes, hangs, or allocates more than a small
// multiple of the input. The same input as a step's REFERENCES.json either
// fails with a status or lists files that encode and decode back to
// themselves.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "hoist/format/manifest_decode.h"
#include "hoist/format/references_file.h"
#include "hoist/manifest.h"

namespace {

void CheckReferences(std::string_view text) {
  absl::StatusOr<std::vector<std::string>> files =
      hoist::DecodeReferences(text, 7);
  if (!files.ok()) return;
  absl::StatusOr<std::vector<std::string>> again =
      hoist::DecodeReferences(hoist::EncodeReferences(7, *files), 7);
  if (!again.ok() || *again != *files) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  CheckReferences(text);
  absl::StatusOr<hoist::Manifest> manifest = hoist::DecodeManifest(text);
  if (!manifest.ok()) {
    // The same error the whole document's decoding gives.
    if (hoist::DecodeManifestDocument(text).status() != manifest.status()) {
      std::abort();
    }
    return 0;
  }
  // What decodes encodes, and decodes back to itself.
  absl::StatusOr<std::string> encoded = hoist::EncodeManifest(*manifest);
  if (!encoded.ok()) std::abort();
  absl::StatusOr<hoist::Manifest> again = hoist::DecodeManifest(*encoded);
  if (!again.ok() || !(*again == *manifest)) std::abort();
  // Split (unless its hashes are hoist/1's), the same.
  absl::StatusOr<std::string> split =
      hoist::EncodeManifest(*manifest, {.split_above_extents = 0});
  if (!split.ok()) std::abort();
  absl::StatusOr<hoist::Manifest> unsplit = hoist::DecodeManifest(*split);
  if (!unsplit.ok() || !(*unsplit == *manifest)) std::abort();
  // What the streamed decoding read, the whole document's reads alike.
  absl::StatusOr<hoist::Manifest> whole = hoist::DecodeManifestDocument(text);
  if (!whole.ok() || !(*whole == *manifest)) std::abort();
  return 0;
}
