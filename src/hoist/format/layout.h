// Every name inside a checkpoint root (format hoist/2), made and parsed here
// and nowhere else:
//   ROOT/.hoist.lock                            the root's lock
//   ROOT/step_00001000/                         a committed step
//   ROOT/step_00001000/MANIFEST.json            its manifest
//   (kManifestFileName) ROOT/step_00001000/data/r00000_w00.bin      data:
//   process 0, writer stream 0 ROOT/.step_00001000.tmp-<16 hex digits>/    a
//   save in progress ROOT/.step_00001000.tmp-<16 hex>.old/       a step an
//   overwrite moved aside ROOT/.step_00001000.tmp-<16 hex>.del/       a step
//   being deleted
#ifndef HOIST_FORMAT_LAYOUT_H_
#define HOIST_FORMAT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "hoist/manifest.h"
#include "hoist/storage.h"

namespace hoist {

inline constexpr char kLockFileName[] = ".hoist.lock";
inline constexpr char kDataDirName[] = "data";
inline constexpr char kManifestTmpSuffix[] = ".tmp";  // MANIFEST.json.tmp

// "data/r00000_w00.bin": the file of `process`'s writer `stream`, relative
// to the step directory. With `spread` (a storage whose request rate is
// limited per key prefix: StorageCapabilities::prefix_rate_limited), under
// one of 256 prefixes chosen by a hash of that name, "data/3f/r00000_w00.bin",
// so that a large job's uploads spread over them.
std::string DataFileName(int process, int stream, bool spread = false);

// Whether a step's data files on `storage` go under hashed prefixes
// (DataFileName's `spread`): where requests are limited per key prefix.
bool SpreadsDataFiles(const Storage& storage);

// Every data file of the step directory `dir`, relative to it: data/NAME,
// and data/HH/NAME under a hashed prefix (DataFileName). None when there
// is no data/.
absl::StatusOr<std::vector<std::string>> ListDataFiles(Storage& storage,
                                                       const std::string& dir);

// "step_00001000" (at least 8 digits).
std::string StepDirName(int64_t step);
// The step of a committed step directory's name, or nullopt.
std::optional<int64_t> ParseStepDirName(std::string_view name);
// ".step_00001000.tmp-<nonce>" with a fresh random nonce (16 hex digits).
std::string TmpStepDirName(int64_t step);
// A temporary directory's role, from its name's suffix:
//   TmpStepDirName(step)           a save in progress (kSave)
//   TmpStepDirName(step) + ".old"  a step an overwrite moved aside (kAside)
//   TmpStepDirName(step) + ".del"  a step being deleted (kDeleting)
enum class TmpKind { kSave, kAside, kDeleting };
inline constexpr char kAsideSuffix[] = ".old";
inline constexpr char kDeletingSuffix[] = ".del";
struct TmpStepDir {
  int64_t step = 0;
  TmpKind kind = TmpKind::kSave;
};
// The step and role of a name made as above, or nullopt for any other name
// (parsed exactly: one spelling of the step, 16 lowercase hex digits).
std::optional<TmpStepDir> ParseTmpStepDirName(std::string_view name);
// True for names TmpStepDirName makes, with or without a suffix.
bool IsTmpStepDirName(std::string_view name);
// Where the bytes of an extent of the step in `step_dir` lie: the
// directory to open them beneath (Storage::OpenReadableBeneath) and the
// path beneath it. Its own bytes: (step_dir, file); another step's (a
// reference): (the root, "step_N/file"), so no link is followed on the way
// into that step either. `path` is the two joined: one name per file.
struct ExtentPlace {
  std::string dir;
  std::string relative;
  std::string path;
};
ExtentPlace PlaceOfExtent(const std::string& step_dir,
                          const ManifestExtent& extent);
// The directory holding `step_dir` (".../ROOT" of ".../ROOT/step_N").
std::string ParentDir(const std::string& step_dir);

// The step a directory's last path component names, committed or
// temporary, or nullopt.
std::optional<int64_t> StepOfDir(std::string_view path);

}  // namespace hoist

#endif  // HOIST_FORMAT_LAYOUT_H_
