// A step directory's MANIFEST.json, read through Storage: whole, its head
// only, or its head and the sections of some arrays (a split manifest,
// hoist/3, is read by range; hoist/1 and hoist/2 are read whole).
#ifndef HOIST_FORMAT_MANIFEST_FILE_H_
#define HOIST_FORMAT_MANIFEST_FILE_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

// Reads and validates `step_dir`'s MANIFEST.json (see DecodeManifest).
// kDataLoss also when the directory's name (step_N, or a temporary name)
// says another step than the manifest does, and for a document larger than
// kMaxManifestBytes (checked as it is read); the file must be a regular
// file (Storage::OpenReadable).
absl::StatusOr<Manifest> ReadManifestFile(Storage& storage,
                                          const std::string& step_dir);

// Its head (see ManifestHead): of a split manifest, the head alone, read
// from the file's first bytes; of another, the whole manifest. Errors as
// ReadManifestFile's, for what it reads.
absl::StatusOr<ManifestHead> ReadManifestHead(Storage& storage,
                                              const std::string& step_dir);

// Reads the sections of `arrays` (indices into head.manifest.arrays,
// ascending) of `step_dir`'s split manifest, whose head is `head`, into
// `head` (neighbouring ones in one read). Nothing when `head` is not split
// (its extents are all there). kDataLoss as ReadManifestFile, and when the
// file no longer has the size it had when `head` was read.
absl::Status ReadManifestSections(Storage& storage, const std::string& step_dir,
                                  ManifestHead& head,
                                  const std::vector<size_t>& arrays);

// The indices of the arrays of `head` called `names`, ascending.
std::vector<size_t> ArraysNamed(const ManifestHead& head,
                                const absl::flat_hash_set<std::string>& names);

// The manifest with only the arrays called `names` (those the step has, in
// the manifest's order; names it lacks are left to the caller to report),
// extents and all: of a split manifest, only their sections are read
// (neighbouring sections in one request). Errors as ReadManifestFile's,
// for what it reads.
absl::StatusOr<Manifest> ReadManifestArrays(
    Storage& storage, const std::string& step_dir,
    const absl::flat_hash_set<std::string>& names);

// What retention needs of a step: only the arrays whose head says some of
// their bytes are other steps' (of a split manifest, those sections alone
// are read). Errors as
// ReadManifestFile's, for what it reads.
absl::StatusOr<Manifest> ReadManifestReferences(Storage& storage,
                                                const std::string& step_dir);

}  // namespace hoist

#endif  // HOIST_FORMAT_MANIFEST_FILE_H_
