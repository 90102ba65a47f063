// SharedRestore (shared_restore.h), step by step:
//   1. Rank 0 reads the whole manifest; every other rank its head (of a
//      split manifest, only its first bytes; a document's extents are
//      dropped). Each rank sends rank 0 the boxes its targets ask for
//      (shared_plan_codec.h), with its host; rank 0 finds the extents each
//      rank's boxes meet (flat ids: the extents of all arrays, in manifest
//      order, counted from the head).
//   2. Rank 0 gives each extent needed by several ranks one reader among
//      them, the one with the fewest such bytes so far, and cuts the arrays
//      into rounds (whole arrays, in order) so that no rank holds more than
//      half of the pool of such extents at once; it scatters each rank its
//      view: the rounds, the extents that rank needs (what its restore
//      plans with), and the shared ones with their readers and needers (no
//      rank but 0 receives the others' needs).
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
#include "hoist/checkpoint/restore/cached_file.h"
#include "hoist/checkpoint/restore/extent_finder.h"
#include "hoist/checkpoint/restore/restore.h"
#include "hoist/checkpoint/restore/shared_plan_codec.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/format/manifest_index.h"

namespace hoist {
namespace {

// The step's manifest (step 1), its extents by flat id (`first_id[a]`:
// array a's extent 0, counted from the head). Rank 0 holds every extent;
// another rank the ones its view brought. Heap-allocated: `index` and
// `located` point into `manifest`.
struct JobNeeds {
  Manifest manifest;
  std::vector<int64_t> first_id;
  std::optional<ManifestIndex> index;
  int64_t count = 0;
  struct Located {
    const ManifestExtent* extent = nullptr;
    int array = 0;
  };
  absl::flat_hash_map<int64_t, Located> located;  // by flat id

  const ManifestExtent& ExtentOf(int64_t id) const {
    return *located.at(id).extent;
  }
  int ArrayOf(int64_t id) const { return located.at(id).array; }
  // The array flat id `id` belongs to (0 <= id < count).
  int ArrayHolding(int64_t id) const {
    return static_cast<int>(
        std::upper_bound(first_id.begin(), first_id.end(), id) -
        first_id.begin() - 1);
  }
  // Every extent `manifest` holds, by flat id: its arrays' extents whole
  // (rank 0's).
  void IndexExtents() {
    located.reserve(count);
    for (size_t a = 0; a < manifest.arrays.size(); ++a) {
      for (size_t e = 0; e < manifest.arrays[a].extents.size(); ++e) {
        located[first_id[a] + e] = {&manifest.arrays[a].extents[e],
                                    static_cast<int>(a)};
      }
    }
  }
};

// A round's bytes on this rank (step 3): its shared extents grouped by
// reader (this rank's own first), each group in id order, in one buffer.
struct RoundBuffer {
  std::vector<std::vector<int64_t>> by_reader;  // per rank: ids
  std::set<int> offsets;  // rank offsets that carry any extent
  absl::flat_hash_map<int64_t, int64_t> slot;  // id -> offset in buffer
  std::vector<int64_t> group_at;               // per reader
  // Not a lease of the pool: the caller may hold leases of it (staged parts
  // handed to a receiver) for as long as it likes.
  HostBuffer buffer{0};
};

class SharedRestorer {
 public:
  SharedRestorer(Coordinator& coordinator, Storage& storage,
                 const std::string& step_dir,
                 absl::Span<const RestoreTarget> targets, StagingPool& pool,
                 const RestoreOptions& options, const RestoreReceiver& receiver)
      : coordinator_(coordinator),
        storage_(storage),
        step_dir_(step_dir),
        targets_(targets),
        pool_(pool),
        options_(options),
        receiver_(receiver),
        n_(coordinator.size()),
        rank_(coordinator.rank()) {}

  // 1. The manifest and what each rank needs, gathered at rank 0 with each
  // rank's host; rank 0 plans (step 2) and scatters each rank its view of
  // the plan. A rank that cannot read the manifest still takes part, so
  // that every rank learns it and each falls back to restoring alone
  // (shared() false; this rank's error if its manifest failed).
  absl::Status GatherNeeds(bool share_on_one_host) {
    auto job = std::make_unique<JobNeeds>();
    // Rank 0 reads every extent; the others the head (of a split manifest,
    // its first bytes), and get the extents their boxes meet in their view.
    absl::StatusOr<ManifestHead> head = ReadManifestHead(storage_, step_dir_);
    if (head.ok() && rank_ == 0) {
      std::vector<size_t> every(head->sections.size());
      for (size_t i = 0; i < every.size(); ++i) every[i] = i;
      if (absl::Status read =
              ReadManifestSections(storage_, step_dir_, *head, every);
          !read.ok()) {
        head = read;
      }
    }
    std::string mine = "!";
    if (head.ok()) {
      for (const ManifestSection& section : head->sections) {
        job->first_id.push_back(job->count);
        job->count += section.extents;
      }
      job->manifest = std::move(head->manifest);
      if (rank_ != 0) {
        // A document's extents came with its head: the view brings the
        // ones this rank needs, as it does from a split manifest.
        for (ManifestArray& array : job->manifest.arrays) {
          array.extents.clear();
        }
      }
      job->index.emplace(job->manifest);
      mine = EncodeBoxes(job->manifest, *job->index, targets_);
    }
    // "HOST\nBOXES": a host name has no line break.
    ASSIGN_OR_RETURN(
        std::vector<std::string> lists,
        coordinator_.Gather("shared restore " + step_dir_,
                            absl::StrCat(HostName(), "\n", mine), 0));
    std::vector<std::string> views;
    if (rank_ == 0) {
      if (head.ok()) job->IndexExtents();
      views = PlanViews(*job, lists, share_on_one_host);
    }
    ASSIGN_OR_RETURN(const std::string view,
                     coordinator_.Scatter("shared restore plan " + step_dir_,
                                          std::move(views), 0));
    RETURN_IF_ERROR(head.status());
    if (view.empty()) return absl::OkStatus();  // each restores alone
    job_ = std::move(job);
    return DecodeView(view);
  }

  // 3, each round of the plan.
  absl::StatusOr<RestoreStats> Run() {
    for (size_t k = 0; k < rounds_.size(); ++k) {
      RETURN_IF_ERROR(RunRound(k, rounds_[k].first, rounds_[k].second));
    }
    RETURN_IF_ERROR(failed_);
    stats_.bytes_read += read_.load() - served_.load();
    return stats_;
  }

  bool shared() const { return job_ != nullptr; }

 private:
  // The whole job's plan, on rank 0 (step 2).
  struct JobPlan {
    // Per shared id: the ranks that need it (ascending), and its reader.
    std::map<int64_t, std::vector<int>> needers;
    std::map<int64_t, int> reader;
    std::vector<std::pair<int, int>> rounds;
    std::vector<std::set<int>> offsets;  // per round
  };

  // Step 2 on rank 0: from every rank's host and needs (`lists`), each
  // rank's view of the plan (ViewOf), or empty views when the ranks are to
  // restore alone (one host and !share_on_one_host, or a rank without the
  // manifest or with a malformed list).
  std::vector<std::string> PlanViews(const JobNeeds& job,
                                     std::vector<std::string>& lists,
                                     bool share_on_one_host) const {
    const std::vector<std::string> alone(n_);
    std::set<std::string> hosts;
    for (std::string& list : lists) {
      const size_t line = list.find('\n');
      hosts.insert(list.substr(0, line));
      list.erase(0, line == std::string::npos ? list.size() : line + 1);
    }
    if (hosts.size() == 1 && !share_on_one_host) return alone;
    if (job.index == std::nullopt) return alone;  // rank 0 has no manifest
    // Each rank's needs: the extents its boxes meet.
    const ExtentFinder finder(job.manifest, job.first_id);
    std::vector<std::vector<int64_t>> needs(n_);
    for (int r = 0; r < n_; ++r) {
      if (lists[r] == "!") return alone;
      absl::StatusOr<std::vector<ArrayBox>> boxes =
          DecodeBoxes(lists[r], job.manifest, r);
      if (!boxes.ok()) return alone;
      for (const ArrayBox& box : *boxes)
        finder.Find(box.array, box.box, needs[r]);
      std::sort(needs[r].begin(), needs[r].end());
      needs[r].erase(std::unique(needs[r].begin(), needs[r].end()),
                     needs[r].end());
    }
    JobPlan plan;
    AssignReaders(job, needs, plan);
    PlanRounds(job, plan);
    std::vector<std::string> views;
    for (int r = 0; r < n_; ++r) {
      views.push_back(ViewOf(job, plan, r, r == 0 ? nullptr : &needs[r]));
    }
    return views;
  }

  // Each extent needed by several ranks gets one reader among them, the one
  // with the fewest such bytes so far.
  void AssignReaders(const JobNeeds& job,
                     const std::vector<std::vector<int64_t>>& needs,
                     JobPlan& plan) const {
    for (int r = 0; r < n_; ++r) {
      for (int64_t id : needs[r]) plan.needers[id].push_back(r);
    }
    std::vector<int64_t> assigned(n_, 0);
    for (auto it = plan.needers.begin(); it != plan.needers.end();) {
      if (it->second.size() < 2) {
        it = plan.needers.erase(it);
        continue;
      }
      int best = it->second.front();
      for (int r : it->second) {
        if (assigned[r] < assigned[best]) best = r;
      }
      assigned[best] += job.ExtentOf(it->first).length_bytes;
      plan.reader[it->first] = best;
      ++it;
    }
  }

  // Rounds: [first array, end array), closed before an array whose shared
  // extents would take a rank past half the pool; and per round, the rank
  // offsets that carry any extent (an Exchange each, on every rank).
  void PlanRounds(const JobNeeds& job, JobPlan& plan) const {
    const int64_t budget = std::max<int64_t>(pool_.capacity_bytes() / 2, 1);
    const int arrays = static_cast<int>(job.manifest.arrays.size());
    std::vector<int64_t> held(n_, 0);
    int begin = 0;
    auto it = plan.needers.begin();
    for (int a = 0; a < arrays; ++a) {
      std::map<int, int64_t> add;
      const int64_t end_id =
          job.first_id[a] +
          static_cast<int64_t>(job.manifest.arrays[a].extents.size());
      for (auto j = it; j != plan.needers.end() && j->first < end_id; ++j) {
        for (int r : j->second) add[r] += job.ExtentOf(j->first).length_bytes;
      }
      bool over = false;
      for (const auto& [r, bytes] : add) over |= held[r] + bytes > budget;
      if (over && a > begin) {
        plan.rounds.emplace_back(begin, a);
        begin = a;
        std::fill(held.begin(), held.end(), 0);
      }
      for (const auto& [r, bytes] : add) held[r] += bytes;
      while (it != plan.needers.end() && it->first < end_id) ++it;
    }
    plan.rounds.emplace_back(begin, arrays);
    // (A manifest without arrays is one empty round.)
    const auto id_of = [&](int a) {
      return a < static_cast<int>(job.first_id.size()) ? job.first_id[a]
                                                       : job.count;
    };
    for (const auto& [first, end] : plan.rounds) {
      std::set<int>& offsets = plan.offsets.emplace_back();
      for (auto j = plan.needers.lower_bound(id_of(first));
           j != plan.needers.end() && j->first < id_of(end); ++j) {
        const int from = plan.reader.at(j->first);
        for (int r : j->second) {
          if (r != from) offsets.insert((r - from + n_) % n_);
        }
      }
    }
  }

  // Rank r's view of `plan`: the rounds and their offsets (the same for
  // every rank), the extents r needs (`needs`; none for rank 0, which has
  // them), and each shared id r needs with its reader and needers:
  // i32 rounds | per round i32 first, end, i32 count | offsets |
  // i64 extents | per extent PutExtent |
  // i64 ids | per id: i64 id, i32 reader, i32 count | needers.
  std::string ViewOf(const JobNeeds& job, const JobPlan& plan, int r,
                     const std::vector<int64_t>* needs) const {
    std::string view;
    WireWriter out(view);
    out.Put(static_cast<int32_t>(plan.rounds.size()));
    for (size_t k = 0; k < plan.rounds.size(); ++k) {
      out.Put(static_cast<int32_t>(plan.rounds[k].first));
      out.Put(static_cast<int32_t>(plan.rounds[k].second));
      out.Put(static_cast<int32_t>(plan.offsets[k].size()));
      for (int d : plan.offsets[k]) out.Put(static_cast<int32_t>(d));
    }
    out.Put(static_cast<int64_t>(needs == nullptr ? 0 : needs->size()));
    if (needs != nullptr) {
      for (const int64_t id : *needs) PutExtent(out, id, job.ExtentOf(id));
    }
    std::string ids;
    WireWriter shared(ids);
    int64_t count = 0;
    for (const auto& [id, who] : plan.needers) {
      if (!std::binary_search(who.begin(), who.end(), r)) continue;
      ++count;
      shared.Put(id);
      shared.Put(static_cast<int32_t>(plan.reader.at(id)));
      shared.Put(static_cast<int32_t>(who.size()));
      for (int w : who) shared.Put(static_cast<int32_t>(w));
    }
    out.Put(count);
    return view + ids;
  }

  // This rank's view, as ViewOf made it: rounds_, round_offsets_, and the
  // needers and reader of every shared id it needs.
  absl::Status DecodeView(std::string_view view) {
    const auto bad =
        absl::InternalError("shared restore: a malformed plan from rank 0");
    WireReader in(view);
    int32_t rounds = 0;
    if (!in.Take(rounds) || rounds < 0) return bad;
    for (int32_t k = 0; k < rounds; ++k) {
      int32_t first = 0, end = 0, offsets = 0;
      if (!in.Take(first) || !in.Take(end) || !in.Take(offsets) ||
          offsets < 0) {
        return bad;
      }
      rounds_.emplace_back(first, end);
      std::set<int>& into = round_offsets_.emplace_back();
      for (int32_t i = 0; i < offsets; ++i) {
        int32_t d = 0;
        if (!in.Take(d) || d <= 0 || d >= n_) return bad;
        into.insert(d);
      }
    }
    if (!TakeExtents(in)) return bad;
    int64_t ids = 0;
    if (!in.Take(ids) || ids < 0) return bad;
    for (int64_t i = 0; i < ids; ++i) {
      int64_t id = 0;
      int32_t reader = 0, count = 0;
      if (!in.Take(id) || !in.Take(reader) || !in.Take(count) || id < 0 ||
          id >= job_->count || reader < 0 || reader >= n_ || count < 0 ||
          !job_->located.contains(id)) {  // an extent this rank lacks
        return bad;
      }
      std::vector<int>& who = needers_[id];
      for (int32_t w = 0; w < count; ++w) {
        int32_t needer = 0;
        if (!in.Take(needer) || needer < 0 || needer >= n_) return bad;
        who.push_back(needer);
      }
      reader_[id] = reader;
    }
    return in.done() ? absl::OkStatus() : bad;
  }

  // The extents the view brings (ascending ids, each of an array it
  // places it in) into this rank's manifest, located by id; rank 0's own
  // are already there. False for a malformed list.
  bool TakeExtents(WireReader& in) {
    int64_t count = 0;
    if (!in.Take(count) || count < 0 || count > job_->count) return false;
    std::vector<std::pair<int64_t, int>> placed;  // id, array
    placed.reserve(count);
    for (int64_t i = 0; i < count; ++i) {
      int64_t id = -1;
      if (!in.Take(id) || id < 0 || id >= job_->count ||
          (!placed.empty() && id <= placed.back().first)) {
        return false;
      }
      const int a = job_->ArrayHolding(id);
      ManifestArray& array = job_->manifest.arrays[a];
      if (!TakeExtent(in, array, array.extents.emplace_back())) return false;
      placed.emplace_back(id, a);
    }
    // Located once every extent is in place (the vectors no longer move).
    std::vector<size_t> next(job_->manifest.arrays.size(), 0);
    for (const auto& [id, a] : placed) {
      job_->located[id] = {&job_->manifest.arrays[a].extents[next[a]++], a};
    }
    return true;
  }

  // 3. One round: this rank reads its share for the others, sends each
  // rank its part and receives its own, then restores the round's targets.
  // A rank that failed still sends its share: the other rounds need it.
  absl::Status RunRound(size_t k, int first_array, int end_array) {
    RoundBuffer round = LayOutRound(k, first_array, end_array);
    const absl::Time sharing = absl::Now();
    ReadOwnShare(round);
    for (int d : round.offsets) RETURN_IF_ERROR(ExchangeShare(k, d, round));
    AddPhases({{"read", absl::Now() - sharing, 0, 0}}, stats_.phases);
    if (!failed_.ok()) return absl::OkStatus();
    absl::StatusOr<RestoreStats> restored =
        RestoreRound(round, first_array, end_array);
    if (!restored.ok()) {
      failed_ = restored.status();
      return absl::OkStatus();
    }
    stats_.extents_read += restored->extents_read;
    stats_.bytes_read += restored->bytes_read;
    stats_.target_bytes += restored->target_bytes;
    stats_.dispatches += restored->dispatches;
    stats_.waves += restored->waves;
    AddPhases(restored->phases, stats_.phases);
    return absl::OkStatus();
  }

  RoundBuffer LayOutRound(size_t k, int first_array, int end_array) const {
    // (A manifest without arrays is one empty round.)
    const auto id_of = [&](int a) {
      return a < static_cast<int>(job_->first_id.size()) ? job_->first_id[a]
                                                         : job_->count;
    };
    const int64_t lo = id_of(first_array), hi = id_of(end_array);
    RoundBuffer round;
    round.by_reader.resize(n_);
    for (auto it = needers_.lower_bound(lo);
         it != needers_.end() && it->first < hi; ++it) {
      round.by_reader[reader_.at(it->first)].push_back(it->first);
    }
    round.offsets = round_offsets_[k];
    round.group_at.assign(n_, 0);
    int64_t bytes = 0;
    for (int i = 0; i < n_; ++i) {
      const int from = (rank_ + i) % n_;
      round.group_at[from] = bytes;
      for (int64_t id : round.by_reader[from]) {
        round.slot[id] = bytes;
        bytes += job_->ExtentOf(id).length_bytes;
      }
    }
    round.buffer = HostBuffer(bytes);
    return round;
  }

  // Reads and verifies what this rank reads for the others, on up to
  // options.reader_threads threads. An extent that fails is left as zeros,
  // which fail the receivers' hash check; this rank records its error.
  void ReadOwnShare(RoundBuffer& round) {
    const std::vector<int64_t>& own = round.by_reader[rank_];
    FirstError error;
    std::atomic<size_t> next{0};
    const auto read_some = [&] {
      absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>> files;
      for (size_t i = next.fetch_add(1); i < own.size();
           i = next.fetch_add(1)) {
        absl::Span<uint8_t> into(round.buffer.data() + round.slot.at(own[i]),
                                 job_->ExtentOf(own[i]).length_bytes);
        if (absl::Status s = ReadExtent(own[i], into, files); !s.ok()) {
          std::memset(into.data(), 0, into.size());
          error.Record(s);
        }
      }
    };
    std::vector<std::thread> threads;
    const size_t count_threads =
        std::min<size_t>(std::max(1, options_.reader_threads), own.size());
    for (size_t t = 1; t < count_threads; ++t) {
      threads.emplace_back(read_some);
    }
    read_some();
    for (std::thread& t : threads) t.join();
    if (failed_.ok()) failed_ = error.Get();
  }

  absl::Status ReadExtent(
      int64_t id, absl::Span<uint8_t> into,
      absl::flat_hash_map<std::string, std::unique_ptr<ReadableFile>>& files) {
    const ManifestExtent& extent = job_->ExtentOf(id);
    const ExtentPlace place = PlaceOfExtent(step_dir_, extent);
    std::unique_ptr<ReadableFile>& file = files[place.path];
    if (file == nullptr) {
      ASSIGN_OR_RETURN(file,
                       storage_.OpenReadableBeneath(place.dir, place.relative));
    }
    RETURN_IF_ERROR(file->ReadAt(extent.offset_bytes, into));
    read_.fetch_add(extent.length_bytes);
    if (options_.verify_xxh3 &&
        !ExtentMatches(extent.hash, into.data(), into.size())) {
      return absl::DataLossError(
          absl::StrFormat("array '%s': xxh3 mismatch in %s @ %d",
                          job_->manifest.arrays[job_->ArrayOf(id)].name,
                          place.relative, extent.offset_bytes));
    }
    return absl::OkStatus();
  }

  // Sends rank +d its share of this rank's reads; receives rank -d's into
  // its group. kDataLoss recorded (not returned) for a short share; the
  // coordinator's errors (a lost rank) returned.
  absl::Status ExchangeShare(size_t k, int d, RoundBuffer& round) {
    const int to = (rank_ + d) % n_, from = (rank_ - d + n_) % n_;
    // What `to` needs of this rank's reads: all of them (data-parallel
    // replicas), sent from the buffer as it is; else a copy of its share.
    std::vector<uint8_t> copy;
    int64_t own_bytes = 0;
    bool all = true;
    for (int64_t id : round.by_reader[rank_]) {
      own_bytes += job_->ExtentOf(id).length_bytes;
      const std::vector<int>& who = needers_.at(id);
      all &= std::binary_search(who.begin(), who.end(), to);
    }
    absl::Span<const uint8_t> send(round.buffer.data() + round.group_at[rank_],
                                   static_cast<size_t>(own_bytes));
    if (!all) {
      for (int64_t id : round.by_reader[rank_]) {
        const std::vector<int>& who = needers_.at(id);
        if (!std::binary_search(who.begin(), who.end(), to)) continue;
        const uint8_t* at = round.buffer.data() + round.slot.at(id);
        copy.insert(copy.end(), at, at + job_->ExtentOf(id).length_bytes);
      }
      send = copy;
    }
    int64_t expected = 0;
    for (int64_t id : round.by_reader[from]) {
      expected += job_->ExtentOf(id).length_bytes;
    }
    int64_t got = 0;
    RETURN_IF_ERROR(coordinator_.Exchange(
        absl::StrFormat("shared restore round %d +%d", k, d), send, to, from,
        [&](absl::Span<const uint8_t> piece) {
          if (got + static_cast<int64_t>(piece.size()) <= expected) {
            std::memcpy(round.buffer.data() + round.group_at[from] + got,
                        piece.data(), piece.size());
          }
          got += static_cast<int64_t>(piece.size());
          return absl::OkStatus();
        }));
    stats_.bytes_received += got;
    if (got != expected && failed_.ok()) {
      failed_ = absl::DataLossError(absl::StrFormat(
          "shared restore: rank %d sent %d bytes of extents where %d were "
          "due",
          from, got, expected));
    }
    return absl::OkStatus();
  }

  // The round's targets (those the manifest lacks: in the first, where
  // RestoreCheckpoint reports them) restored, shared extents served from
  // the round's buffer, the rest read from storage.
  absl::StatusOr<RestoreStats> RestoreRound(const RoundBuffer& round,
                                            int first_array, int end_array) {
    std::vector<RestoreTarget> round_targets;
    for (const RestoreTarget& target : targets_) {
      const int a = std::max(0, job_->index->IndexOf(target.name));
      if (a >= first_array && a < end_array) round_targets.push_back(target);
    }
    absl::flat_hash_map<std::string,
                        std::map<int64_t, absl::Span<const uint8_t>>>
        cached;
    for (const auto& [id, at] : round.slot) {
      const ManifestExtent& extent = job_->ExtentOf(id);
      cached[PlaceOfExtent(step_dir_, extent).path][extent.offset_bytes] =
          absl::MakeConstSpan(round.buffer.data() + at, extent.length_bytes);
    }
    return RestoreCheckpoint(
        job_->manifest, step_dir_, round_targets, pool_, options_, receiver_,
        [&](const ExtentPlace& place)
            -> absl::StatusOr<std::unique_ptr<ReadableFile>> {
          const auto open = [this, place] {
            return storage_.OpenReadableBeneath(place.dir, place.relative);
          };
          auto found = cached.find(place.path);
          if (found == cached.end()) return open();
          return std::make_unique<CachedFile>(&found->second, open, &served_);
        });
  }

  Coordinator& coordinator_;
  Storage& storage_;
  const std::string& step_dir_;
  const absl::Span<const RestoreTarget> targets_;
  StagingPool& pool_;
  const RestoreOptions& options_;
  const RestoreReceiver& receiver_;
  const int n_, rank_;
  std::unique_ptr<JobNeeds> job_;
  // This rank's view of the plan: per shared id it needs, the ranks that
  // need it (ascending) and its reader; the rounds, and per round the rank
  // offsets that carry any extent.
  std::map<int64_t, std::vector<int>> needers_;
  std::map<int64_t, int> reader_;
  std::vector<std::pair<int, int>> rounds_;
  std::vector<std::set<int>> round_offsets_;
  RestoreStats stats_;
  absl::Status failed_;  // this rank's first error; it still sends its share
  // Bytes of extents: read for the others here, and served from memory to
  // RestoreCheckpoint (which counts every extent it takes as read).
  std::atomic<int64_t> read_{0}, served_{0};
};

}  // namespace

absl::StatusOr<RestoreStats> SharedRestore(
    Coordinator& coordinator, Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver,
    bool share_on_one_host) {
  if (coordinator.size() == 1) {
    return RestoreCheckpoint(storage, step_dir, targets, pool, options,
                             receiver);
  }
  const absl::Time start = absl::Now();
  SharedRestorer restorer(coordinator, storage, step_dir, targets, pool,
                          options, receiver);
  RETURN_IF_ERROR(restorer.GatherNeeds(share_on_one_host));
  if (!restorer.shared()) {
    return RestoreCheckpoint(storage, step_dir, targets, pool, options,
                             receiver);
  }
  ASSIGN_OR_RETURN(RestoreStats stats, restorer.Run());
  stats.elapsed = absl::Now() - start;
  // The rest (gathering the needs, laying out the rounds) is planning.
  absl::Duration phases;
  for (const PhaseStat& phase : stats.phases) phases += phase.elapsed;
  AddPhases({{"planning",
              std::max(stats.elapsed - phases, absl::ZeroDuration()), 0, 0}},
            stats.phases);
  return stats;
}

}  // namespace hoist
