// libFuzzer target: manifest decoding. Any input either fails with a status
// or decodes to a manifest that encodes and decodes back to itself; nothing
// crashes, hangs, or allocates more than a small multiple of the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "hoist/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<hoist::Manifest> manifest = hoist::DecodeManifest(text);
  if (!manifest.ok()) return 0;
  // What decodes encodes, and decodes back to itself.
  absl::StatusOr<std::string> encoded = hoist::EncodeManifest(*manifest);
  if (!encoded.ok()) std::abort();
  absl::StatusOr<hoist::Manifest> again = hoist::DecodeManifest(*encoded);
  if (!again.ok() || !(*again == *manifest)) std::abort();
  return 0;
}
