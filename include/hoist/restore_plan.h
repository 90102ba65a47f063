// RestorePlan: what a restore reads and where each byte goes, decided before
// any byte moves.
//
// PlanRestore is a pure, deterministic function of what the checkpoint holds
// (each array's extent boxes), the boxes the caller wants filled, and the
// staging pool's capacity. Restore executes the plan; tests check it without
// files, devices or threads.
//
// Words: a *destination* is one box the caller wants filled (in a device's
// memory or in host memory); an *image* is the bytes of one box as they are
// assembled in host memory: a host destination is its own image (filled in
// place), device destinations of the same box (replicas) share one image in
// a lease of the staging pool, and a device box larger than half the pool
// is assembled in several images (parts), each a contiguous run of it.
#ifndef HOIST_RESTORE_PLAN_H_
#define HOIST_RESTORE_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "hoist/box.h"

namespace hoist {

// What the checkpoint holds of one array.
struct SavedArray {
  std::string name;  // for error messages
  int64_t item_bytes = 1;
  std::vector<int64_t> shape;
  std::vector<Box> extents;  // every saved extent's box, in manifest order
};

// One box the caller wants filled.
struct DestinationBox {
  int array = 0;           // index into the saved arrays
  Box box;                 // inside the array's shape, not empty
  bool on_device = false;  // staged through the pool; else filled in place
};

// One image: `box` of array `array`, `bytes` long, assembled in host memory
// (its host destination, or a lease), then copied to every destination in
// `destinations` (index, byte offset of `box` in that destination's memory).
struct RestoreImage {
  int array = 0;
  Box box;
  int64_t bytes = 0;
  bool in_place = false;  // a host destination's own memory, not a lease
  std::vector<std::pair<int, int64_t>> destinations;
};

// One saved extent a wave reads, and the images of that wave it feeds.
struct RestoreRead {
  int array = 0;
  int extent = 0;
  std::vector<int> images;  // indices into RestorePlan::images
};

// Images assembled together: their leases are taken at once, every read
// they need runs, then one copy per device carries the wave's images.
struct RestoreWave {
  std::vector<int> images;
  std::vector<RestoreRead> reads;
  int64_t lease_bytes = 0;  // staged bytes, each image rounded up to 4 KiB
};

struct RestorePlan {
  std::vector<RestoreImage> images;
  std::vector<RestoreWave> waves;
};

// Plans filling `destinations` from `saved` through a staging pool of
// `pool_bytes`. In-place images ride in the first wave. Device images all
// go in one wave if they fit in the pool together, else in waves of at most
// half of it (so one wave can be read while the previous one is copied to
// the devices); a device box whose image would not fit in half the pool is
// cut into parts along its first axis longer than 1. Each wave reads only
// the extents that intersect its images, each once.
// Errors: kInvalidArgument for a destination outside its array, empty, or
// naming no saved array; kResourceExhausted, naming the array and box, when
// one row of a device box (along that axis) exceeds half the pool.
absl::StatusOr<RestorePlan> PlanRestore(
    absl::Span<const SavedArray> saved,
    absl::Span<const DestinationBox> destinations, int64_t pool_bytes);

}  // namespace hoist

#endif  // HOIST_RESTORE_PLAN_H_
