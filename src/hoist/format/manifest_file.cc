// Reading and writing MANIFEST.json in a step directory, through Storage.
#include "hoist/format/manifest_file.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/format/layout.h"

namespace hoist {

absl::StatusOr<Manifest> ReadManifestFile(Storage& storage,
                                          const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, std::string(kManifestFileName));
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                   storage.OpenReadable(path));
  ASSIGN_OR_RETURN(int64_t size, file->Size());
  // Checked before reading: the decoder checks again what it is given.
  if (size > kMaxManifestBytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: %d bytes, more than a manifest may have (%d)",
                        path, size, kMaxManifestBytes));
  }
  std::string text(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(file->ReadAt(
      0, absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()),
                             text.size())));
  absl::StatusOr<Manifest> manifest = DecodeManifest(text);
  if (!manifest.ok()) {
    return absl::Status(
        manifest.status().code(),
        absl::StrCat(step_dir, "/", manifest.status().message()));
  }
  if (const std::optional<int64_t> step = StepOfDir(step_dir);
      step && *step != manifest->step) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the manifest is of step %d, but its directory names step %d", path,
        manifest->step, *step));
  }
  return manifest;
}

}  // namespace hoist
