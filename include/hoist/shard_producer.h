// ShardProducer: the shards of a save whose bytes reach host memory only
// when the save's staging asks for them, wave by wave.
//
// Some arrays cannot be read by address: a JAX shard on a TPU (DLPack is
// refused there), one in a tiled layout, a PyTorch/XLA tensor. Their bytes
// come to host memory through their runtime's own batched transfer. Made
// all at once, those host copies would double a save's host memory beside
// the staging pool; made by a ShardProducer, they exist one wave at a time:
// the save acquires a wave's room in the pool (or waits for storage to free
// it, as for any wave), asks the producer for every shard the wave reads
// first (ONE Produce call per wave: one batched transfer), copies them into
// the pool, and releases each shard once the last wave reading it has been
// copied. A wave's shards are produced only once every earlier wave's
// copies are done and their shards released, so at most one wave's host
// copies (at most the pool's size) exist at a time.
#ifndef HOIST_SHARD_PRODUCER_H_
#define HOIST_SHARD_PRODUCER_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "hoist/mesh.h"

namespace hoist {

// One shard to produce: the `array`-th of the save's arrays (the index in
// CheckpointManager::Save's `arrays`), on `device`. Produce sets `data`:
// the shard's bytes, dense and row-major, in host memory the backend can
// copy from, valid and unchanged until Release of this shard.
struct ProducedShard {
  int array = 0;
  DeviceId device = 0;
  const void* data = nullptr;
};

// Produces a save's shards marked SaveArray::Shard::produced. Owned by the
// save (SaveOptions::producer) until its staging ends. Thread-safety:
// Produce and Release may run on different threads (Save's caller's for
// the first wave, the manager's saver's for the rest; Release on a copy's
// thread), never two Produce calls at once.
class ShardProducer {
 public:
  virtual ~ShardProducer() = default;

  // Puts every shard of `shards` (each asked for once per save) in host
  // memory and sets its `data`, returning once all are there. An error (a
  // deleted or donated array, a device that failed) stops the save: the
  // message should name the array and the device; nothing of the save is
  // committed, and every shard asked for is released.
  virtual absl::Status Produce(absl::Span<ProducedShard> shards) = 0;

  // Every copy reading `shards` is done (or the save stopped): their host
  // memory may go. Called exactly once for each shard Produce was asked
  // for, including those of a Produce that failed.
  virtual void Release(absl::Span<const ProducedShard> shards) = 0;
};

}  // namespace hoist

#endif  // HOIST_SHARD_PRODUCER_H_
