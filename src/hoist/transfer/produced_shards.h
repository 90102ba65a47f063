// ProducedShards: the shards of one staging that a ShardProducer
// (shard_producer.h) puts in host memory wave by wave, and the bookkeeping
// that bounds them: which wave asks for each shard first, which wave's
// copies end its use, and how many copies of each wave are in flight.
// The TransferEngine asks for a wave's shards (Produce) once it holds the
// wave's leases and every earlier wave's copies have ended, so at most one
// wave of host copies exists at a time; a shard is released once the last
// wave reading it is copied, or when staging stops (ReleaseRest), exactly
// once. Thread-safe: Produce on the staging thread, the copy counts on the
// copies' completion threads.
#ifndef HOIST_TRANSFER_PRODUCED_SHARDS_H_
#define HOIST_TRANSFER_PRODUCED_SHARDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "hoist/device.h"
#include "hoist/mutex.h"
#include "hoist/shard_producer.h"
#include "hoist/trace.h"
#include "hoist/transfer/transfer_engine.h"

namespace hoist {

class ProducedShards {
 public:
  // `produced`: the indices of `layout`'s slices whose source is
  // ProducedSource(), ascending; `devices`: those the layout was made for.
  ProducedShards(std::shared_ptr<ShardProducer> producer,
                 const StagingLayout& layout, absl::Span<Device* const> devices,
                 absl::Span<const size_t> produced);

  // Puts wave w's shards in host memory, in one Produce call, once every
  // earlier wave's copies have ended, and sets their slices' sources in
  // `by_slice` (the layout's order). Records the call on `tracer`'s
  // "producer" track when given. On error (the producer's, prefixed with
  // the wave) every shard asked for is released.
  absl::Status Produce(size_t w, std::vector<const uint8_t*>& by_slice,
                       Tracer* tracer);

  // The copies of wave w: its dispatching begins (BeginWave), a copy is
  // dispatched (AddCopy) or ends (CopyDone), its dispatching ends
  // (EndWave). When none is left, the shards whose last copy it made are
  // released.
  void BeginWave(size_t w) { AddCopy(w); }
  void AddCopy(size_t w);
  void CopyDone(size_t w);
  void EndWave(size_t w) { CopyDone(w); }

  // Releases every shard asked for and not yet released (staging ended or
  // stopped).
  void ReleaseRest();

 private:
  enum class State { kWaiting, kAsked, kReleased };

  // Every copy of the waves before producing_ has ended.
  bool EarlierWavesCopied() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases those of `shards` (indices) asked for and not yet released.
  void ReleaseShards(absl::Span<const size_t> shards);

  const std::shared_ptr<ShardProducer> producer_;
  Mutex mu_;
  // Fixed at construction: per shard, its layout slices and their bytes;
  // per wave, the shards it asks for first and those whose last copy it
  // makes.
  std::vector<ProducedShard> shards_ ABSL_GUARDED_BY(mu_);  // data: Produce's
  std::vector<std::vector<size_t>> slices_;
  std::vector<int64_t> bytes_;
  std::vector<std::vector<size_t>> first_, last_;
  std::vector<int> pending_ ABSL_GUARDED_BY(mu_);  // per wave: copies left
  std::vector<State> state_ ABSL_GUARDED_BY(mu_);  // per shard
  size_t producing_ ABSL_GUARDED_BY(mu_) = 0;      // the wave Produce makes
};

}  // namespace hoist

#endif  // HOIST_TRANSFER_PRODUCED_SHARDS_H_
