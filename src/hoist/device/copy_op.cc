#include "hoist/device/copy_op.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/base/checked_math.h"

namespace hoist {

absl::StatusOr<std::vector<CopyOp>> NormalizeCopyOps(
    absl::Span<const CopyOp> ops) {
  std::vector<CopyOp> out;
  out.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    CopyOp op = ops[i];
    const auto bad = [&](const char* what) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "copy op %d of %d (%d rows x %d bytes, pitches %d/%d): %s", i,
          ops.size(), op.rows, op.width_bytes, op.src_pitch, op.dst_pitch,
          what));
    };
    if (op.width_bytes < 0 || op.rows < 0) return bad("negative size");
    if (op.width_bytes == 0 || op.rows == 0) continue;
    if (op.src == nullptr || op.dst == nullptr) return bad("null pointer");
    if (!CheckedMul(op.width_bytes, op.rows)) return bad("size overflows");
    if (op.rows > 1) {
      if (op.src_pitch < op.width_bytes || op.dst_pitch < op.width_bytes) {
        return bad("pitch smaller than the row width");
      }
      if (op.src_pitch == op.width_bytes && op.dst_pitch == op.width_bytes) {
        op.width_bytes *= op.rows;
        op.rows = 1;
      }
    }
    if (op.rows == 1) {
      op.src_pitch = op.width_bytes;
      op.dst_pitch = op.width_bytes;
    }
    out.push_back(op);
  }
  return out;
}

}  // namespace hoist
