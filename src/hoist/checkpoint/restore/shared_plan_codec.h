// What a shared restore's ranks and rank 0 send each other (see the
// protocol at the top of shared_restore.cc): each rank's destination boxes,
// gathered at rank 0, and the extents each rank's boxes meet, in the view
// rank 0 scatters it. Binary, native byte order (every rank of a job runs
// the same build); a decoder checks every count and bound against the
// manifest's head before it trusts them.
#ifndef HOIST_CHECKPOINT_RESTORE_SHARED_PLAN_CODEC_H_
#define HOIST_CHECKPOINT_RESTORE_SHARED_PLAN_CODEC_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/box.h"
#include "hoist/checkpoint_types.h"
#include "hoist/format/manifest_index.h"
#include "hoist/manifest.h"

namespace hoist {

// Appends fixed-size values to a string.
class WireWriter {
 public:
  explicit WireWriter(std::string& out) : out_(out) {}
  template <typename T>
  void Put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void PutString(std::string_view s) {
    Put(static_cast<int32_t>(s.size()));
    out_.append(s);
  }

 private:
  std::string& out_;
};

// Takes them back; false once the input runs out.
class WireReader {
 public:
  explicit WireReader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Take(T& value) {
    if (in_.size() < sizeof value) return false;
    std::memcpy(&value, in_.data(), sizeof value);
    in_.remove_prefix(sizeof value);
    return true;
  }
  bool TakeString(std::string& s) {
    int32_t size = 0;
    if (!Take(size) || size < 0 || static_cast<size_t>(size) > in_.size()) {
      return false;
    }
    s.assign(in_.substr(0, size));
    in_.remove_prefix(size);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  std::string_view in_;
};

// A destination box of one of the manifest's arrays (by its index).
struct ArrayBox {
  int array = 0;
  Box box;
};

// The boxes `targets` ask of `manifest`'s arrays (its head suffices): a
// target the manifest lacks, or whose dtype or shape differs, asks nothing
// (RestoreCheckpoint reports it), nor does an empty box or one outside its
// array.
std::string EncodeBoxes(const Manifest& manifest, const ManifestIndex& index,
                        absl::Span<const RestoreTarget> targets);
// kDataLoss naming rank `from` for anything that is not such a list for
// `manifest`'s arrays (a box outside its array, a wrong rank, bytes left).
absl::StatusOr<std::vector<ArrayBox>> DecodeBoxes(std::string_view text,
                                                  const Manifest& manifest,
                                                  int from);

// One extent with its flat id, as a view carries it (the array, hence the
// box's rank, follows from the id).
void PutExtent(WireWriter& out, int64_t id, const ManifestExtent& extent);
// The extent whose id `id` says lies in `array`: false when the input is
// short or the extent is not one of `array` (its box outside it, a length
// that is not the box's, an unsafe file name, a negative offset).
bool TakeExtent(WireReader& in, const ManifestArray& array,
                ManifestExtent& extent);

}  // namespace hoist

#endif  // HOIST_CHECKPOINT_RESTORE_SHARED_PLAN_CODEC_H_
