// REFERENCES.json in a step directory: the data files of other steps that
// the step's manifest reads (its deltas' references), written into the
// step before its commit. Retention and deletes learn from it what a kept
// step holds in other steps' directories by reading a few hundred bytes,
// where decoding its manifest takes seconds at 100,000 arrays.
//
//   {"format": "hoist-references/1", "step": 7,
//    "files": ["step_00000003/data/r00000_w00.bin", ...],
//    "xxh3": "<16 hex digits>"}
//
// `files` are relative to the root, sorted, each in another step's
// directory; `xxh3` is the XXH3-64 of the files, each followed by a line
// break. The file says nothing the manifest does not: a step without one
// (written by an older hoist, an import, a local-tier part) or whose file
// does not check is read through its manifest instead.
#ifndef HOIST_FORMAT_REFERENCES_FILE_H_
#define HOIST_FORMAT_REFERENCES_FILE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

inline constexpr std::string_view kReferencesFileName = "REFERENCES.json";
inline constexpr std::string_view kReferencesFormat = "hoist-references/1";
// The most a reader reads of one: a step references at most a few files of
// each writer of each step before it.
inline constexpr int64_t kMaxReferencesBytes = int64_t{64} << 20;

// The files of other steps that `manifest` reads, relative to the root
// ("step_00000003/data/r00000_w00.bin"), sorted, each once.
std::vector<std::string> FilesReferenced(const Manifest& manifest);

// The step whose directory a file of FilesReferenced lies in
// ("step_00000003/data/..." -> 3), or nullopt.
std::optional<int64_t> StepOfReferencedFile(std::string_view file);

// The file's text for step `step` referencing `files` (FilesReferenced).
std::string EncodeReferences(int64_t step,
                             const std::vector<std::string>& files);

// The files of `text`, checked: kDataLoss for anything that does not (not
// JSON, another format or step, a file that is not a safe relative path in
// another step's directory, files out of order, the hash).
absl::StatusOr<std::vector<std::string>> DecodeReferences(std::string_view text,
                                                          int64_t step);

// Writes `step_dir`/REFERENCES.json for step `step`, durably.
absl::Status WriteReferencesFile(Storage& storage, const std::string& step_dir,
                                 int64_t step,
                                 const std::vector<std::string>& files);

// Reads `step_dir`/REFERENCES.json of step `step`: kNotFound where there is
// none, kDataLoss where it does not check (DecodeReferences), or is larger
// than kMaxReferencesBytes.
absl::StatusOr<std::vector<std::string>> ReadReferencesFile(
    Storage& storage, const std::string& step_dir, int64_t step);

}  // namespace hoist

#endif  // HOIST_FORMAT_REFERENCES_FILE_H_
