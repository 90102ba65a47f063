// Which Storage holds a root: an object store for an s3:// or gs:// URL,
// else the local filesystem the caller chose.
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "hoist/storage.h"
#ifdef HOIST_OBJECT_STORE
#include "hoist/io/object_storage.h"
#endif

namespace hoist {

bool ObjectStoresBuiltIn() {
#ifdef HOIST_OBJECT_STORE
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Storage>> OpenStorageFor(
    const std::string& root, const ObjectStoreOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<Storage>>()>& local) {
  const size_t colon = root.find("://");
  if (colon == std::string::npos) return local();
  const std::string scheme = root.substr(0, colon);
  if (scheme != "s3" && scheme != "gs") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unknown scheme '%s://' (a root is a local path, s3://BUCKET/"
        "PREFIX or gs://BUCKET/PREFIX)",
        root, scheme));
  }
  const std::string rest = root.substr(colon + 3);
  if (rest.empty() || rest.front() == '/' ||
      rest.substr(0, rest.find('/')).empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: no bucket (%s://BUCKET/PREFIX)", root, scheme));
  }
#ifdef HOIST_OBJECT_STORE
  if (scheme == "s3") return MakeS3Storage(options);
  return MakeGcsStorage(options);
#else
  (void)options;
  return absl::UnimplementedError(absl::StrFormat(
      "%s: this build of hoist has no object storage. It is built in when "
      "CMake finds pyarrow %s (`pip install 'pyarrow==26.*'` into the "
      "Python it uses: the project's .venv, or -DHOIST_ARROW_PYTHON=PATH), "
      "outside sanitizer builds; see docs/object-storage.md",
      root, "26"));
#endif
}

}  // namespace hoist
