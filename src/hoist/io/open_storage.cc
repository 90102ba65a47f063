// OpenStorage, the one place a URL is parsed: an object store for an s3://
// or gs:// URL, else the local filesystem through the engine chosen. The object
// stores are either linked in (the C++ builds) or, in HOIST_OBJECT_STORE_PLUGIN
// builds (the Python wheel), a module of their own loaded at the first such
// root, found beside the binary this code is in.
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/storage.h"
#ifdef HOIST_OBJECT_STORE_PLUGIN
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "hoist/io/object_store/object_store_plugin.h"
#elif defined(HOIST_OBJECT_STORE)
#include "hoist/io/object_store/object_storage.h"
#endif

namespace hoist {
#ifdef HOIST_OBJECT_STORE_PLUGIN
namespace {

// The directory of the binary (the Python extension, or the CLI) that holds
// this function.
std::string DirOfThisBinary() {
  Dl_info info{};
  std::string path;
  if (dladdr(reinterpret_cast<void*>(&DirOfThisBinary), &info) != 0 &&
      info.dli_fname != nullptr &&
      std::strcmp(info.dli_fname, program_invocation_name) != 0) {
    path = info.dli_fname;  // a shared object: the path it was loaded by
  } else {
    // The main program: dladdr names it by argv[0].
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) path.assign(exe, n);
  }
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The module's entry. Loaded at the first call that finds it, and never
// unloaded (Storages it made may live until exit); a failure is not kept, so
// a process that installs pyarrow later can still open one.
using OpenObjectStoreFn = decltype(&hoist_open_object_store_v1);

absl::StatusOr<OpenObjectStoreFn> ObjectStoreModule(const std::string& root) {
  static std::atomic<OpenObjectStoreFn> loaded{nullptr};
  if (OpenObjectStoreFn entry = loaded.load()) return entry;
  const std::string path = JoinPath(DirOfThisBinary(), kObjectStoreModule);
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) {
    const std::string why = dlerror();
    if (absl::StrContains(why, "libarrow")) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: object storage needs pyarrow %s installed beside hoist (pip "
          "install 'hoist-checkpoint[s3]', or 'pyarrow==%s.*'): %s",
          root, HOIST_PYARROW_MAJOR, HOIST_PYARROW_MAJOR, why));
    }
    return absl::InternalError(absl::StrFormat(
        "%s: cannot load hoist's object-store module: %s", root, why));
  }
  void* entry = dlsym(module, kObjectStoreEntry);
  if (entry == nullptr) {
    return absl::InternalError(
        absl::StrFormat("%s: %s lacks its entry (another hoist version?): %s",
                        root, path, dlerror()));
  }
  loaded.store(reinterpret_cast<OpenObjectStoreFn>(entry));
  return loaded.load();
}

}  // namespace
#endif

bool ObjectStoresBuiltIn() {
#ifdef HOIST_OBJECT_STORE
  return true;
#else
  return false;
#endif
}

namespace {

// An object store's URL, checked: "s3" or "gs", and a bucket.
absl::StatusOr<std::string> ObjectStoreScheme(const std::string& url) {
  const size_t colon = url.find("://");
  const std::string scheme = url.substr(0, colon);
  if (scheme != "s3" && scheme != "gs") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unknown scheme '%s://' (a root is a local path, s3://BUCKET/"
        "PREFIX or gs://BUCKET/PREFIX)",
        url, scheme));
  }
  const std::string rest = url.substr(colon + 3);
  if (rest.empty() || rest.front() == '/' ||
      rest.substr(0, rest.find('/')).empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: no bucket (%s://BUCKET/PREFIX)", url, scheme));
  }
  return scheme;
}

absl::StatusOr<std::unique_ptr<Storage>> OpenObjectStore(
    const std::string& url, const std::string& scheme,
    const ObjectStoreOptions& options) {
#ifdef HOIST_OBJECT_STORE_PLUGIN
  ASSIGN_OR_RETURN(OpenObjectStoreFn open, ObjectStoreModule(url));
  absl::StatusOr<std::unique_ptr<Storage>> storage;
  open(scheme.c_str(), &options, &storage);
  return storage;
#elif defined(HOIST_OBJECT_STORE)
  (void)url;
  if (scheme == "s3") return MakeS3Storage(options);
  return MakeGcsStorage(options);
#else
  (void)scheme;
  (void)options;
  return absl::UnimplementedError(absl::StrFormat(
      "%s: this build of hoist has no object storage. It is built in when "
      "CMake finds pyarrow %s (`pip install 'pyarrow==%s.*'` into the "
      "Python it uses: the project's .venv, or -DHOIST_ARROW_PYTHON=PATH), "
      "outside sanitizer builds; see docs/object-storage.md",
      url, HOIST_PYARROW_MAJOR, HOIST_PYARROW_MAJOR));
#endif
}

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> OpenLocalStorage(
    const StorageOptions& options) {
  if (options.io == IoEngine::kIoUring) return MakeIoUringStorage();
  return MakePosixStorage();
}

absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(
    const std::string& url, const StorageOptions& options) {
  if (url.find("://") == std::string::npos) return OpenLocalStorage(options);
  ASSIGN_OR_RETURN(const std::string scheme, ObjectStoreScheme(url));
  return OpenObjectStore(url, scheme,
                         scheme == "s3" ? options.s3 : options.gcs);
}

bool IsObjectStoreUrl(const std::string& path) {
  return absl::StartsWith(path, "s3://") || absl::StartsWith(path, "gs://");
}

absl::StatusOr<std::unique_ptr<Storage>> OpenStorageFor(
    const std::string& root, const ObjectStoreOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<Storage>>()>& local) {
  if (root.find("://") == std::string::npos) return local();
  return OpenStorage(root, {.s3 = options, .gcs = options});
}

}  // namespace hoist
