// Test helper: the arrays crash_saver saves and crash_test checks. Step N's
// array a holds FillSynthetic(CrashSeed(N, a)) as a whole, C order: most
// arrays change every step, w0 never (a frozen base: every step after the
// first references its bytes) and w3 every third step, so that kills land
// amid deltas and the retention of referenced steps.
#ifndef HOIST_TESTING_CRASH_MODEL_H_
#define HOIST_TESTING_CRASH_MODEL_H_

#include <vector>

#include "hoist/array_spec.h"
#include "hoist/model/synthetic.h"

namespace hoist::testing {

// 2 x 4 shardings and odd sizes, replicated and not.
inline std::vector<ArraySpec> CrashModel() {
  const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 4});
  return {
      {"w0", DType::kFloat32, {256, 512}, NamedSharding{mesh, {{}, {"model"}}}},
      {"w1",
       DType::kBFloat16,
       {1000, 24},
       NamedSharding{mesh, {{"data", "model"}}}},
      {"w2", DType::kFloat32, {77, 33}, Sharding::Replicated(mesh)},
      {"w3", DType::kInt8, {4096}, NamedSharding{mesh, {{"model"}}}},
      {"w4", DType::kFloat64, {64, 64}, NamedSharding{mesh, {{"data"}}}},
      {"count", DType::kInt32, {}, Sharding::Replicated(mesh)},
  };
}

inline uint64_t CrashSeed(int64_t step, size_t array) {
  const int64_t changed = array == 0 ? 0 : array == 3 ? step / 3 : step;
  return static_cast<uint64_t>(changed * 1000 + static_cast<int64_t>(array));
}

}  // namespace hoist::testing

#endif  // HOIST_TESTING_CRASH_MODEL_H_
