// hoist diff: two manifests matched array by array and extent by extent;
// with values, the changed arrays read and compared.
#include "hoist/diff.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint_root.h"

namespace hoist {
namespace {

// Whether the two saved the same boxes, in the same order (the same
// sharding): then extents are compared pairwise.
bool SameBoxes(const ManifestArray& a, const ManifestArray& b) {
  if (a.extents.size() != b.extents.size()) return false;
  for (size_t e = 0; e < a.extents.size(); ++e) {
    if (a.extents[e].box != b.extents[e].box) return false;
  }
  return true;
}

// Same bytes: the same hash (a delta's extent carries its bytes' hash).
bool SameBytes(const ManifestExtent& a, const ManifestExtent& b) {
  return a.hash == b.hash;
}

ArrayDiff CompareArrays(const ManifestArray& a, const ManifestArray& b) {
  ArrayDiff diff;
  diff.name = b.name;
  diff.dtype_a = a.dtype;
  diff.dtype_b = b.dtype;
  diff.shape_a = a.shape;
  diff.shape_b = b.shape;
  diff.extents = static_cast<int64_t>(b.extents.size());
  diff.retyped = a.dtype != b.dtype || a.shape != b.shape;
  if (diff.retyped) return diff;
  const auto changed = [&](const ManifestExtent& extent) {
    diff.changed_extents.push_back(extent.box);
    diff.changed_bytes += extent.length_bytes;
  };
  if (SameBoxes(a, b)) {
    for (size_t e = 0; e < b.extents.size(); ++e) {
      if (!SameBytes(a.extents[e], b.extents[e])) changed(b.extents[e]);
    }
    return diff;
  }
  // The same boxes in another order still match; other boxes do not.
  absl::flat_hash_map<std::string, const ManifestExtent*> by_box;
  for (const ManifestExtent& extent : a.extents) {
    by_box[extent.box.ToString()] = &extent;
  }
  for (const ManifestExtent& extent : b.extents) {
    auto it = by_box.find(extent.box.ToString());
    if (it == by_box.end()) {
      diff.resharded = true;
    } else if (SameBytes(*it->second, extent)) {
      continue;
    }
    changed(extent);
  }
  if (diff.resharded) {  // every extent: none can be matched
    diff.changed_extents.clear();
    diff.changed_bytes = 0;
    for (const ManifestExtent& extent : b.extents) changed(extent);
  }
  return diff;
}

double HalfToDouble(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double value;
  if (exponent == 0) {
    value = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
  } else {
    value = std::ldexp(mantissa + 1024, exponent - 25);
  }
  return sign ? -value : value;
}

double E4M3FnToDouble(uint8_t v) {
  const int sign = v >> 7, exponent = (v >> 3) & 0xF, mantissa = v & 0x7;
  double value;
  if (exponent == 15 && mantissa == 7) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(mantissa, -9);
  } else {
    value = std::ldexp(mantissa + 8, exponent - 10);
  }
  return sign ? -value : value;
}

// Element `i` of `data` (of `dtype`) as a double.
double ElementAt(const uint8_t* data, DType dtype, int64_t i) {
  const auto load = [&]<typename T>(T) {
    T value;
    std::memcpy(&value, data + i * sizeof(T), sizeof(T));
    return value;
  };
  switch (dtype) {
    case DType::kBool:
      return data[i] != 0;
    case DType::kInt8:
      return load(int8_t{});
    case DType::kInt16:
      return load(int16_t{});
    case DType::kInt32:
      return load(int32_t{});
    case DType::kInt64:
      return static_cast<double>(load(int64_t{}));
    case DType::kUint8:
      return data[i];
    case DType::kUint16:
      return load(uint16_t{});
    case DType::kUint32:
      return load(uint32_t{});
    case DType::kUint64:
      return static_cast<double>(load(uint64_t{}));
    case DType::kFloat16:
      return HalfToDouble(load(uint16_t{}));
    case DType::kBFloat16: {
      const uint32_t bits = static_cast<uint32_t>(load(uint16_t{})) << 16;
      float value;
      std::memcpy(&value, &bits, sizeof value);
      return value;
    }
    case DType::kFloat32:
      return load(float{});
    case DType::kFloat64:
      return load(double{});
    case DType::kFloat8E4M3FN:
      return E4M3FnToDouble(data[i]);
    case DType::kFloat8E5M2:  // the top byte of a float16
      return HalfToDouble(static_cast<uint16_t>(data[i]) << 8);
  }
  return 0;
}

// The largest absolute and relative differences of `b` from `a`: a NaN on
// one side only is an infinite difference.
void CompareValues(const uint8_t* a, const uint8_t* b, DType dtype,
                   int64_t elements, ArrayDiff& diff) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < elements; ++i) {
    const double x = ElementAt(a, dtype, i), y = ElementAt(b, dtype, i);
    double abs;
    if (std::isnan(x) || std::isnan(y)) {
      abs = std::isnan(x) && std::isnan(y) ? 0 : kInf;
    } else if (x == y) {
      abs = 0;  // also equal infinities
    } else {
      abs = std::fabs(y - x);
    }
    diff.max_abs_diff = std::max(diff.max_abs_diff, abs);
    if (x != 0 && !std::isnan(x)) {
      diff.max_rel_diff = std::max(diff.max_rel_diff, abs / std::fabs(x));
    }
  }
  diff.values_compared = true;
}

// Array `diff.name` of step `step` of `root`, whole, into `into`.
absl::Status ReadWhole(const CheckpointRoot& root, int64_t step,
                       const ArrayDiff& diff, uint8_t* into) {
  RestoreTarget target{diff.name, diff.dtype_b, diff.shape_b, {}};
  target.destinations.push_back(
      {Box(std::vector<int64_t>(diff.shape_b.size(), 0), diff.shape_b), nullptr,
       into, 0});
  return root.Read(step, {&target, 1}).status();
}

struct OpenedSide {
  std::unique_ptr<CheckpointRoot> root;
  int64_t step = 0;
  Manifest manifest;
};

absl::StatusOr<OpenedSide> OpenSide(const DiffSide& side,
                                    const StorageOptions& storage) {
  ASSIGN_OR_RETURN(auto opened, OpenStepAt(side.path, storage));
  OpenedSide out{
      std::move(opened.first), side.step.value_or(opened.second), {}};
  absl::StatusOr<Manifest> manifest = out.root->ReadManifest(out.step);
  if (!manifest.ok()) {
    return absl::Status(
        manifest.status().code(),
        absl::StrFormat("step %d of %s: %s", out.step, out.root->path(),
                        manifest.status().message()));
  }
  out.manifest = *std::move(manifest);
  return out;
}

absl::Status CompareChangedValues(const OpenedSide& a, const OpenedSide& b,
                                  StepDiff& diff, OperationProgress* progress) {
  OperationProgress ignored;
  OperationProgress& counted = progress != nullptr ? *progress : ignored;
  const auto elements_of = [](const ArrayDiff& array) {
    int64_t elements = 1;
    for (int64_t n : array.shape_b) elements *= n;
    return elements;
  };
  int64_t total = 0;
  for (const ArrayDiff& array : diff.changed) {
    if (!array.retyped) {
      total += 2 * elements_of(array) * ItemSize(array.dtype_b);
    }
  }
  counted.total.store(total);
  for (ArrayDiff& array : diff.changed) {
    if (array.retyped) {
      array.values_note = "dtype or shape differs";
      continue;
    }
    const int64_t elements = elements_of(array);
    const int64_t bytes = elements * ItemSize(array.dtype_b);
    if (bytes == 0) continue;
    counted.current.Set(array.name);
    HostBuffer in_a(bytes), in_b(bytes);
    RETURN_IF_ERROR(ReadWhole(*a.root, a.step, array, in_a.data()));
    counted.done.fetch_add(bytes);
    RETURN_IF_ERROR(ReadWhole(*b.root, b.step, array, in_b.data()));
    counted.done.fetch_add(bytes);
    CompareValues(in_a.data(), in_b.data(), array.dtype_b, elements, array);
  }
  return absl::OkStatus();
}

}  // namespace

StepDiff DiffManifests(const Manifest& a, const Manifest& b) {
  StepDiff diff;
  diff.step_a = a.step;
  diff.step_b = b.step;
  absl::flat_hash_map<std::string_view, const ManifestArray*> in_a;
  in_a.reserve(a.arrays.size());
  for (const ManifestArray& array : a.arrays) in_a[array.name] = &array;
  absl::flat_hash_map<std::string_view, bool> in_b;
  in_b.reserve(b.arrays.size());
  for (const ManifestArray& array : b.arrays) {
    in_b[array.name] = true;
    auto it = in_a.find(array.name);
    if (it == in_a.end()) {
      diff.added.push_back(array.name);
      continue;
    }
    ArrayDiff changed = CompareArrays(*it->second, array);
    if (changed.retyped || !changed.changed_extents.empty()) {
      diff.changed.push_back(std::move(changed));
    } else {
      ++diff.unchanged;
    }
  }
  for (const ManifestArray& array : a.arrays) {
    if (!in_b.contains(array.name)) diff.removed.push_back(array.name);
  }
  return diff;
}

absl::StatusOr<StepDiff> DiffSteps(const DiffSide& a, const DiffSide& b,
                                   const StorageOptions& storage, bool values,
                                   OperationProgress* progress) {
  // The two manifests read and decoded side by side: at 100,000 arrays
  // decoding one is most of a diff's time.
  absl::StatusOr<OpenedSide> opened_b = absl::InternalError("not read");
  std::thread reader([&] { opened_b = OpenSide(b, storage); });
  absl::StatusOr<OpenedSide> opened_a = OpenSide(a, storage);
  reader.join();
  ASSIGN_OR_RETURN(OpenedSide side_a, std::move(opened_a));
  ASSIGN_OR_RETURN(OpenedSide side_b, std::move(opened_b));
  StepDiff diff = DiffManifests(side_a.manifest, side_b.manifest);
  if (values) {
    RETURN_IF_ERROR(CompareChangedValues(side_a, side_b, diff, progress));
  }
  // Freed side by side too: 100,000 arrays' strings and vectors each.
  std::thread freer([b = std::move(side_b)]() mutable { b = {}; });
  side_a = {};
  freer.join();
  return diff;
}

}  // namespace hoist
