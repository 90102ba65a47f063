// The save and commit protocol of one step. Each process, in order:
//
//   0. Dispatch the first wave of this process's copies (TransferEngine):
//      nothing in storage stands between a save and its copies (a save in
//      dispatched mode returns here when the pool holds it); while they
//      run, steps 1 and 2, and the extents they stage wait for the writer.
//      The save is reported staged once the last copy is delivered,
//      whether or not steps 1 and 2 are done.
//   1. Rank 0 refuses the step if ROOT/step_N is committed and overwrite is
//      off (kAlreadyExists, before any byte is written).
//   2. Rank 0 begins the step's directory through the storage's commit
//      (Storage::BeginDir): on POSIX it creates ROOT/.step_N.tmp-<nonce>/
//      and its data/; an object store writes in place, into ROOT/step_N/
//      (what an uncommitted save left there removed first). The directory,
//      or the error of step 1 or 2, is broadcast ("tmp_dir") so every rank
//      writes into the same one or fails with rank 0's error (the staged
//      extents are then dropped).
//   3. Stage the rest of this process's slices while the ExtentWriter
//      writes them into this process's data files, hashing each: at their
//      planned offsets, or, into a file written from start to end (an
//      object), one after the other in the order they are staged, each
//      where it lands; then sync and close each data file (an object's
//      upload completes).
//   4. Gather "written" at rank 0 (the barrier): each rank's outcome, the
//      fingerprint of its plan, and each of its extents' hash and offset.
//      Any rank's failure, or a plan that differs from rank 0's, aborts the
//      step (step 6 says so to every rank, naming that rank). Only rank 0
//      receives more than its own: no other rank's cost grows with the job.
//   5. Rank 0 commits (Storage::CommitDir), writing MANIFEST.json last. On
//      POSIX: to MANIFEST.json.tmp, fsync, rename, fsync data/ and the step
//      directory, so the manifest and every data file's name are durable
//      before the step becomes visible; then the directory is renamed to
//      ROOT/step_N and ROOT fsynced: from the rename's durability on, the
//      step exists. (Overwrite: the old step is first renamed aside to
//      .step_N.tmp-<nonce>.old, then removed after the new one is durable;
//      a crash between the two renames leaves the new step complete in its
//      .tmp directory and the old one aside, and the CheckpointRoot's
//      recovery commits the new one.) On an object store the manifest
//      object's put is the commit: every data object of every process was
//      complete at step 4's barrier.
//   6. Rank 0 broadcasts how steps 4 and 5 went ("committed"): every rank
//      returns success only once the step is durable, or the error that
//      stopped it. Each rank other than 0 keeps its own extents of the
//      manifest, its next save's delta base.
// A rank that never arrives at an operation fails it on every other rank
// after the Coordinator's timeout (naming the rank), so no step commits.
//
// A step directory without a valid MANIFEST.json is never a checkpoint, so
// a crash at any point before step 5's commit leaves the previous steps as
// they were and the new one absent; on error the directory begun in step 2
// is removed here, or by the CheckpointRoot's recovery if the process died
// (which also commits a POSIX .tmp directory whose manifest was already in
// place).
#include "hoist/checkpoint/save/save.h"

#include <cstring>
#include <functional>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/xxh3.h"
#include "hoist/checkpoint/save/delta.h"
#include "hoist/checkpoint/save/extent_writer.h"
#include "hoist/checkpoint/save/written.h"
#include "hoist/coord/status_wire.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/format/references_file.h"
#include "hoist/mutex.h"

namespace hoist {
namespace {

// Where an overwrite moves the committed step `step` while the new one
// takes its place (CheckpointRoot's recovery brings it back after a crash).
std::string AsideDir(const std::string& root, int64_t step) {
  return JoinPath(root, absl::StrCat(TmpStepDirName(step), kAsideSuffix));
}

// Step 5, on rank 0: the manifest, written last by the storage's commit.
absl::Status Commit(Storage& storage, const SaveRequest& request,
                    const std::string& tmp, const Manifest& manifest,
                    const std::function<void(const char*)>& traced,
                    int64_t& manifest_bytes) {
  ASSIGN_OR_RETURN(const std::string text,
                   EncodeManifest(manifest, request.manifest_encoding));
  manifest_bytes = static_cast<int64_t>(text.size());
  // What the step reads of other steps, for retention (references_file.h):
  // in the step before its commit, as its data is.
  if (!request.part) {
    RETURN_IF_ERROR(WriteReferencesFile(storage, tmp, request.step,
                                        FilesReferenced(manifest)));
  }
  RETURN_IF_ERROR(CommitStep(storage, request.root, request.step, tmp, text,
                             request.overwrite));
  traced("commit (manifest, then publish)");
  return absl::OkStatus();
}

// What steps 1 and 2 decide for every rank: the directory to write into,
// and the base step whose bytes may be referenced (-1: none).
struct Decided {
  std::string dir;
  int64_t base = -1;
  absl::Status base_error;  // this rank could not read the base's manifest
};

// Rank 0's base for a save of `request`: the newest committed step other
// than this one, when deltas are on and its manifest reads (a save never
// fails for a base it cannot use: it writes every byte). `manifest`
// receives the base's.
int64_t ChooseBase(Storage& storage, const SaveRequest& request,
                   std::shared_ptr<const IndexedManifest>& manifest) {
  if (!request.deltas || request.part) return -1;
  absl::StatusOr<std::optional<int64_t>> newest =
      NewestCommittedStep(storage, request.root, request.step);
  if (!newest.ok() || !newest->has_value()) return -1;
  const int64_t base = **newest;
  if (request.base_hint == nullptr || request.base_hint->step() != base) {
    absl::StatusOr<Manifest> read =
        ReadManifestFile(storage, JoinPath(request.root, StepDirName(base)));
    if (!read.ok()) return -1;
    manifest = std::make_shared<const IndexedManifest>(*std::move(read));
  } else {
    manifest = request.base_hint;
  }
  return base;
}

// Refuses to overwrite a step whose bytes kept steps reference (they would
// read the new step's bytes under the old names).
absl::Status CheckNotReferenced(Storage& storage, const SaveRequest& request) {
  ASSIGN_OR_RETURN(std::vector<int64_t> referencing,
                   StepsReferencing(storage, request.root, request.step));
  if (referencing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: step %d cannot be overwritten: steps %s reference its bytes "
      "(delete them first)",
      request.root, request.step, absl::StrJoin(referencing, ", ")));
}

// A save whose frozen arrays were not staged references them in the base
// its caller expected: kAborted when the newest step is another.
absl::Status CheckFrozenBase(const SaveRequest& request, int64_t base) {
  if (!request.frozen_skipped || base == request.frozen_base) {
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrFormat(
      "step %d: its frozen arrays were left to step %d, but the newest "
      "committed step is %d: save again",
      request.step, request.frozen_base, base));
}

// Steps 1 and 2, decided by rank 0 for everyone: the directory to write
// into (made) and the base, or why there is none (the same error on every
// rank). `base` receives the base's manifest, on every rank.
absl::StatusOr<Decided> DecideTmpDir(
    Storage& storage, Coordinator& coordinator, const SaveRequest& request,
    std::shared_ptr<const IndexedManifest>& base) {
  Decided decided;  // rank 0's, once begun
  absl::Status refused;
  if (coordinator.rank() == 0) {
    const std::string final_dir =
        JoinPath(request.root, StepDirName(request.step));
    absl::StatusOr<bool> exists =
        storage.HasMarker(final_dir, std::string(kManifestFileName));
    refused = exists.status();
    if (refused.ok() && *exists && !request.overwrite) {
      refused = absl::AlreadyExistsError(absl::StrFormat(
          "%s: step %d is already committed (ask for overwrite to replace it)",
          final_dir, request.step));
    }
    if (refused.ok() && *exists) refused = CheckNotReferenced(storage, request);
    if (refused.ok()) {
      decided.base = ChooseBase(storage, request, base);
      refused = CheckFrozenBase(request, decided.base);
    }
    if (refused.ok()) {
      const std::string subdirs[] = {kDataDirName};
      absl::StatusOr<std::string> begun = storage.BeginDir(
          final_dir, JoinPath(request.root, TmpStepDirName(request.step)),
          subdirs, std::string(kManifestFileName), request.overwrite);
      refused = begun.status();
      if (begun.ok()) decided.dir = *std::move(begun);
    }
  }
  absl::StatusOr<std::string> sent = coordinator.Broadcast(
      "tmp_dir",
      refused.ok() ? absl::StrCat(decided.base, "|", decided.dir)
                   : absl::StrCat("!", EncodeStatus(refused)),
      0);
  if (!refused.ok()) return refused;
  if (!sent.ok()) {
    if (coordinator.rank() == 0) storage.RemoveAll(decided.dir).IgnoreError();
    return sent.status();
  }
  const size_t bar = sent->find('|');
  if (sent->empty() || absl::StartsWith(*sent, "!") ||
      bar == std::string::npos) {
    return DecodeStatus(
        absl::StartsWith(*sent, "!") ? sent->substr(1) : "13:no directory", 0);
  }
  if (coordinator.rank() == 0) return decided;
  if (!absl::SimpleAtoi(sent->substr(0, bar), &decided.base)) {
    return absl::InternalError("malformed base step from rank 0");
  }
  decided.dir = sent->substr(bar + 1);
  decided.base_error = CheckFrozenBase(request, decided.base);
  if (!decided.base_error.ok()) return decided;
  if (decided.base >= 0) {
    if (request.base_hint != nullptr &&
        request.base_hint->step() == decided.base) {
      base = request.base_hint;
    } else {
      // Rank 0 read it: a rank that cannot fails the step at the
      // barrier (its filesystem is not rank 0's).
      absl::StatusOr<Manifest> read = ReadManifestFile(
          storage, JoinPath(request.root, StepDirName(decided.base)));
      if (!read.ok()) {
        decided.base_error = read.status();
        return decided;
      }
      base = std::make_shared<const IndexedManifest>(*std::move(read));
    }
  }
  return decided;
}

// The frozen slices of this process that were not staged
// (SaveRequest::frozen_skipped): referenced in the base, counted as saved.
// kAborted when the base lacks one (it cannot, unless the root changed
// under the manager).
absl::Status ReferenceSkipped(const SaveRequest& request, const DeltaBase* base,
                              int process, WrittenExtents& written,
                              SaveResult& result) {
  if (!request.frozen_skipped) return absl::OkStatus();
  const SavePlan& plan = *request.plan;
  for (int s : plan.SlicesOfProcess(process)) {
    if (!(*request.frozen)[s]) continue;
    if (base == nullptr || !base->extents[s]) {
      return absl::AbortedError(absl::StrFormat(
          "step %d: frozen array '%s' was not copied, but the base step "
          "lacks its box %s: save again",
          request.step, plan.arrays[plan.slices[s].array].name,
          plan.slices[s].box.ToString()));
    }
    written.referenced[s] = 1;
    written.hashes[s] = base->extents[s]->hash;
    written.offsets[s] = base->extents[s]->offset_bytes;
    result.bytes += plan.slices[s].length_bytes;
  }
  return absl::OkStatus();
}

// Steps 1 to 3 on this process: what the rest of the save needs of them.
struct Persisted {
  absl::Status local;  // this process's outcome: staging's, the writer's
  WrittenExtents written;
  std::unique_ptr<DeltaBase> delta_base;  // null without a base
};

// 3, with 1 and 2 inside it: the first wave's copies are dispatched before
// anything touches the disk (a save in dispatched mode returns sooner),
// then the directory is decided and the writer opened while they run; the
// extents staged meanwhile wait in the sink. An error deciding the
// directory (the same on every rank) is returned; this process's own
// (staging's, the writer's) is Persisted::local, for every rank to learn.
absl::StatusOr<Persisted> StageAndPersist(
    Storage& storage, Coordinator& coordinator, const SaveRequest& request,
    TransferEngine& engine, absl::Span<Device* const> devices,
    const ShardSources& sources, absl::Time start, std::string& tmp,
    BegunSave* begun, SaveResult& result) {
  const SavePlan& plan = *request.plan;
  const int process = coordinator.rank();
  absl::Status decided;  // steps 1 and 2
  Persisted out{absl::OkStatus(), WrittenExtents(plan), nullptr};
  DeferredSink own_sink;  // unless the begun save brought its own
  DeferredSink& sink = begun != nullptr ? begun->sink : own_sink;
  sink.CountInto(request.progress);
  // The base step's manifest and what this save may reference of it.
  std::shared_ptr<const IndexedManifest> base_manifest;
  std::unique_ptr<ExtentWriter> writer;  // destroyed before `sink`
  bool prepared = false;
  const auto prepare = [&]() -> absl::Status {
    prepared = true;
    absl::StatusOr<Decided> dir =
        DecideTmpDir(storage, coordinator, request, base_manifest);
    if (!dir.ok()) {
      decided = dir.status();
      sink.Attach(nullptr);
      return decided;
    }
    tmp = std::move(dir->dir);
    if (!dir->base_error.ok()) {
      sink.Attach(nullptr);
      return dir->base_error;
    }
    if (base_manifest != nullptr) {
      // Rank 0 builds the manifest from every rank's slices; the others
      // need only their own.
      out.delta_base = std::make_unique<DeltaBase>(MakeDeltaBase(
          plan, base_manifest, request.frozen.get(),
          process == 0 ? std::nullopt : std::optional<int>(process)));
    }
    absl::StatusOr<std::unique_ptr<ExtentWriter>> opened = ExtentWriter::Open(
        storage, tmp, plan, process, 2, request.tracer, request.progress,
        request.writer_thread_setup, out.delta_base.get());
    if (!opened.ok()) {
      sink.Attach(nullptr);
      return opened.status();
    }
    writer = *std::move(opened);
    sink.Attach(writer.get());
    return absl::OkStatus();
  };
  bool dispatched = false;
  const auto on_dispatched = [&] {
    dispatched = true;
    if (request.on_dispatched) request.on_dispatched(absl::OkStatus());
  };
  // The run begun ahead, else one begun here (from the kept layout when
  // there is one); Stage is Begin then Finish.
  absl::StatusOr<std::unique_ptr<StagingRun>> run;
  if (begun != nullptr && begun->run != nullptr) {
    run = std::move(begun->run);
  } else if (request.layout != nullptr) {
    run = engine.Begin(plan, request.layout, devices, sources, sink,
                       request.stable, request.producer);
  } else {
    run = engine.Begin(plan, process, devices, sources, sink);
  }
  // Steps 1 and 2 and the writer are prepared beside the first wave's
  // copies (a share of several waves needs the writer to free the pool for
  // the next), and the copies are reported staged as soon as the last is
  // delivered, on its thread: the caller, blocked until then, does not
  // wait for the directory, the delta base (one lookup per array) or the
  // handing over of the extents held meanwhile, and the writes still
  // overlap the copies.
  bool staged_reported = false;
  const auto report_staged = [&](const absl::Status& status,
                                 const TransferStats& stats) {
    if (request.progress != nullptr) {
      request.progress->stalled_bytes.store(stats.stalled_bytes,
                                            std::memory_order_relaxed);
    }
    if (!dispatched && request.on_dispatched) request.on_dispatched(status);
    if (request.on_staged) request.on_staged(status);
    result.staged = absl::Now() - start;
    staged_reported = true;
    if (request.progress != nullptr) {
      request.progress->phase.store(storage.capabilities().local ? "write"
                                                                 : "upload");
    }
  };
  absl::StatusOr<TransferStats> staged =
      run.ok() ? engine.Finish(*std::move(run), on_dispatched, prepare,
                               report_staged)
               : absl::StatusOr<TransferStats>(run.status());
  // Every rank takes part in step 2's broadcast, whether or not staging
  // got to its first wave.
  if (!prepared) {
    const absl::Status prepared_late = prepare();
    if (staged.ok() && !prepared_late.ok()) staged = prepared_late;
  }
  if (!staged_reported) {  // stopped early
    report_staged(staged.status(), staged.ok() ? *staged : TransferStats{});
  }
  if (!decided.ok()) return decided;  // the same on every rank
  out.local = staged.status();
  if (writer == nullptr) return out;
  absl::StatusOr<WrittenExtents> written = writer->Finish();
  if (out.local.ok() && !written.ok()) out.local = written.status();
  if (!out.local.ok()) return out;
  result.transfer = *staged;
  result.bytes = staged->bytes;
  out.written = *std::move(written);
  out.local = ReferenceSkipped(request, out.delta_base.get(), process,
                               out.written, result);
  for (int s : plan.SlicesOfProcess(process)) {
    if (out.written.referenced[s]) {
      result.referenced_bytes += plan.slices[s].length_bytes;
    }
  }
  return out;
}

// kDeadlineExceeded when the save is past its deadline (a preemption
// save's) at `moment`, on rank `rank`.
absl::Status WithinDeadline(const SaveRequest& request, int rank,
                            const char* moment) {
  const absl::Time now = absl::Now();
  if (now <= request.deadline) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrFormat(
      "step %d: the preemption save missed its deadline on rank %d: %s %s "
      "after it (not committed; the steps before it are as they were)",
      request.step, rank, moment,
      absl::FormatDuration(
          absl::Trunc(now - request.deadline, absl::Milliseconds(1)))));
}

// This process's phases of a save, each ending where the next begins
// (SaveResult::phases); each phase begun is named in the save's progress.
class PhaseClock {
 public:
  PhaseClock(const SaveRequest& request, int rank)
      : phases_(request.phases_before),
        progress_(request.progress),
        rank_(rank) {}

  // A phase from `begin` to `end`; `next` (a literal) begins at `end`.
  void End(const char* phase, int64_t bytes, absl::Time begin, absl::Time end,
           const char* next = nullptr) {
    phases_.push_back(
        {phase, std::max(end - begin, absl::ZeroDuration()), bytes, rank_});
    last_ = end;
    if (next != nullptr && progress_ != nullptr) progress_->phase.store(next);
  }
  // The phase since the last one ended, ending now.
  void Next(const char* phase, int64_t bytes, const char* next) {
    End(phase, bytes, last_, absl::Now(), next);
  }

  absl::Span<const PhaseStat> phases() const { return phases_; }
  std::vector<PhaseStat> Take() { return std::move(phases_); }

 private:
  std::vector<PhaseStat> phases_;
  SaveProgress* const progress_;
  const int rank_;
  absl::Time last_;
};

// 5 on rank 0, once every rank succeeded: the manifest built from what it
// gathered (into `built`), committed within the save's deadline.
absl::Status CommitGathered(Storage& storage, const SaveRequest& request,
                            const std::string& tmp, const Gathered& gathered,
                            const DeltaBase* delta_base,
                            const std::function<void(const char*)>& traced,
                            Manifest& built, int64_t& manifest_bytes) {
  const SavePlan& plan = *request.plan;
  // Every rank referenced the same base's extents (it read the manifest
  // of the step rank 0 chose): one this rank's base lacks cannot be.
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    if (gathered.all.referenced[s] &&
        (delta_base == nullptr || !delta_base->extents[s])) {
      return absl::InternalError(absl::StrFormat(
          "step %d aborted: a process referenced a box of '%s' that the base "
          "step lacks",
          request.step, plan.arrays[plan.slices[s].array].name));
    }
  }
  ASSIGN_OR_RETURN(std::string metadata,
                   MetadataWithPerRank(request, gathered.per_rank));
  built = BuildManifest(request, gathered.all, delta_base,
                        {.spread_prefixes = SpreadsDataFiles(storage)});
  built.metadata_json = std::move(metadata);
  RETURN_IF_ERROR(WithinDeadline(request, 0, "it was to commit"));
  return Commit(storage, request, tmp, built, traced, manifest_bytes);
}

// Steps 1-6 for this process; `tmp` is set once steps 1 and 2 made it.
absl::StatusOr<SaveResult> SaveSteps(Storage& storage, Coordinator& coordinator,
                                     const SaveRequest& request,
                                     TransferEngine& engine,
                                     absl::Span<Device* const> devices,
                                     const ShardSources& sources,
                                     absl::Time start, std::string& tmp,
                                     BegunSave* begun) {
  SaveResult result;
  ASSIGN_OR_RETURN(
      Persisted persisted,
      StageAndPersist(storage, coordinator, request, engine, devices, sources,
                      start, tmp, begun, result));
  const int rank = coordinator.rank();
  PhaseClock clock(request, rank);
  const absl::Time staged_at = start + result.staged;
  clock.End("staging", result.bytes,
            request.staging_began == absl::InfinitePast()
                ? start
                : std::min(request.staging_began, staged_at),
            staged_at);
  clock.End(storage.capabilities().local ? "write" : "upload",
            result.bytes - result.referenced_bytes, staged_at, absl::Now(),
            "hash");
  // 4. Everyone learns whether everyone succeeded, and the hashes.
  // Commit phases go on the "commit" track.
  absl::Time phase = absl::Now();
  const auto traced = [&](const char* name) {
    const absl::Time now = absl::Now();
    if (request.tracer != nullptr) {
      request.tracer->Span("commit", name, phase, now);
    }
    phase = now;
  };
  if (request.tracer != nullptr) {
    request.tracer->Span("commit", "stage + persist", start, phase);
  }
  if (persisted.local.ok()) {
    persisted.local = WithinDeadline(request, rank, "its writes ended");
  }
  ASSIGN_OR_RETURN(Gathered gathered,
                   GatherOutcomes(coordinator, request, persisted.local,
                                  persisted.written, clock.phases()));
  clock.Next("hash", gathered.received_bytes, "commit");
  const DeltaBase* delta_base = persisted.delta_base.get();
  // 5: rank 0 commits, and tells everyone how it went (step 6). The other
  // ranks keep their own extents (their next save's delta base).
  Verdict verdict = std::move(gathered.verdict);
  int64_t manifest_bytes = 0;
  Manifest built;
  if (rank == 0 && verdict.status.ok()) {
    traced("barrier + hash gather");
    verdict.status = CommitGathered(storage, request, tmp, gathered, delta_base,
                                    traced, built, manifest_bytes);
    if (!verdict.status.ok()) verdict.failed_rank = 0;
  } else if (rank != 0 && persisted.local.ok()) {
    built = BuildManifest(
        request, persisted.written, delta_base,
        {.process = rank, .spread_prefixes = SpreadsDataFiles(storage)});
  }
  ASSIGN_OR_RETURN(result.slowest, ShareVerdict(coordinator, request,
                                                persisted.local, verdict));
  traced("committed");
  clock.Next("commit", manifest_bytes, "");
  result.phases = clock.Take();
  result.path = JoinPath(request.root, StepDirName(request.step));
  // Indexed here, on the saver's thread, for the next save's delta base.
  result.manifest = std::make_shared<const IndexedManifest>(std::move(built));
  result.committed = absl::Now() - start;
  return result;
}

}  // namespace

static absl::StatusOr<SaveResult> SaveCheckpointImpl(
    Storage& storage, Coordinator& coordinator, const SaveRequest& request,
    TransferEngine& engine, absl::Span<Device* const> devices,
    const ShardSources& sources, BegunSave* begun) {
  const absl::Time start = absl::Now();
  if (request.plan == nullptr || request.step < 0 ||
      request.arrays.size() != request.plan->arrays.size()) {
    return absl::InvalidArgumentError(
        "save request needs a step >= 0 and the plan of its arrays");
  }
  std::string tmp;  // once steps 1 and 2 made it
  absl::StatusOr<SaveResult> result =
      SaveSteps(storage, coordinator, request, engine, devices, sources, start,
                tmp, begun);
  if (!result.ok() && !tmp.empty() && coordinator.rank() == 0) {
    storage.RemoveAll(tmp).IgnoreError();  // best effort; GC finishes it
  }
  return result;
}

absl::Status CommitStep(Storage& storage, const std::string& root, int64_t step,
                        const std::string& tmp, std::string_view manifest_json,
                        bool overwrite) {
  return storage.CommitDir(tmp, JoinPath(root, StepDirName(step)),
                           std::string(kManifestFileName), manifest_json,
                           overwrite ? AsideDir(root, step) : std::string());
}

BegunSave::~BegunSave() {
  // A run nobody finished (the save stopped before staging): its copies
  // use the sink, so they end first; their extents are dropped.
  if (run != nullptr) {
    sink.Attach(nullptr);
    engine->Finish(std::move(run)).IgnoreError();
  }
}

bool BegunSave::all_dispatched() const {
  return run != nullptr && AllDispatched(*run);
}

absl::StatusOr<std::unique_ptr<BegunSave>> BeginSave(
    const SavePlan& plan, std::shared_ptr<const StagingLayout> layout,
    TransferEngine& engine, absl::Span<Device* const> devices,
    const ShardSources& sources, std::shared_ptr<StableSources> stable,
    std::shared_ptr<ShardProducer> producer) {
  auto begun = std::make_unique<BegunSave>();
  begun->engine = &engine;
  ASSIGN_OR_RETURN(
      begun->run,
      engine.Begin(plan, std::move(layout), devices, sources, begun->sink,
                   std::move(stable), std::move(producer)));
  return begun;
}

absl::StatusOr<SaveResult> SaveCheckpoint(
    Storage& storage, Coordinator& coordinator, const SaveRequest& request,
    TransferEngine& engine, absl::Span<Device* const> devices,
    const ShardSources& sources, std::unique_ptr<BegunSave> begun) {
  // Each callback runs exactly once: where staging reports it, or here with
  // the error that stopped the save before staging did.
  struct Once {
    std::function<void(const absl::Status&)> fn;
    bool done = false;
    void operator()(const absl::Status& status) {
      if (done || !fn) return;
      done = true;
      fn(status);
    }
  };
  auto dispatched = std::make_shared<Once>(Once{request.on_dispatched});
  auto staged = std::make_shared<Once>(Once{request.on_staged});
  SaveRequest wrapped = request;
  wrapped.on_dispatched = [dispatched](const absl::Status& s) {
    (*dispatched)(s);
  };
  wrapped.on_staged = [staged](const absl::Status& s) { (*staged)(s); };
  absl::StatusOr<SaveResult> result = SaveCheckpointImpl(
      storage, coordinator, wrapped, engine, devices, sources, begun.get());
  const absl::Status status =
      result.ok() ? absl::InternalError("staging never reported")
                  : result.status();
  (*dispatched)(status);
  (*staged)(status);
  return result;
}

}  // namespace hoist
