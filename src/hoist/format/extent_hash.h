// Hashing an extent's bytes as its manifest records them: XXH3-128 for what
// hoist writes (hoist/2), XXH3-64 to check a hoist/1 step's.
#ifndef HOIST_FORMAT_EXTENT_HASH_H_
#define HOIST_FORMAT_EXTENT_HASH_H_

#include <cstddef>
#include <memory>
#include <string>

#include "hoist/manifest.h"

namespace hoist {

// XXH3-128 of `bytes` bytes at `data`: the hash a save records.
ExtentHash HashExtent(const void* data, size_t bytes);

// As the manifest writes it: 32 hex digits (16 for XXH3-64).
std::string FormatExtentHash(const ExtentHash& hash);

// Hashes bytes that arrive in pieces with the kind of hash `expected` is
// (wide: XXH3-128; narrow: XXH3-64), for comparing with it.
class ExtentHasher {
 public:
  explicit ExtentHasher(const ExtentHash& expected);
  ~ExtentHasher();
  ExtentHasher(const ExtentHasher&) = delete;
  ExtentHasher& operator=(const ExtentHasher&) = delete;

  void Update(const void* data, size_t bytes);
  // True when the bytes so far hash to `expected`.
  bool Matches() const;

 private:
  struct State;
  const ExtentHash expected_;
  std::unique_ptr<State> state_;
};

// True when `bytes` bytes at `data` hash to `expected` (of its kind).
bool ExtentMatches(const ExtentHash& expected, const void* data, size_t bytes);

}  // namespace hoist

#endif  // HOIST_FORMAT_EXTENT_HASH_H_
