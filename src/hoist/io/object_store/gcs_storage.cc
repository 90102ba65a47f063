// The GCS backend: Arrow's GcsFileSystem behind ObjectStorage. Credentials
// are Google's application default credentials; STORAGE_EMULATOR_HOST (or
// ObjectStoreOptions::endpoint) points it at another server, such as an
// emulator, which takes no credentials.
#include <arrow/filesystem/gcsfs.h>

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "hoist/io/object_store/object_storage.h"

namespace hoist {

absl::StatusOr<std::unique_ptr<Storage>> MakeGcsStorage(
    const ObjectStoreOptions& options) {
  std::string endpoint = options.endpoint;
  if (endpoint.empty()) {
    const char* emulator = std::getenv("STORAGE_EMULATOR_HOST");
    if (emulator != nullptr) endpoint = emulator;
  }
  arrow::fs::GcsOptions gcs = endpoint.empty()
                                  ? arrow::fs::GcsOptions::Defaults()
                                  : arrow::fs::GcsOptions::Anonymous();
  if (!endpoint.empty()) {
    gcs.scheme = "https";
    if (ConsumeScheme(endpoint, "http://")) gcs.scheme = "http";
    ConsumeScheme(endpoint, "https://");
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    gcs.endpoint_override = endpoint;
  }
  gcs.retry_limit_seconds =
      options.request_timeout_s > 0 ? options.request_timeout_s : 60;
  arrow::Result<std::shared_ptr<arrow::fs::GcsFileSystem>> fs =
      arrow::fs::GcsFileSystem::Make(gcs);
  if (!fs.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GCS: %s", fs.status().message()));
  }
  // Sixteen objects at once per process: an object is a resumable upload,
  // one request in flight, each a round trip (and on fake-gcs-server a copy
  // of the object so far: docs/object-storage.md), while each costs only
  // Arrow's 256 KiB buffer; more, smaller objects keep the server busier.
  return MakeObjectStorage(*std::move(fs), "gs://", /*writer_streams=*/16);
}

}  // namespace hoist
