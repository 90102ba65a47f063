#include "hoist/format/extent_hash.h"

#include <cstdlib>

#include "absl/strings/str_format.h"
#include "hoist/base/xxh3.h"

namespace hoist {

ExtentHash HashExtent(const void* data, size_t bytes) {
  const XXH128_hash_t hash = XXH3_128bits(data, bytes);
  return {.low = hash.low64, .high = hash.high64, .wide = true};
}

std::string FormatExtentHash(const ExtentHash& hash) {
  return hash.wide ? absl::StrFormat("%016x%016x", hash.high, hash.low)
                   : absl::StrFormat("%016x", hash.low);
}

struct ExtentHasher::State {
  State() : state(XXH3_createState()) {
    if (state == nullptr) std::abort();  // out of memory, as new would
  }
  ~State() { XXH3_freeState(state); }
  XXH3_state_t* state;
};

ExtentHasher::ExtentHasher(const ExtentHash& expected)
    : expected_(expected), state_(std::make_unique<State>()) {
  if (expected_.wide) {
    XXH3_128bits_reset(state_->state);
  } else {
    XXH3_64bits_reset(state_->state);
  }
}

ExtentHasher::~ExtentHasher() = default;

void ExtentHasher::Update(const void* data, size_t bytes) {
  if (expected_.wide) {
    XXH3_128bits_update(state_->state, data, bytes);
  } else {
    XXH3_64bits_update(state_->state, data, bytes);
  }
}

bool ExtentHasher::Matches() const {
  if (!expected_.wide) {
    return XXH3_64bits_digest(state_->state) == expected_.low;
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(state_->state);
  return hash.low64 == expected_.low && hash.high64 == expected_.high;
}

bool ExtentMatches(const ExtentHash& expected, const void* data, size_t bytes) {
  if (!expected.wide) return XXH3_64bits(data, bytes) == expected.low;
  return HashExtent(data, bytes) == expected;
}

}  // namespace hoist
