// Test helper: what /proc/self/smaps says of the mapping holding an address.
#ifndef HOIST_TESTING_SMAPS_H_
#define HOIST_TESTING_SMAPS_H_

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace hoist::testing {

// The field `key` ("Rss", "VmFlags") of the mapping holding `address`, as
// the kernel prints it after the colon; "" when no mapping holds it.
inline std::string SmapsField(const void* address, const std::string& key) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind(key + ":", 0) == 0) {
      return line.substr(key.size() + 1);
    }
  }
  return "";
}

}  // namespace hoist::testing

#endif  // HOIST_TESTING_SMAPS_H_
