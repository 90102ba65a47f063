// Names inside a checkpoint root (format hoist/1):
//   ROOT/step_00001000/MANIFEST.json        committed
//   ROOT/step_00001000/data/r00000_w00.bin  data files
//   ROOT/.step_00001000.tmp-<nonce>/        a save in progress
#ifndef HOIST_CHECKPOINT_LAYOUT_H_
#define HOIST_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace hoist {

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
// The step a directory's last path component names, committed or
// temporary, or nullopt.
std::optional<int64_t> StepOfDir(std::string_view path);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_LAYOUT_H_
