// Several ranks' bytes as one message, and back: how a coordinator carries
// an all-gather's or a scatter's pieces (each as u64 length | bytes).
#ifndef HOIST_COORD_PIECES_H_
#define HOIST_COORD_PIECES_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace hoist {

// Appends every piece to `out`.
void AppendPieces(std::string& out, const std::vector<std::string>& pieces);

// The `count` pieces AppendPieces wrote into `in`; kInternal, naming
// `what`, for bytes that are not that.
absl::StatusOr<std::vector<std::string>> SplitPieces(std::string_view in,
                                                     size_t count,
                                                     std::string_view what);

}  // namespace hoist

#endif  // HOIST_COORD_PIECES_H_
