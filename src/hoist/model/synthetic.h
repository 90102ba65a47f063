// Synthetic array contents for the demo, the benchmarks and the crash tests.
#ifndef HOIST_MODEL_SYNTHETIC_H_
#define HOIST_MODEL_SYNTHETIC_H_

#include <cstdint>

namespace hoist {

// Fills `bytes` at `data` with fast pseudo-random contents determined by
// `seed` (xorshift64).
void FillSynthetic(uint8_t* data, int64_t bytes, uint64_t seed);

}  // namespace hoist

#endif  // HOIST_MODEL_SYNTHETIC_H_
