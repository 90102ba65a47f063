#include "py_producer.h"

#include <cstdint>
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
      nb::object item = made[i];
      if (nb::isinstance<nb::tuple>(item) && nb::len(item) == 2) {
        // (address, owner): a host copy whose layout Python knows is C
        // order, read at its address while `owner` is held.
        shards[i].data =
            reinterpret_cast<const void*>(nb::cast<uintptr_t>(item[0]));
        held_[{shards[i].array, shards[i].device}] = item[1];
        continue;
      }
      SavedData data;
      if (!nb::try_cast(item, data) ||
          data.device_type() != nb::device::cpu::value) {
        return absl::InternalError(
            absl::StrFormat("%s: produce gave no host array", where));
      }
      shards[i].data = DenseData(data, shard.bytes, where);
      held_[{shards[i].array, shards[i].device}] = item;  // its owner
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
