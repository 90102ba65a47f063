// Storage's default methods: the commit of a filesystem whose rename is
// atomic (POSIX, MemoryStorage), written once here in terms of the
// primitives, so every such Storage (and a fault-injecting wrapper, whose
// primitives fail on cue) runs the same protocol. Object stores override it
// (object_storage.cc).
//
// A directory `dir` committed through here, step by step:
//   1. BeginDir: `tmp` (a sibling of `dir`) and its subdirectories are
//      created; every file is written beneath `tmp` and synced by its
//      writer.
//   2. CommitDir: the marker is written to MARKER.tmp, synced and renamed
//      to MARKER; each subdirectory and `tmp` are synced, so the marker and
//      every file's name are durable before the directory becomes visible.
//   3. CommitDir: `tmp` is renamed to `dir` and the parent synced: from the
//      rename's durability on, `dir` exists. When replacing, the committed
//      `dir` is first renamed to `aside`, and removed once the new one is
//      durable; a crash between the two renames leaves the new directory
//      complete under `tmp` (its marker in place) and the old one aside,
//      which the checkpoint root's recovery puts right.
// RemoveCommitted renames `dir` aside, syncs the parent, then removes it:
// a crash leaves the aside name, never a half-removed committed directory.
#include "hoist/storage.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/io/errno_status.h"

namespace hoist {
namespace {

// The directory holding `path` ("/" for "/a", "." for "a").
std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return path.substr(0, std::max<size_t>(slash, 1));
}

}  // namespace

absl::Status NotInsideError(const std::string& path) {
  return absl::DataLossError(absl::StrFormat(
      "%s: not a directory inside the checkpoint (missing, or a link)", path));
}

absl::StatusOr<std::unique_ptr<ReadableFile>> Storage::OpenReadableBeneath(
    const std::string& dir, const std::string& relative) {
  std::string path = dir;
  size_t begin = 0;
  for (size_t slash; (slash = relative.find('/', begin)) != std::string::npos;
       begin = slash + 1) {
    path = JoinPath(path, relative.substr(begin, slash - begin));
    ASSIGN_OR_RETURN(bool is_dir, IsDir(path));
    if (!is_dir) return NotInsideError(path);
  }
  return OpenReadable(JoinPath(dir, relative));
}

absl::Status Storage::CreateDirs(const std::string& path) {
  std::vector<std::string> missing;  // deepest first
  std::string at = path;
  while (at.size() > 1 && at.back() == '/') at.pop_back();
  while (at != "/" && at != ".") {
    ASSIGN_OR_RETURN(bool exists, Exists(at));
    if (exists) break;
    missing.push_back(at);
    at = Parent(at);
  }
  for (size_t i = missing.size(); i-- > 0;) {
    absl::Status created = CreateDir(missing[i]);
    if (!created.ok() && !absl::IsAlreadyExists(created)) return created;
    RETURN_IF_ERROR(SyncDir(Parent(missing[i])));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Storage::BeginDir(
    const std::string& dir, const std::string& tmp,
    absl::Span<const std::string> subdirs, const std::string& marker,
    bool replace) {
  (void)dir;
  (void)marker;
  (void)replace;  // the committed `dir` stays until CommitDir
  RETURN_IF_ERROR(CreateDir(tmp));
  for (const std::string& subdir : subdirs) {
    if (absl::Status made = CreateDir(JoinPath(tmp, subdir)); !made.ok()) {
      RemoveAll(tmp).IgnoreError();
      return made;
    }
  }
  return tmp;
}

absl::Status Storage::CommitDir(const std::string& written,
                                const std::string& dir,
                                const std::string& marker,
                                std::string_view marker_bytes,
                                const std::string& aside) {
  // 2. The marker, durable under its own name, and every name in `written`.
  const std::string marker_tmp = JoinPath(written, marker + ".tmp");
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   OpenWritable(marker_tmp));
  RETURN_IF_ERROR(file->WriteAt(
      0, absl::Span<const uint8_t>(
             reinterpret_cast<const uint8_t*>(marker_bytes.data()),
             marker_bytes.size())));
  RETURN_IF_ERROR(file->Sync());
  RETURN_IF_ERROR(file->Close());
  RETURN_IF_ERROR(Rename(marker_tmp, JoinPath(written, marker)));
  ASSIGN_OR_RETURN(std::vector<std::string> names, List(written));
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(bool is_dir, IsDir(JoinPath(written, name)));
    if (is_dir) RETURN_IF_ERROR(SyncDir(JoinPath(written, name)));
  }
  RETURN_IF_ERROR(SyncDir(written));
  // 3. The rename that publishes.
  return PublishByRename(*this, written, dir, aside);
}

absl::Status PublishByRename(Storage& storage, const std::string& written,
                             const std::string& dir, const std::string& aside) {
  const std::string parent = Parent(dir);
  ASSIGN_OR_RETURN(bool exists, storage.Exists(dir));
  bool moved_aside = false;
  if (exists) {
    if (aside.empty()) {
      return absl::AlreadyExistsError(
          absl::StrFormat("%s was committed while this one was written", dir));
    }
    RETURN_IF_ERROR(storage.Rename(dir, aside));
    moved_aside = true;
  }
  if (absl::Status renamed = storage.Rename(written, dir); !renamed.ok()) {
    if (moved_aside) storage.Rename(aside, dir).IgnoreError();
    return renamed;
  }
  if (absl::Status synced = storage.SyncDir(parent); !synced.ok()) {
    // The rename may not be durable: take it back, so that what is visible
    // agrees with the error (the old directory returns from aside).
    storage.Rename(dir, written).IgnoreError();
    if (moved_aside) storage.Rename(aside, dir).IgnoreError();
    return synced;
  }
  if (moved_aside) RETURN_IF_ERROR(storage.RemoveAll(aside));
  return absl::OkStatus();
}

absl::StatusOr<bool> Storage::HasMarker(const std::string& dir,
                                        const std::string& marker) {
  return Exists(JoinPath(dir, marker));
}

absl::Status Storage::RemoveCommitted(const std::string& dir,
                                      const std::string& aside,
                                      const std::string& marker) {
  (void)marker;  // the rename takes it away with the rest
  ASSIGN_OR_RETURN(bool exists, Exists(dir));
  if (!exists)
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  RETURN_IF_ERROR(Rename(dir, aside));
  RETURN_IF_ERROR(SyncDir(Parent(dir)));
  return RemoveAll(aside);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

}  // namespace hoist
