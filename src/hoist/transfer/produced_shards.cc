#include "hoist/transfer/produced_shards.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"

namespace hoist {

ProducedShards::ProducedShards(std::shared_ptr<ShardProducer> producer,
                               const StagingLayout& layout,
                               absl::Span<Device* const> devices,
                               absl::Span<const size_t> produced)
    : producer_(std::move(producer)),
      first_(layout.wave_ends.size()),
      last_(layout.wave_ends.size()),
      pending_(layout.wave_ends.size(), 0) {
  absl::flat_hash_map<std::pair<int, int>, size_t> index;  // (array, device)
  std::vector<size_t> first_wave, last_wave;               // per shard
  size_t wave = 0;
  for (size_t i : produced) {
    while (i >= layout.wave_ends[wave]) ++wave;
    const StagingLayout::Slice& slice = layout.slices[i];
    const auto [it, added] =
        index.try_emplace({slice.array, slice.device}, shards_.size());
    if (added) {
      shards_.push_back({slice.array, devices[slice.device]->id()});
      slices_.emplace_back();
      bytes_.push_back(0);
      first_wave.push_back(wave);
      last_wave.push_back(wave);
    }
    slices_[it->second].push_back(i);
    bytes_[it->second] += layout.lengths[i];
    last_wave[it->second] = wave;
  }
  for (size_t k = 0; k < shards_.size(); ++k) {
    first_[first_wave[k]].push_back(k);
    last_[last_wave[k]].push_back(k);
  }
  MutexLock lock(&mu_);
  state_.assign(shards_.size(), State::kWaiting);
}

absl::Status ProducedShards::Produce(size_t w,
                                     std::vector<const uint8_t*>& by_slice,
                                     Tracer* tracer) {
  if (first_[w].empty()) return absl::OkStatus();
  std::vector<ProducedShard> asked;
  asked.reserve(first_[w].size());
  int64_t bytes = 0;
  {
    MutexLock lock(&mu_);
    producing_ = w;
    mu_.Await(Condition(this, &ProducedShards::EarlierWavesCopied));
    for (size_t k : first_[w]) {
      state_[k] = State::kAsked;
      asked.push_back(shards_[k]);
      bytes += bytes_[k];
    }
  }
  const absl::Time start = absl::Now();
  absl::Status status = producer_->Produce(absl::MakeSpan(asked));
  if (tracer != nullptr) {
    tracer->Span(
        "producer",
        absl::StrFormat("produce %d shards, %s (wave %d)", asked.size(),
                        FormatBytes(static_cast<double>(bytes)), w + 1),
        start, absl::Now());
  }
  for (size_t j = 0; status.ok() && j < asked.size(); ++j) {
    if (asked[j].data == nullptr) {
      status = absl::InternalError(
          absl::StrFormat("the producer gave array %d on device %d no data",
                          asked[j].array, asked[j].device));
    }
  }
  if (!status.ok()) {
    ReleaseShards(first_[w]);
    return absl::Status(
        status.code(),
        absl::StrCat(absl::StrFormat("producing %d shards for wave %d of %d "
                                     "of the save: ",
                                     asked.size(), w + 1, first_.size()),
                     status.message()));
  }
  MutexLock lock(&mu_);  // Release hands the data back
  for (size_t j = 0; j < asked.size(); ++j) {
    const size_t k = first_[w][j];
    shards_[k].data = asked[j].data;
    for (size_t i : slices_[k]) {
      by_slice[i] = static_cast<const uint8_t*>(asked[j].data);
    }
  }
  return absl::OkStatus();
}

void ProducedShards::AddCopy(size_t w) {
  MutexLock lock(&mu_);
  ++pending_[w];
}

void ProducedShards::CopyDone(size_t w) {
  {
    MutexLock lock(&mu_);
    if (pending_[w] > 1) {
      --pending_[w];
      return;
    }
  }
  // The wave's last: its count ends only once its shards are released, so
  // that the next wave is never produced beside them.
  ReleaseShards(last_[w]);
  MutexLock lock(&mu_);
  --pending_[w];
}

void ProducedShards::ReleaseRest() {
  std::vector<size_t> all;
  {
    MutexLock lock(&mu_);
    all.resize(shards_.size());
  }
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  ReleaseShards(all);
}

bool ProducedShards::EarlierWavesCopied() const {
  for (size_t v = 0; v < producing_; ++v) {
    if (pending_[v] > 0) return false;
  }
  return true;
}

void ProducedShards::ReleaseShards(absl::Span<const size_t> shards) {
  std::vector<ProducedShard> going;
  {
    MutexLock lock(&mu_);
    for (size_t k : shards) {
      if (state_[k] != State::kAsked) continue;
      state_[k] = State::kReleased;
      going.push_back(shards_[k]);
    }
  }
  if (!going.empty()) producer_->Release(going);
}

}  // namespace hoist
