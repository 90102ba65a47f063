// SharedRestore (shared_restore.h), step by step:
//   1. Every rank reads the manifest and works out which saved extents its
//      targets intersect (flat ids: the extents of all arrays, in manifest
//      order); the ranks all-gather these lists.
//   2. Each extent needed by several ranks gets one reader among them, the
//      one with the fewest such bytes so far; the arrays are cut into
//      rounds (whole arrays, in order) so that no rank holds more than half
//      of the pool of such extents at once.
//   3. Per round, each rank reads the shared extents it was given into a
//      buffer of the round's size, verifies them, and sends each rank its
//      share through one
//      Exchange per rank offset that carries any; then restores the round's
//      targets with RestoreCheckpoint, whose reads of shared extents are
//      served from the buffer and the rest from storage.
#include "hoist/checkpoint/restore/shared_restore.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "hoist/base/first_error.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"
#include "hoist/box.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/format/manifest_index.h"

namespace hoist {
namespace {

// The flat ids of the extents `targets` intersect, sorted. A target the
// manifest lacks, or whose dtype or shape differs, needs nothing here:
// RestoreCheckpoint reports it.
std::vector<int64_t> NeededExtents(const Manifest& manifest,
                                   const std::vector<int64_t>& first_id,
                                   const ManifestIndex& index,
                                   absl::Span<const RestoreTarget> targets) {
  std::vector<int64_t> ids;
  for (const RestoreTarget& target : targets) {
    const int a = index.IndexOf(target.name);
    if (a < 0) continue;
    const ManifestArray& array = manifest.arrays[a];
    if (array.dtype != target.dtype || array.shape != target.shape) continue;
    for (const RestoreDestination& dest : target.destinations) {
      if (dest.box.empty() ||
          dest.box.rank() != static_cast<int>(array.shape.size())) {
        continue;
      }
      for (size_t e = 0; e < array.extents.size(); ++e) {
        if (!array.extents[e].box.Intersect(dest.box).empty()) {
          ids.push_back(first_id[a] + static_cast<int64_t>(e));
        }
      }
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// "a-b,c,...": sorted ids as ranges.
std::string EncodeIds(const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!out.empty()) out += ',';
    absl::StrAppendFormat(&out, "%d", ids[i]);
    if (j > i) absl::StrAppendFormat(&out, "-%d", ids[j]);
    i = j + 1;
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> DecodeIds(absl::string_view text,
                                               int64_t count, int from) {
  std::vector<int64_t> ids;
  for (absl::string_view range : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> ends =
        absl::StrSplit(range, absl::MaxSplits('-', 1));
    int64_t a = 0, b = 0;
    if (!absl::SimpleAtoi(ends.first, &a) ||
        !absl::SimpleAtoi(ends.second.empty() ? ends.first : ends.second, &b) ||
        a < 0 || b < a || b >= count || (!ids.empty() && a <= ids.back())) {
      return absl::DataLossError(absl::StrFormat(
          "shared restore: rank %d sent a malformed list of extents", from));
    }
    for (int64_t id = a; id <= b; ++id) ids.push_back(id);
  }
  return ids;
}

// A data file whose shared extents are served from memory (`cached`: file
// offset -> bytes) and the rest read from storage, opened on first need;
// `served` counts the bytes served from memory.
class CachedFile final : public ReadableFile {
 public:
  CachedFile(
      const std::map<int64_t, absl::Span<const uint8_t>>* cached,
      std::function<absl::StatusOr<std::unique_ptr<ReadableFile>>()> open,
      std::atomic<int64_t>* served)
      : cached_(cached), open_(std::move(open)), served_(served) {}

  absl::Status ReadAt(int64_t offset, absl::Span<uint8_t> out) override {
    const int64_t end = offset + static_cast<int64_t>(out.size());
    for (int64_t at = offset; at < end;) {
      auto next = cached_->upper_bound(at);
      if (next != cached_->begin()) {
        const auto& [start, bytes] = *std::prev(next);
        const int64_t stop = start + static_cast<int64_t>(bytes.size());
        if (at < stop) {
          const int64_t n = std::min(end, stop) - at;
          std::memcpy(out.data() + (at - offset), bytes.data() + (at - start),
                      n);
          served_->fetch_add(n);
          at += n;
          continue;
        }
      }
      const int64_t gap_end =
          next == cached_->end() ? end : std::min(end, next->first);
      RETURN_IF_ERROR(ReadStored(
          at, out.subspan(at - offset, static_cast<size_t>(gap_end - at))));
      at = gap_end;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Size() override {
    RETURN_IF_ERROR(Open());
    return file_->Size();
  }

 private:
  absl::Status ReadStored(int64_t offset, absl::Span<uint8_t> out) {
    RETURN_IF_ERROR(Open());
    return file_->ReadAt(offset, out);
  }

  absl::Status Open() {
    if (file_ != nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(file_, open_());
    return absl::OkStatus();
  }

  const std::map<int64_t, absl::Span<const uint8_t>>* const cached_;
  const std::function<absl::StatusOr<std::unique_ptr<ReadableFile>>()> open_;
  std::atomic<int64_t>* const served_;
  std::unique_ptr<ReadableFile> file_;
};

}  // namespace

absl::StatusOr<RestoreStats> SharedRestore(
    Coordinator& coordinator, Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver,
    bool on_one_host) {
  const int n = coordinator.size(), rank = coordinator.rank();
  if (n == 1) {
    return RestoreCheckpoint(storage, step_dir, targets, pool, options,
                             receiver);
  }
  const absl::Time start = absl::Now();
  // 1. The manifest and what each rank needs. A rank that cannot read the
  // manifest still takes part, so that every rank learns it and each falls
  // back to restoring alone.
  absl::StatusOr<Manifest> manifest = ReadManifestFile(storage, step_dir);
  std::vector<int64_t> first_id;  // per array: the flat id of its extent 0
  std::optional<ManifestIndex> index;
  int64_t count = 0;
  std::string mine = "!";
  if (manifest.ok()) {
    for (size_t a = 0; a < manifest->arrays.size(); ++a) {
      first_id.push_back(count);
      count += static_cast<int64_t>(manifest->arrays[a].extents.size());
    }
    index.emplace(*manifest);
    mine = EncodeIds(NeededExtents(*manifest, first_id, *index, targets));
  }
  // "HOST\nIDS": a host name has no line break.
  ASSIGN_OR_RETURN(std::vector<std::string> lists,
                   coordinator.AllGather("shared restore " + step_dir,
                                         absl::StrCat(HostName(), "\n", mine)));
  std::set<std::string> hosts;
  for (std::string& list : lists) {
    const size_t line = list.find('\n');
    hosts.insert(list.substr(0, line));
    list.erase(0, line == std::string::npos ? list.size() : line + 1);
  }
  std::vector<std::vector<int64_t>> needs(n);
  bool alone = !manifest.ok() || (hosts.size() == 1 && !on_one_host);
  for (int r = 0; r < n && !alone; ++r) {
    absl::StatusOr<std::vector<int64_t>> ids =
        lists[r] == "!" ? absl::DataLossError("")
                        : DecodeIds(lists[r], count, r);
    if (ids.ok()) {
      needs[r] = *std::move(ids);
    } else {
      alone = true;
    }
  }
  if (alone) {
    RETURN_IF_ERROR(manifest.status());
    return RestoreCheckpoint(storage, step_dir, targets, pool, options,
                             receiver);
  }
  std::vector<const ManifestExtent*> extent_of(count);
  std::vector<int> array_of(count);
  for (size_t a = 0; a < manifest->arrays.size(); ++a) {
    for (size_t e = 0; e < manifest->arrays[a].extents.size(); ++e) {
      extent_of[first_id[a] + e] = &manifest->arrays[a].extents[e];
      array_of[first_id[a] + e] = static_cast<int>(a);
    }
  }

  // 2. A reader for each shared extent, and the rounds.
  // Per id, the ranks that need it, ascending (binary-searched below);
  // shared ids only, after the loop that drops the others.
  std::map<int64_t, std::vector<int>> needers;
  for (int r = 0; r < n; ++r) {
    for (int64_t id : needs[r]) needers[id].push_back(r);
  }
  std::vector<int64_t> assigned(n, 0);
  std::map<int64_t, int> reader;  // shared id -> the rank that reads it
  for (auto it = needers.begin(); it != needers.end();) {
    if (it->second.size() < 2) {
      it = needers.erase(it);
      continue;
    }
    int best = it->second.front();
    for (int r : it->second) {
      if (assigned[r] < assigned[best]) best = r;
    }
    assigned[best] += extent_of[it->first]->length_bytes;
    reader[it->first] = best;
    ++it;
  }
  // Rounds: [first array, end array), closed before an array whose shared
  // extents would take a rank past the budget.
  const int64_t budget = std::max<int64_t>(pool.capacity_bytes() / 2, 1);
  std::vector<std::pair<int, int>> rounds;
  {
    std::vector<int64_t> held(n, 0);
    int begin = 0;
    auto it = needers.begin();
    for (int a = 0; a < static_cast<int>(manifest->arrays.size()); ++a) {
      std::map<int, int64_t> add;
      const int64_t end_id =
          first_id[a] +
          static_cast<int64_t>(manifest->arrays[a].extents.size());
      for (auto j = it; j != needers.end() && j->first < end_id; ++j) {
        for (int r : j->second) add[r] += extent_of[j->first]->length_bytes;
      }
      bool over = false;
      for (const auto& [r, bytes] : add) over |= held[r] + bytes > budget;
      if (over && a > begin) {
        rounds.emplace_back(begin, a);
        begin = a;
        std::fill(held.begin(), held.end(), 0);
      }
      for (const auto& [r, bytes] : add) held[r] += bytes;
      while (it != needers.end() && it->first < end_id) ++it;
    }
    rounds.emplace_back(begin, static_cast<int>(manifest->arrays.size()));
  }

  // 3. The rounds.
  RestoreStats stats;
  absl::Status failed;  // this rank's first error; it still sends its share
  // Bytes of extents: read for the others here, and served from memory to
  // RestoreCheckpoint (which counts every extent it takes as read).
  std::atomic<int64_t> read{0}, served{0};
  for (size_t k = 0; k < rounds.size(); ++k) {
    const auto [first_array, end_array] = rounds[k];
    // (A manifest without arrays is one empty round.)
    const auto id_of = [&](int a) {
      return a < static_cast<int>(first_id.size()) ? first_id[a] : count;
    };
    const int64_t lo = id_of(first_array), hi = id_of(end_array);
    // This rank's shared extents of the round, grouped by reader (its own
    // first), each group in id order; and the offsets that carry any.
    std::vector<std::vector<int64_t>> by_reader(n);
    std::set<int> offsets;
    for (auto it = needers.lower_bound(lo);
         it != needers.end() && it->first < hi; ++it) {
      const int from = reader.at(it->first);
      for (int r : it->second) {
        if (r == rank) by_reader[from].push_back(it->first);
        if (r != from) offsets.insert((r - from + n) % n);
      }
    }
    absl::flat_hash_map<int64_t, int64_t> slot;  // id -> offset in buffer
    std::vector<int64_t> group_at(n, 0);
    int64_t bytes = 0;
    for (int i = 0; i < n; ++i) {
      const int from = (rank + i) % n;
      group_at[from] = bytes;
      for (int64_t id : by_reader[from]) {
        slot[id] = bytes;
        bytes += extent_of[id]->length_bytes;
      }
    }
    // Not a lease of the pool: the caller may hold leases of it (staged
    // parts handed to a receiver) for as long as it likes.
    HostBuffer buffer(bytes);
    // Read and verify what this rank reads for the others.
    {
      const std::vector<int64_t>& own = by_reader[rank];
      FirstError error;
      std::atomic<size_t> next{0};
      const auto read_some = [&] {
        absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files;
        for (size_t i = next.fetch_add(1); i < own.size();
             i = next.fetch_add(1)) {
          const ManifestExtent& extent = *extent_of[own[i]];
          const ExtentPlace place = PlaceOfExtent(step_dir, extent);
          absl::Span<uint8_t> into(buffer.data() + slot.at(own[i]),
                                   extent.length_bytes);
          absl::Status s = [&]() -> absl::Status {
            std::unique_ptr<ReadableFile>& file = files[place.path];
            if (file == nullptr) {
              ASSIGN_OR_RETURN(
                  file, storage.OpenReadableBeneath(place.dir, place.relative));
            }
            RETURN_IF_ERROR(file->ReadAt(extent.offset_bytes, into));
            read.fetch_add(extent.length_bytes);
            if (options.verify_xxh3 &&
                !ExtentMatches(extent.hash, into.data(), into.size())) {
              return absl::DataLossError(
                  absl::StrFormat("array '%s': xxh3 mismatch in %s @ %d",
                                  manifest->arrays[array_of[own[i]]].name,
                                  place.relative, extent.offset_bytes));
            }
            return absl::OkStatus();
          }();
          if (!s.ok()) {
            // The receivers' hash check fails on these zeros.
            std::memset(into.data(), 0, into.size());
            error.Record(s);
          }
        }
      };
      std::vector<std::thread> threads;
      const size_t count_threads =
          std::min<size_t>(std::max(1, options.reader_threads), own.size());
      for (size_t t = 1; t < count_threads; ++t)
        threads.emplace_back(read_some);
      read_some();
      for (std::thread& t : threads) t.join();
      if (failed.ok()) failed = error.Get();
    }
    // Send each offset's share; receive into the group of its reader.
    for (int d : offsets) {
      const int to = (rank + d) % n, from = (rank - d + n) % n;
      // What `to` needs of this rank's reads: all of them (data-parallel
      // replicas), sent from the buffer as it is; else a copy of its share.
      std::vector<uint8_t> copy;
      int64_t own_bytes = 0;
      bool all = true;
      for (int64_t id : by_reader[rank]) {
        own_bytes += extent_of[id]->length_bytes;
        const std::vector<int>& who = needers.at(id);
        all &= std::binary_search(who.begin(), who.end(), to);
      }
      absl::Span<const uint8_t> send(buffer.data() + group_at[rank],
                                     static_cast<size_t>(own_bytes));
      if (!all) {
        for (int64_t id : by_reader[rank]) {
          const std::vector<int>& who = needers.at(id);
          if (!std::binary_search(who.begin(), who.end(), to)) continue;
          const uint8_t* at = buffer.data() + slot.at(id);
          copy.insert(copy.end(), at, at + extent_of[id]->length_bytes);
        }
        send = copy;
      }
      int64_t expected = 0;
      for (int64_t id : by_reader[from])
        expected += extent_of[id]->length_bytes;
      int64_t got = 0;
      RETURN_IF_ERROR(coordinator.Exchange(
          absl::StrFormat("shared restore round %d +%d", k, d), send, to, from,
          [&](absl::Span<const uint8_t> piece) {
            if (got + static_cast<int64_t>(piece.size()) <= expected) {
              std::memcpy(buffer.data() + group_at[from] + got, piece.data(),
                          piece.size());
            }
            got += static_cast<int64_t>(piece.size());
            return absl::OkStatus();
          }));
      stats.bytes_received += got;
      if (got != expected && failed.ok()) {
        failed = absl::DataLossError(absl::StrFormat(
            "shared restore: rank %d sent %d bytes of extents where %d were "
            "due",
            from, got, expected));
      }
    }
    if (!failed.ok()) continue;  // the other rounds still need its share
    // Restore the round's targets (those the manifest lacks: in the first,
    // where RestoreCheckpoint reports them).
    std::vector<RestoreTarget> round_targets;
    for (const RestoreTarget& target : targets) {
      const int a =
          index.has_value() ? std::max(0, index->IndexOf(target.name)) : 0;
      if (a >= first_array && a < end_array) round_targets.push_back(target);
    }
    absl::flat_hash_map<std::string,
                        std::map<int64_t, absl::Span<const uint8_t>>>
        cached;
    for (const auto& [id, at] : slot) {
      const ManifestExtent& extent = *extent_of[id];
      cached[PlaceOfExtent(step_dir, extent).path][extent.offset_bytes] =
          absl::MakeConstSpan(buffer.data() + at, extent.length_bytes);
    }
    absl::StatusOr<RestoreStats> round = RestoreCheckpoint(
        *manifest, step_dir, round_targets, pool, options, receiver,
        [&](const ExtentPlace& place)
            -> absl::StatusOr<std::unique_ptr<ReadableFile>> {
          const auto open = [&storage, place] {
            return storage.OpenReadableBeneath(place.dir, place.relative);
          };
          auto found = cached.find(place.path);
          if (found == cached.end()) return open();
          return std::make_unique<CachedFile>(&found->second, open, &served);
        });
    if (!round.ok()) {
      failed = round.status();
      continue;
    }
    stats.extents_read += round->extents_read;
    stats.bytes_read += round->bytes_read;
    stats.target_bytes += round->target_bytes;
    stats.dispatches += round->dispatches;
    stats.waves += round->waves;
  }
  RETURN_IF_ERROR(failed);
  stats.bytes_read += read.load() - served.load();
  stats.elapsed = absl::Now() - start;
  return stats;
}

}  // namespace hoist
