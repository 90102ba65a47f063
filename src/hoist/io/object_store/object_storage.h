// Object stores (S3, GCS) as a Storage, through Apache Arrow's C++
// filesystems (arrow::fs::FileSystem). Private to io/: the layer above opens
// one with OpenStorage() and asks only its capabilities().
//
// An object store has no rename, no directories, no fsync and no lock, so:
//   - a file is an object, written once from start to end (sequential():
//     streamed in parts of 10 MiB, each whole part sent straight from the
//     caller's buffer, one request at a time per file; what is less than a
//     part waits in one 10 MiB buffer); Sync() completes the upload and
//     Close() without Sync() aborts it, leaving no object;
//   - a file is read by byte range (one ranged GET per ReadAt, straight into
//     the caller's buffer, from any number of threads at once);
//   - a directory is the prefix of the objects under it: CreateDir and
//     SyncDir have nothing to do, Rename is kUnimplemented;
//   - the commit writes in place: BeginDir returns the directory itself
//     (after removing what an uncommitted earlier save left there), and
//     CommitDir writes the marker object last, one atomic put, after every
//     process's objects are complete (the checkpoint layer's barrier sees
//     to that): until then no reader counts the directory;
//   - LockFile writes the lock object with its holder, for the job's other
//     processes to check that they see the same store; it excludes nobody
//     (no conditional write: see docs/object-storage.md).
// Paths are URLs ("s3://bucket/key"); every error names the URL and the
// operation, never a credential. Thread-safe.
#ifndef HOIST_IO_OBJECT_STORE_OBJECT_STORAGE_H_
#define HOIST_IO_OBJECT_STORE_OBJECT_STORAGE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hoist/storage.h"

namespace arrow::fs {
class FileSystem;
}

namespace hoist {

// A Storage over `fs`, for URLs that start with `scheme` ("s3://"), whose
// preferred_writer_streams() is `writer_streams` (the backend's: each
// object being uploaded has one request in flight).
std::unique_ptr<Storage> MakeObjectStorage(
    std::shared_ptr<arrow::fs::FileSystem> fs, std::string scheme,
    int writer_streams);

// The S3 and GCS backends (s3_storage.cc, gcs_storage.cc): Arrow's
// filesystem for `options`, then the environment.
absl::StatusOr<std::unique_ptr<Storage>> MakeS3Storage(
    const ObjectStoreOptions& options);
absl::StatusOr<std::unique_ptr<Storage>> MakeGcsStorage(
    const ObjectStoreOptions& options);

// Removes `scheme` ("http://") from the front of `url`, if it is there.
bool ConsumeScheme(std::string& url, std::string_view scheme);

}  // namespace hoist

#endif  // HOIST_IO_OBJECT_STORE_OBJECT_STORAGE_H_
