#include "py_producer.h"

#include <vector>

#include "absl/strings/str_format.h"

namespace hoist {

PyProducer::~PyProducer() {
  nb::gil_scoped_acquire gil;
  held_.clear();
  produce_.reset();
}

absl::Status PyProducer::Produce(absl::Span<ProducedShard> shards) {
  nb::gil_scoped_acquire gil;
  std::vector<const Shard*> asked;
  asked.reserve(shards.size());
  nb::list tokens;
  for (const ProducedShard& shard : shards) {
    auto it = shards_.find({shard.array, shard.device});
    if (it == shards_.end()) {
      return absl::InternalError(
          absl::StrFormat("array %d on device %d was not given to be produced",
                          shard.array, shard.device));
    }
    asked.push_back(&it->second);
    tokens.append(it->second.token);
  }
  try {
    nb::object made = produce_(tokens);
    if (nb::len(made) != shards.size()) {
      return absl::InternalError(absl::StrFormat(
          "produce gave %d shards for %d", nb::len(made), shards.size()));
    }
    for (size_t i = 0; i < shards.size(); ++i) {
      const Shard& shard = *asked[i];
      const std::string where = absl::StrFormat("array '%s' on device %d",
                                                shard.name, shards[i].device);
      SavedData data;
      if (!nb::try_cast(made[i], data) ||
          data.device_type() != nb::device::cpu::value) {
        return absl::InternalError(
            absl::StrFormat("%s: produce gave no host array", where));
      }
      shards[i].data = DenseData(data, shard.bytes, where);
      held_[{shards[i].array, shards[i].device}] = std::move(data);
    }
  } catch (const nb::python_error& e) {
    return absl::UnknownError(nb::str(e.value()).c_str());
  } catch (const StatusError& e) {  // DenseData's ValueError
    return absl::InvalidArgumentError(e.message);
  }
  return absl::OkStatus();
}

void PyProducer::Release(absl::Span<const ProducedShard> shards) {
  nb::gil_scoped_acquire gil;
  for (const ProducedShard& shard : shards) {
    held_.erase({shard.array, shard.device});
  }
}

}  // namespace hoist
