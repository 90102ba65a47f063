#include "hoist/model/synthetic.h"

#include <cstring>

namespace hoist {

void FillSynthetic(uint8_t* data, int64_t bytes, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  int64_t at = 0;
  for (; at + 8 <= bytes; at += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data + at, &x, 8);
  }
  for (; at < bytes; ++at) data[at] = static_cast<uint8_t>(x >> (8 * (at % 8)));
}

}  // namespace hoist
