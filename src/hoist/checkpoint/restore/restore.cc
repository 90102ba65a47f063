// Restore, step by step:
//   1. Read and validate the manifest; match every target against it; plan
//      (PlanRestore, restore_plan.h): which images (host destinations in
//      place; device boxes, or parts of them, in leases shared by replicas),
//      in which waves, reading which extents.
//   2. The waves, pipelined:
//      - a WaveAcquirer takes each wave's leases (all at once) as soon as
//        the pool has room, plans its reads (WaveReads, wave_reader.h: runs
//        of neighbouring extents, each read straight into its lease where
//        it can, else through a reader's buffer and copied), and queues
//        them in the ReaderCrew; a Prefaulter faults in its fresh host
//        destinations ahead of the copies;
//      - the crew's readers (at most options.reader_threads, for the whole
//        restore) take the runs in order, across waves, opening data files
//        below the step directory without following links, and verify each
//        extent's XXH3;
//      - the calling thread takes the waves in order: once a wave's reads
//        are over, ONE CopyFromHost per device, and one call of the
//        receiver (for destinations without device or memory), carry all
//        of its images, and its leases return to the pool when the copies
//        landed (which makes room for the waves after it).
//      On an error, no more waves are taken, the queued reads are dropped,
//      and the leases of the waves not dispatched return.
//   3. Wait for every copy.
#include "hoist/checkpoint/restore/restore.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/bytes.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/status_macros.h"
#include "hoist/box.h"
#include "hoist/checkpoint/restore/extent_reader.h"
#include "hoist/checkpoint/restore/prefault.h"
#include "hoist/checkpoint/restore/wave_reader.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/format/manifest_index.h"
#include "hoist/huge_pages.h"
#include "hoist/restore_plan.h"

namespace hoist {
namespace {

// Threads faulting in fresh destinations ahead of the reads (prefault.h):
// one per four cores, from one to four. On this project's 2-core VM one
// thread took the first restore of 2 GiB into new memory in a process from
// 2.69 s to 2.26 s (medians of 8, alternated; CPU 2.95 to 2.38 s), and two
// did no better than one, with more CPU.
int PrefaultThreads() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores / 4, 1, 4);
}

// A wave on its way: its leases, its reads (queued in the crew), and the
// Prefaulter of its fresh destinations.
struct StagedWave {
  std::vector<Lease> leases;  // moved out when its copies are dispatched
  std::unique_ptr<WaveReads> reads;
  int crew_wave = -1;
  std::unique_ptr<Prefaulter> prefaulter;
};

// Takes a restore's waves ahead: on a thread of its own (none for a single
// wave), each wave's leases are taken as soon as the pool has room for
// them, its reads are planned (by `stage`) and queued in the crew, so the
// readers go from one wave to the next without waiting for the restoring
// thread. The pool's backpressure bounds how far ahead it gets: the waves
// are at most half of it (restore_plan.h), and a wave's leases return once
// its copies have landed. The restoring thread takes the waves in order
// (Next), and dispatches each once its reads are over; the receiver stays
// on that thread, as its contract says. Thread-safe.
class WaveAcquirer {
 public:
  using Stage = std::function<std::unique_ptr<StagedWave>(
      const RestoreWave& wave, std::vector<Lease> leases)>;

  // `plan`, `pool`, `crew` and `stage` must outlive the acquirer.
  WaveAcquirer(const RestorePlan& plan, StagingPool& pool, ReaderCrew& crew,
               int prefault_threads, Stage stage)
      : plan_(plan),
        pool_(pool),
        crew_(crew),
        prefault_threads_(prefault_threads),
        stage_(std::move(stage)) {
    if (plan_.waves.size() > 1) {
      thread_ = std::thread(&WaveAcquirer::Run, this);
    } else {
      Run();
    }
  }

  // Stop()s.
  ~WaveAcquirer() { Stop(); }
  WaveAcquirer(const WaveAcquirer&) = delete;
  WaveAcquirer& operator=(const WaveAcquirer&) = delete;

  // Blocks until wave `w` has its leases and its reads are queued; the
  // pool's error if taking them failed (then for every later wave too).
  absl::StatusOr<StagedWave*> Next(size_t w) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    next_ = w;
    mu_.Await(Condition(this, &WaveAcquirer::NextReady));
    if (w < waves_.size()) return waves_[w].get();
    return status_;
  }

  // Takes no more waves, stops the crew (no read writes a lease or a
  // destination after this), returns the leases of the waves not
  // dispatched, and joins the thread. Every wave must be dispatched or
  // abandoned by then. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    crew_.Stop();
    {
      MutexLock lock(&mu_);
      for (const std::unique_ptr<StagedWave>& wave : waves_) {
        wave->prefaulter.reset();
        wave->leases.clear();
      }
    }
    // It may be waiting for room in the pool: the leases returned above,
    // and those of the copies under way once they land, make it.
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    for (const RestoreWave& wave : plan_.waves) {
      std::vector<int64_t> sizes;
      for (int i : wave.images) {
        if (!plan_.images[i].in_place) sizes.push_back(plan_.images[i].bytes);
      }
      absl::StatusOr<std::vector<Lease>> leases = pool_.AcquireAll(sizes);
      if (!leases.ok()) {
        MutexLock lock(&mu_);
        status_ = leases.status();
        done_ = true;
        return;
      }
      std::unique_ptr<StagedWave> staged = stage_(wave, *std::move(leases));
      MutexLock lock(&mu_);
      if (stopping_) return;  // its leases return as it goes
      staged->crew_wave = crew_.Add(*staged->reads);
      staged->prefaulter = std::make_unique<Prefaulter>(
          staged->reads->FreshRanges(), crew_.taken(staged->crew_wave),
          prefault_threads_);
      waves_.push_back(std::move(staged));
    }
    MutexLock lock(&mu_);
    done_ = true;
  }

  bool NextReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return next_ < waves_.size() || done_;
  }

  const RestorePlan& plan_;
  StagingPool& pool_;
  ReaderCrew& crew_;
  const int prefault_threads_;
  const Stage stage_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<StagedWave>> waves_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;  // the wave Next waits for
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // of the pool, if it failed
  std::thread thread_;
};

// A part (manifest.h) holds only what one process held: kFailedPrecondition
// when `box` reaches outside its extents (they are disjoint, so the sizes
// of their intersections with `box` add up to `box`'s exactly when they
// cover it).
absl::Status CheckInPart(const ManifestArray& array, const Box& box,
                         const std::string& step_dir) {
  int64_t covered = 0;
  for (const ManifestExtent& extent : array.extents) {
    covered += extent.box.Intersect(box).num_elements();
  }
  if (covered == box.num_elements()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "array '%s': box %s is not all in %s, which is one process's part of a "
      "local-tier step (it holds only what that process held)",
      array.name, box.ToString(), step_dir));
}

// 1. What the targets ask of the manifest: the saved arrays the plan
// reads (`saved`, `arrays` in the same order), and every destination box
// (`boxes`, `dest_of` in the same order).
struct MatchedTargets {
  std::vector<const ManifestArray*> arrays;
  std::vector<SavedArray> saved;
  std::vector<DestinationBox> boxes;
  std::vector<const RestoreDestination*> dest_of;
};

absl::StatusOr<MatchedTargets> MatchTargets(
    const Manifest& manifest, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, const RestoreReceiver& receiver) {
  MatchedTargets m;
  const ManifestIndex index(manifest);
  absl::flat_hash_map<const ManifestArray*, int> index_of;
  for (const RestoreTarget& target : targets) {
    const ManifestArray* array = index.Find(target.name);
    if (array == nullptr) {
      return absl::NotFoundError(
          absl::StrFormat("array '%s' is not in %s", target.name, step_dir));
    }
    if (array->dtype != target.dtype || array->shape != target.shape) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "array '%s': requested %s %s but %s holds %s %s", target.name,
          DTypeName(target.dtype), ShapeToString(target.shape), step_dir,
          DTypeName(array->dtype), ShapeToString(array->shape)));
    }
    auto [it, inserted] =
        index_of.emplace(array, static_cast<int>(m.saved.size()));
    if (inserted) {
      SavedArray s{array->name, ItemSize(array->dtype), array->shape, {}};
      s.extents.reserve(array->extents.size());
      for (const ManifestExtent& extent : array->extents) {
        s.extents.push_back(extent.box);
      }
      m.saved.push_back(std::move(s));
      m.arrays.push_back(array);
    }
    const Box whole = Box::FromShape(array->shape);
    for (const RestoreDestination& dest : target.destinations) {
      const bool received = dest.data == nullptr && dest.device == nullptr;
      if (dest.box.rank() != whole.rank() || !whole.Contains(dest.box) ||
          (dest.data == nullptr && !dest.box.empty() &&
           !(received && receiver))) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "array '%s': destination box %s lies outside %s or has no memory "
            "(and no receiver)",
            target.name, dest.box.ToString(), ShapeToString(array->shape)));
      }
      if (dest.box.empty()) continue;
      if (manifest.part) {
        RETURN_IF_ERROR(CheckInPart(*array, dest.box, step_dir));
      }
      // Device and receiver boxes are staged through the pool.
      m.boxes.push_back(
          {it->second, dest.box, dest.device != nullptr || received});
      m.dest_of.push_back(&dest);
    }
  }
  return m;
}

// The plan, and the readers' buffers. These are the pool's first bytes,
// up to a quarter of it, where they are free now: resident and in huge
// pages, where buffers mapped for this restore are fresh memory, and fresh
// huge pages cost 4-9 s/GiB to fault in on this project's VM (a third of a
// restore's CPU onto devices). The waves are then planned in the rest of
// the pool, and always find room there once other users of the pool (a
// save under way) are done (TryAcquireFront). Otherwise (a pool too small,
// busy, or still to be pinned; or boxes that need all of it) each reader
// maps its own.
struct PlannedReads {
  RestorePlan plan;
  std::optional<Lease> lent_memory;
  std::vector<ReadBuffer> buffers;
};

absl::StatusOr<PlannedReads> PlanReads(const MatchedTargets& m,
                                       StagingPool& pool, int readers) {
  constexpr int64_t kLent = AlignUp(kReadBufferBytes, StagingPool::kAlignment);
  const int lent = static_cast<int>(
      std::min<int64_t>(readers, pool.capacity_bytes() / 4 / kLent));
  PlannedReads out;
  if (lent > 0) out.lent_memory = pool.TryAcquireFront(lent * kLent);
  absl::StatusOr<RestorePlan> planned = PlanRestore(
      m.saved, m.boxes,
      pool.capacity_bytes() -
          (out.lent_memory ? out.lent_memory->reserved_bytes() : 0));
  if (!planned.ok() && out.lent_memory) {
    out.lent_memory.reset();
    planned = PlanRestore(m.saved, m.boxes, pool.capacity_bytes());
  }
  RETURN_IF_ERROR(planned.status());
  out.plan = *std::move(planned);
  out.buffers.reserve(readers);
  for (int i = 0; i < readers; ++i) {
    if (out.lent_memory && i < lent) {
      out.buffers.emplace_back(absl::MakeSpan(
          out.lent_memory->data() + i * kLent, static_cast<size_t>(kLent)));
    } else {
      out.buffers.emplace_back();
    }
  }
  return out;
}

// A wave's reads planned into its leases (and its in-place destinations):
// images[k] is where image wave.images[k] is assembled.
std::unique_ptr<StagedWave> StageWave(const MatchedTargets& m,
                                      const RestorePlan& plan,
                                      const RestoreOptions& options,
                                      const RestoreWave& wave,
                                      std::vector<Lease> leases) {
  std::vector<WaveImage> images;
  absl::flat_hash_map<int, int> image_at;
  size_t next_lease = 0;
  for (int i : wave.images) {
    const RestoreImage& image = plan.images[i];
    uint8_t* host = image.in_place
                        ? static_cast<uint8_t*>(
                              m.dest_of[image.destinations[0].first]->data)
                        : leases[next_lease++].data();
    image_at[i] = static_cast<int>(images.size());
    images.push_back({image.box, host, image.in_place});
  }
  std::vector<ReadTask> tasks;
  tasks.reserve(wave.reads.size());
  for (const RestoreRead& read : wave.reads) {
    ReadTask task{m.arrays[read.array], read.extent, {}};
    for (int i : read.images) task.images.push_back(image_at.at(i));
    tasks.push_back(std::move(task));
  }
  auto staged = std::make_unique<StagedWave>();
  staged->leases = std::move(leases);
  staged->reads = std::make_unique<WaveReads>(
      std::move(tasks), std::move(images), options.stage_host_reads);
  return staged;
}

// A wave whose reads are over, placed: one CopyFromHost per device and one
// call of the receiver carry its images; its leases return once the copies
// landed (`copies` gets the future of that). On an error the wave's leases
// return when the acquirer stops.
absl::Status PlaceWave(const MatchedTargets& m, const RestorePlan& plan,
                       const RestoreWave& wave, StagedWave& staged,
                       const RestoreReceiver& receiver, RestoreStats& stats,
                       std::vector<Future<>>& copies) {
  absl::flat_hash_map<Device*, std::vector<CopyOp>> ops;
  std::vector<StagedPart> received;
  for (size_t k = 0; k < wave.images.size(); ++k) {
    const RestoreImage& image = plan.images[wave.images[k]];
    if (image.in_place) continue;
    const uint8_t* from = staged.reads->images()[k].host;
    for (const auto& [d, offset] : image.destinations) {
      const RestoreDestination& dest = *m.dest_of[d];
      if (dest.device == nullptr) {
        received.push_back({&dest, image.box, offset, from, image.bytes});
        continue;
      }
      ops[dest.device].push_back({from, image.bytes,
                                  static_cast<uint8_t*>(dest.data) + offset,
                                  image.bytes, image.bytes, 1});
    }
  }
  if (!received.empty()) RETURN_IF_ERROR(receiver(received));
  std::vector<Future<>> wave_copies;
  for (auto& [device, device_ops] : ops) {
    wave_copies.push_back(device->CopyFromHost(device_ops));
    ++stats.dispatches;
  }
  // `released` completes only after the leases are back: a callback added
  // to `landed` later could otherwise run (inline) while the release is
  // still under way on the device's thread.
  Promise<> released;
  copies.push_back(released.future());
  WhenAll(wave_copies)
      .OnReady(
          [leases = std::move(staged.leases),
           released = std::move(released)](const absl::Status& status) mutable {
            leases.clear();
            released.Set(status);
          });
  return absl::OkStatus();
}

}  // namespace

std::vector<PhaseStat> RestorePhases(const RestoreTimes& times,
                                     absl::Duration verifying,
                                     const RestoreStats& stats) {
  // Reads and checks overlap on the reader threads: the checks' share of
  // the reads' time is theirs (their threads' time over the crew's size).
  const absl::Duration reading =
      std::max(times.waves - times.placing, absl::ZeroDuration());
  const absl::Duration verify = std::min(verifying, reading);
  const int64_t verified =
      verifying > absl::ZeroDuration() ? stats.bytes_read : 0;
  return {
      {"planning", times.planning, stats.target_bytes, 0},
      {"read", reading - verify, stats.bytes_read, 0},
      {"verify", verify, verified, 0},
      {"place", std::min(times.placing, times.waves), stats.target_bytes, 0},
  };
}

void AddPhases(absl::Span<const PhaseStat> more, std::vector<PhaseStat>& into) {
  static constexpr std::string_view kOrder[] = {"planning", "read", "verify",
                                                "place"};
  const auto rank_of = [](std::string_view name) {
    return std::find(std::begin(kOrder), std::end(kOrder), name) -
           std::begin(kOrder);
  };
  for (const PhaseStat& phase : more) {
    auto it = std::find_if(into.begin(), into.end(), [&](const PhaseStat& p) {
      return p.phase == phase.phase;
    });
    if (it != into.end()) {
      it->elapsed += phase.elapsed;
      it->bytes += phase.bytes;
      continue;
    }
    it = std::find_if(into.begin(), into.end(), [&](const PhaseStat& p) {
      return rank_of(p.phase) > rank_of(phase.phase);
    });
    into.insert(it, phase);
  }
}

absl::StatusOr<RestoreStats> RestoreCheckpoint(
    Storage& storage, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver) {
  const absl::Time start = absl::Now();
  // Only the targets' arrays: of a split manifest, only their sections.
  absl::flat_hash_set<std::string> names;
  for (const RestoreTarget& target : targets) names.insert(target.name);
  ASSIGN_OR_RETURN(const Manifest manifest,
                   ReadManifestArrays(storage, step_dir, names));
  ASSIGN_OR_RETURN(
      RestoreStats stats,
      RestoreCheckpoint(manifest, step_dir, targets, pool, options, receiver,
                        [&storage](const ExtentPlace& place) {
                          return storage.OpenReadableBeneath(place.dir,
                                                             place.relative);
                        }));
  // The manifest's read is planning too.
  const absl::Duration total = absl::Now() - start;
  if (!stats.phases.empty()) stats.phases[0].elapsed += total - stats.elapsed;
  stats.elapsed = total;
  return stats;
}

absl::StatusOr<RestoreStats> RestoreCheckpoint(
    const Manifest& manifest, const std::string& step_dir,
    absl::Span<const RestoreTarget> targets, StagingPool& pool,
    const RestoreOptions& options, const RestoreReceiver& receiver,
    const ExtentFileOpener& open) {
  static_assert(StagingPool::kAlignment == 4096,
                "PlanRestore assumes 4 KiB leases");
  const absl::Time start = absl::Now();
  RestoreStats stats;
  // 1. Each target matched against the manifest, and the plan.
  ASSIGN_OR_RETURN(const MatchedTargets m,
                   MatchTargets(manifest, step_dir, targets, receiver));
  ASSIGN_OR_RETURN(PlannedReads reads,
                   PlanReads(m, pool, std::max(1, options.reader_threads)));
  const RestorePlan& plan = reads.plan;
  for (const RestoreImage& image : plan.images) {
    stats.target_bytes += image.bytes;
  }
  // 2. The waves: their leases and reads, taken ahead (WaveAcquirer); then,
  // as each one's reads are over, one copy per device.
  const absl::Time planned = absl::Now();
  const int readers = std::max<int>(1, reads.buffers.size());
  std::atomic<int64_t> verify_ns{0};
  absl::Duration placing;
  const ReadContext context{&open, &step_dir, options.verify_xxh3, &verify_ns,
                            options.progress};
  if (options.progress != nullptr) {
    int64_t reading = 0;
    for (const RestoreWave& wave : plan.waves) {
      for (const RestoreRead& read : wave.reads) {
        reading += m.arrays[read.array]->extents[read.extent].length_bytes;
      }
    }
    options.progress->total.fetch_add(reading);
  }
  ReaderCrew crew(context, reads.buffers);
  WaveAcquirer acquirer(
      plan, pool, crew, options.prefault ? PrefaultThreads() : 0,
      [&](const RestoreWave& wave, std::vector<Lease> leases) {
        return StageWave(m, plan, options, wave, std::move(leases));
      });
  std::vector<Future<>> copies;
  absl::Status status;
  for (size_t w = 0; w < plan.waves.size(); ++w) {
    absl::StatusOr<StagedWave*> next = acquirer.Next(w);
    if (!next.ok()) {
      status = next.status();
      break;
    }
    StagedWave& staged = **next;
    status = crew.Wait(staged.crew_wave);
    if (!status.ok()) break;
    staged.prefaulter.reset();
    ++stats.waves;
    stats.extents_read += static_cast<int64_t>(staged.reads->tasks());
    const absl::Time place = absl::Now();
    status = PlaceWave(m, plan, plan.waves[w], staged, receiver, stats, copies);
    placing += absl::Now() - place;
    if (!status.ok()) break;
  }
  acquirer.Stop();
  // 3. Every copy must be over before the destinations or leases are touched
  // again, also after an error.
  const absl::Time waves_done = absl::Now();
  absl::Status copied = WhenAll(copies).Wait();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(copied);
  stats.bytes_read = crew.bytes_read();
  const absl::Time end = absl::Now();
  stats.elapsed = end - start;
  stats.phases = RestorePhases(
      {planned - start, end - planned, placing + (end - waves_done)},
      absl::Nanoseconds(verify_ns.load()) / readers, stats);
  return stats;
}

HostBuffer::HostBuffer(int64_t bytes) : size_(bytes) {
  if (bytes <= 0) return;
  constexpr int64_t kPage = 4096;
  const bool huge = bytes >= kHugePageBytes && AdviseHugePages();
  mapped_ = AlignUp(bytes, kPage) + (huge ? kHugePageBytes : 0);
  mapping_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw std::bad_alloc();
  }
  data_ = static_cast<uint8_t*>(mapping_);
  if (huge) {
    data_ = reinterpret_cast<uint8_t*>(
        AlignUp(static_cast<int64_t>(reinterpret_cast<uintptr_t>(data_)),
                kHugePageBytes));
    AdviseHugePagesFor(data_, bytes);
  }
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_(std::exchange(other.mapped_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) munmap(mapping_, mapped_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_ = std::exchange(other.mapped_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

HostBuffer::~HostBuffer() {
  if (mapping_ != nullptr) munmap(mapping_, mapped_);
}

HostArrays WholeArraysInHost(absl::Span<const ArraySpec> specs) {
  HostArrays out;
  out.bytes.reserve(specs.size());
  for (const ArraySpec& spec : specs) {
    const Box whole = Box::FromShape(spec.shape);
    out.bytes.emplace_back(whole.num_elements() * ItemSize(spec.dtype));
    out.targets.push_back({spec.name,
                           spec.dtype,
                           spec.shape,
                           {{whole, nullptr, out.bytes.back().data()}}});
  }
  return out;
}

}  // namespace hoist
