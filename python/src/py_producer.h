// The binding's ShardProducer: a save's shards that Python puts in host
// memory when the engine's staging asks for them, wave by wave (JAX shards
// staged through PJRT: python/hoist/_xla_staging.py).
#ifndef HOIST_PYTHON_PY_PRODUCER_H_
#define HOIST_PYTHON_PY_PRODUCER_H_

#include <nanobind/nanobind.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "hoist/mesh.h"
#include "hoist/shard_producer.h"
#include "py_arrays.h"

namespace hoist {

// Calls `produce(tokens)` (a Python callable) with the tokens of a wave's
// shards; it returns, in the same order, each shard's bytes in host memory:
// anything the buffer protocol or DLPack gives as CPU memory (a flat uint8
// NumPy view of a host copy, its size checked), or (address, owner) of
// bytes in C order that `owner` keeps (unchecked, as save_again's
// addresses are). Each is held until Release. A Python
// exception becomes the save's error (its message kept). Thread-safe: each
// call takes the GIL (the thread that called Save released it).
class PyProducer final : public ShardProducer {
 public:
  // One shard the save asks for: its token for `produce`, its bytes, and
  // its array's name (for errors).
  struct Shard {
    int64_t token = 0;
    int64_t bytes = 0;
    std::string name;
  };
  using Key = std::pair<int, DeviceId>;  // (array index, device)

  PyProducer(nb::callable produce, std::map<Key, Shard> shards)
      : produce_(std::move(produce)), shards_(std::move(shards)) {}
  ~PyProducer() override;

  absl::Status Produce(absl::Span<ProducedShard> shards) override;
  void Release(absl::Span<const ProducedShard> shards) override;

 private:
  nb::callable produce_;
  const std::map<Key, Shard> shards_;
  std::map<Key, nb::object> held_;  // with the GIL
};

}  // namespace hoist

#endif  // HOIST_PYTHON_PY_PRODUCER_H_
