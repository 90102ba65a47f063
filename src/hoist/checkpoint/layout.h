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
// ".step_00001000.tmp-<nonce>" with a fresh random nonce.
std::string TmpStepDirName(int64_t step);
// True for names TmpStepDirName makes.
bool IsTmpStepDirName(std::string_view name);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_LAYOUT_H_
