// What every Coordinator has unless it does better: Gather as an AllGather
// that only the root keeps, Scatter as a Broadcast of which each rank keeps
// its piece; and the pieces' encoding (pieces.h).
#include "hoist/coordinator.h"

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/coord/pieces.h"

namespace hoist {

void AppendPieces(std::string& out, const std::vector<std::string>& pieces) {
  for (const std::string& piece : pieces) {
    const uint64_t length = piece.size();
    out.append(reinterpret_cast<const char*>(&length), sizeof length);
    out += piece;
  }
}

absl::StatusOr<std::vector<std::string>> SplitPieces(std::string_view in,
                                                     size_t count,
                                                     std::string_view what) {
  std::vector<std::string> pieces;
  pieces.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    uint64_t length = 0;
    if (in.size() < sizeof length) break;
    std::memcpy(&length, in.data(), sizeof length);
    in.remove_prefix(sizeof length);
    if (in.size() < length) break;
    pieces.emplace_back(in.substr(0, length));
    in.remove_prefix(length);
  }
  if (pieces.size() != count || !in.empty()) {
    return absl::InternalError(
        absl::StrFormat("%s: malformed pieces (%d expected)", what, count));
  }
  return pieces;
}

absl::Status Coordinator::CheckRoot(std::string_view operation,
                                    std::string_view name, int root) const {
  if (root >= 0 && root < size()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s '%s': root %d does not exist in a job of %d "
                      "processes",
                      operation, name, root, size()));
}

absl::Status Coordinator::CheckPieces(std::string_view name,
                                      size_t pieces) const {
  if (static_cast<int>(pieces) == size()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("scatter '%s': %d pieces for a job of %d processes", name,
                      pieces, size()));
}

absl::StatusOr<std::vector<std::string>> Coordinator::Gather(
    std::string_view name, std::string bytes, int root) {
  if (absl::Status checked = CheckRoot("gather", name, root); !checked.ok()) {
    return checked;
  }
  absl::StatusOr<std::vector<std::string>> all =
      AllGather(name, std::move(bytes));
  if (all.ok() && rank() != root) all->clear();
  return all;
}

absl::StatusOr<std::string> Coordinator::Scatter(
    std::string_view name, std::vector<std::string> pieces, int root) {
  if (absl::Status checked = CheckRoot("scatter", name, root); !checked.ok()) {
    return checked;
  }
  // A root with too few or too many pieces still takes part: the others
  // find them malformed, and every rank fails.
  std::string all;
  if (rank() == root) AppendPieces(all, pieces);
  absl::StatusOr<std::string> sent = Broadcast(name, std::move(all), root);
  if (rank() == root) RETURN_IF_ERROR(CheckPieces(name, pieces.size()));
  if (!sent.ok()) return sent.status();
  absl::StatusOr<std::vector<std::string>> split =
      SplitPieces(*sent, size(), name);
  if (!split.ok()) return split.status();
  return std::move((*split)[rank()]);
}

}  // namespace hoist
