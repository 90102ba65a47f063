// A shared restore's boxes and extents on the wire (shared_plan_codec.h).
#include "hoist/checkpoint/restore/shared_plan_codec.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace hoist {
namespace {

void PutInts(WireWriter& out, const std::vector<int64_t>& values) {
  for (const int64_t v : values) out.Put(v);
}

bool TakeInts(WireReader& in, size_t count, std::vector<int64_t>& values) {
  values.resize(count);
  for (int64_t& v : values) {
    if (!in.Take(v)) return false;
  }
  return true;
}

// True when `box` (of `origin` and `shape`) lies inside `array`.
bool Inside(const ManifestArray& array, const std::vector<int64_t>& origin,
            const std::vector<int64_t>& shape) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (origin[d] < 0 || shape[d] < 0 || origin[d] > array.shape[d] ||
        shape[d] > array.shape[d] - origin[d]) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string EncodeBoxes(const Manifest& manifest, const ManifestIndex& index,
                        absl::Span<const RestoreTarget> targets) {
  std::string text;
  WireWriter out(text);
  for (const RestoreTarget& target : targets) {
    const int a = index.IndexOf(target.name);
    if (a < 0) continue;
    const ManifestArray& array = manifest.arrays[a];
    if (array.dtype != target.dtype || array.shape != target.shape) continue;
    for (const RestoreDestination& dest : target.destinations) {
      if (dest.box.empty() ||
          dest.box.rank() != static_cast<int>(array.shape.size()) ||
          !Inside(array, dest.box.origin(), dest.box.shape())) {
        continue;
      }
      out.Put(static_cast<int32_t>(a));
      PutInts(out, dest.box.origin());
      PutInts(out, dest.box.shape());
    }
  }
  return text;
}

absl::StatusOr<std::vector<ArrayBox>> DecodeBoxes(std::string_view text,
                                                  const Manifest& manifest,
                                                  int from) {
  const absl::Status bad = absl::DataLossError(absl::StrFormat(
      "shared restore: rank %d sent a malformed list of boxes", from));
  WireReader in(text);
  std::vector<ArrayBox> boxes;
  std::vector<int64_t> origin, shape;
  while (!in.done()) {
    int32_t a = -1;
    if (!in.Take(a) || a < 0 || a >= static_cast<int>(manifest.arrays.size())) {
      return bad;
    }
    const ManifestArray& array = manifest.arrays[a];
    if (!TakeInts(in, array.shape.size(), origin) ||
        !TakeInts(in, array.shape.size(), shape) ||
        !Inside(array, origin, shape)) {
      return bad;
    }
    boxes.push_back({a, Box(origin, shape)});
  }
  return boxes;
}

void PutExtent(WireWriter& out, int64_t id, const ManifestExtent& extent) {
  out.Put(id);
  PutInts(out, extent.box.origin());
  PutInts(out, extent.box.shape());
  out.PutString(extent.file);
  out.Put(extent.offset_bytes);
  out.Put(extent.length_bytes);
  out.Put(extent.hash.low);
  out.Put(extent.hash.high);
  out.Put(static_cast<uint8_t>(extent.hash.wide));
  out.Put(extent.step.value_or(-1));
}

bool TakeExtent(WireReader& in, const ManifestArray& array,
                ManifestExtent& extent) {
  std::vector<int64_t> origin, shape;
  uint8_t wide = 0;
  int64_t step = -1;
  if (!TakeInts(in, array.shape.size(), origin) ||
      !TakeInts(in, array.shape.size(), shape) ||
      !Inside(array, origin, shape) || !in.TakeString(extent.file) ||
      !in.Take(extent.offset_bytes) || !in.Take(extent.length_bytes) ||
      !in.Take(extent.hash.low) || !in.Take(extent.hash.high) ||
      !in.Take(wide) || !in.Take(step) || step < -1 ||
      !IsSafeRelativePath(extent.file) || extent.offset_bytes < 0 ||
      extent.offset_bytes > kMaxFileBytes) {
    return false;
  }
  extent.box = Box(std::move(origin), std::move(shape));
  extent.hash.wide = wide != 0;
  extent.step = step >= 0 ? std::optional<int64_t>(step) : std::nullopt;
  return extent.length_bytes ==
         extent.box.num_elements() * ItemSize(array.dtype);
}

}  // namespace hoist
