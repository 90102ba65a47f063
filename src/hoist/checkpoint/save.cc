// The save and commit protocol of one step. Each process, in order:
//
//   1. Refuse early: if ROOT/step_N exists and overwrite is off, fail with
//      kAlreadyExists before any byte moves.
//   2. Rank 0 creates ROOT/.step_N.tmp-<nonce>/ and its data/; the name is
//      broadcast so every rank writes into the same directory.
//   3. Stage this process's slices (TransferEngine) while the ExtentWriter
//      writes them into this process's data files at their planned offsets,
//      hashing each; then fsync and close each data file.
//   4. Barrier "written"; all-gather the extent hashes. Any rank's failure
//      is broadcast, and every rank aborts the step.
//   5. Rank 0 writes MANIFEST.json: to MANIFEST.json.tmp, fsync, rename,
//      then fsync data/ and the step directory, so the manifest and every
//      data file's name are durable before the step becomes visible.
//   6. Rank 0 renames the directory to ROOT/step_N and fsyncs ROOT: from the
//      rename's durability on, the step exists. (Overwrite: the old step is
//      first renamed aside to .step_N.old-<nonce>, then removed after the
//      new one is durable; a crash between the two renames leaves the new
//      step complete in its .tmp directory and the old one aside, and the
//      CheckpointManager's recovery commits the new one.)
//   7. Barrier "committed".
//
// A directory without a valid MANIFEST.json is never a checkpoint, so a crash
// at any point before step 5's manifest rename leaves the previous steps as
// they were and the new one absent; on error the .tmp directory is removed
// here, or by the CheckpointManager's recovery if the process died (which
// also commits a .tmp directory whose manifest was already in place).
#include "hoist/checkpoint/save.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/extent_writer.h"
#include "hoist/checkpoint/layout.h"

namespace hoist {
namespace {

constexpr int64_t kMaxManifestBytes = int64_t{1} << 30;

// (slice, hash) pairs of this process, as bytes for the all-gather.
std::string EncodeHashes(const SavePlan& plan, int process,
                         const std::vector<uint64_t>& hashes) {
  std::string out;
  for (int s : plan.SlicesOfProcess(process)) {
    const int32_t slice = s;
    out.append(reinterpret_cast<const char*>(&slice), sizeof slice);
    out.append(reinterpret_cast<const char*>(&hashes[s]), sizeof hashes[s]);
  }
  return out;
}

absl::Status DecodeHashes(const std::string& bytes,
                          std::vector<uint64_t>& hashes) {
  constexpr size_t kRecord = sizeof(int32_t) + sizeof(uint64_t);
  if (bytes.size() % kRecord != 0) {
    return absl::InternalError("malformed extent hashes from a peer");
  }
  for (size_t at = 0; at < bytes.size(); at += kRecord) {
    int32_t slice;
    uint64_t hash;
    std::memcpy(&slice, bytes.data() + at, sizeof slice);
    std::memcpy(&hash, bytes.data() + at + sizeof slice, sizeof hash);
    if (slice < 0 || static_cast<size_t>(slice) >= hashes.size()) {
      return absl::InternalError("extent hash for an unknown slice");
    }
    hashes[slice] = hash;
  }
  return absl::OkStatus();
}

Manifest BuildManifest(const SaveRequest& request,
                       const std::vector<uint64_t>& hashes) {
  const SavePlan& plan = *request.plan;
  Manifest manifest;
  manifest.step = request.step;
  manifest.metadata_json = request.metadata_json;
  for (size_t a = 0; a < plan.arrays.size(); ++a) {
    const PlannedArray& array = plan.arrays[a];
    manifest.arrays.push_back({array.name,
                               array.dtype,
                               array.shape,
                               request.arrays[a].sharding.ToString(),
                               {}});
  }
  for (size_t s = 0; s < plan.slices.size(); ++s) {
    const PlannedSlice& slice = plan.slices[s];
    manifest.arrays[slice.array].extents.push_back(
        {slice.box, plan.files[slice.file].path, slice.offset_bytes,
         slice.length_bytes, hashes[s]});
  }
  return manifest;
}

absl::Status WriteManifest(Storage& storage, const std::string& dir,
                           const Manifest& manifest) {
  const std::string text = EncodeManifest(manifest);
  const std::string tmp =
      JoinPath(dir, std::string(kManifestFileName) + ".tmp");
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   storage.OpenWritable(tmp));
  RETURN_IF_ERROR(file->WriteAt(
      0, absl::Span<const uint8_t>(
             reinterpret_cast<const uint8_t*>(text.data()), text.size())));
  RETURN_IF_ERROR(file->Sync());
  RETURN_IF_ERROR(file->Close());
  RETURN_IF_ERROR(
      storage.Rename(tmp, JoinPath(dir, std::string(kManifestFileName))));
  RETURN_IF_ERROR(storage.SyncDir(JoinPath(dir, "data")));
  return storage.SyncDir(dir);
}

// Steps 3-6 for this process; `tmp` exists.
absl::StatusOr<SaveResult> SaveInto(Storage& storage, Coordinator& coordinator,
                                    const SaveRequest& request,
                                    const std::string& tmp,
                                    TransferEngine& engine,
                                    absl::Span<Device* const> devices,
                                    const ShardSources& sources,
                                    absl::Time start) {
  const SavePlan& plan = *request.plan;
  const int process = coordinator.rank();
  SaveResult result;
  // 3. Stage and persist.
  absl::Status local;
  std::vector<uint64_t> hashes;
  {
    absl::StatusOr<std::unique_ptr<ExtentWriter>> writer = ExtentWriter::Open(
        storage, tmp, plan, process, 2, request.tracer, request.progress);
    local = writer.status();
    if (local.ok()) {
      bool dispatched = false;
      absl::StatusOr<TransferStats> staged =
          engine.Stage(plan, process, devices, sources, **writer, [&] {
            dispatched = true;
            if (request.on_dispatched) request.on_dispatched(absl::OkStatus());
          });
      if (!dispatched && request.on_dispatched) {
        request.on_dispatched(staged.status());
      }
      if (request.on_staged) request.on_staged(staged.status());
      result.staged = absl::Now() - start;
      absl::StatusOr<std::vector<uint64_t>> written = (*writer)->Finish();
      if (!staged.ok()) {
        local = staged.status();
      } else if (!written.ok()) {
        local = written.status();
      } else {
        result.transfer = *staged;
        result.bytes = staged->bytes;
        hashes = *std::move(written);
      }
    }
  }
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
  RETURN_IF_ERROR(coordinator.Barrier("written"));
  ASSIGN_OR_RETURN(
      std::vector<std::string> statuses,
      coordinator.AllGather("status",
                            local.ok() ? std::string() : local.ToString()));
  for (int r = 0; r < static_cast<int>(statuses.size()); ++r) {
    if (!statuses[r].empty()) {
      if (!local.ok()) return local;
      return absl::AbortedError(absl::StrFormat(
          "step %d aborted: rank %d failed: %s", request.step, r, statuses[r]));
    }
  }
  ASSIGN_OR_RETURN(
      std::vector<std::string> gathered,
      coordinator.AllGather("hashes", EncodeHashes(plan, process, hashes)));
  std::vector<uint64_t> all(plan.slices.size(), 0);
  for (const std::string& bytes : gathered) {
    RETURN_IF_ERROR(DecodeHashes(bytes, all));
  }
  // 5 and 6: rank 0 commits.
  const std::string final_dir =
      JoinPath(request.root, StepDirName(request.step));
  if (coordinator.rank() == 0) {
    traced("barrier + hash all-gather");
    RETURN_IF_ERROR(WriteManifest(storage, tmp, BuildManifest(request, all)));
    traced("manifest (write, fsync, rename, fsync dirs)");
    ASSIGN_OR_RETURN(bool exists, storage.Exists(final_dir));
    std::string aside;
    if (exists) {
      if (!request.overwrite) {
        return absl::AlreadyExistsError(
            absl::StrFormat("%s: step %d was committed while this save ran",
                            final_dir, request.step));
      }
      aside = JoinPath(request.root, TmpStepDirName(request.step) + ".old");
      RETURN_IF_ERROR(storage.Rename(final_dir, aside));
    }
    if (absl::Status renamed = storage.Rename(tmp, final_dir); !renamed.ok()) {
      if (!aside.empty()) storage.Rename(aside, final_dir).IgnoreError();
      return renamed;
    }
    if (absl::Status synced = storage.SyncDir(request.root); !synced.ok()) {
      // The rename may not be durable: take it back, so that what is visible
      // agrees with the error (the old step returns from aside).
      storage.Rename(final_dir, tmp).IgnoreError();
      if (!aside.empty()) storage.Rename(aside, final_dir).IgnoreError();
      return synced;
    }
    if (!aside.empty()) RETURN_IF_ERROR(storage.RemoveAll(aside));
    traced("publish (rename, fsync root)");
  }
  // 7.
  RETURN_IF_ERROR(coordinator.Barrier("committed"));
  traced("barrier committed");
  result.path = final_dir;
  result.committed = absl::Now() - start;
  return result;
}

}  // namespace

absl::StatusOr<Manifest> ReadManifest(Storage& storage,
                                      const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, std::string(kManifestFileName));
  ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                   storage.OpenReadable(path));
  ASSIGN_OR_RETURN(int64_t size, file->Size());
  if (size > kMaxManifestBytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: %d bytes, more than a manifest may have (%d)",
                        path, size, kMaxManifestBytes));
  }
  std::string text(static_cast<size_t>(size), '\0');
  RETURN_IF_ERROR(file->ReadAt(
      0, absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(text.data()),
                             text.size())));
  absl::StatusOr<Manifest> manifest = DecodeManifest(text);
  if (!manifest.ok()) {
    return absl::Status(
        manifest.status().code(),
        absl::StrCat(step_dir, "/", manifest.status().message()));
  }
  return manifest;
}

static absl::StatusOr<SaveResult> SaveCheckpointImpl(
    Storage& storage, Coordinator& coordinator, const SaveRequest& request,
    TransferEngine& engine, absl::Span<Device* const> devices,
    const ShardSources& sources) {
  const absl::Time start = absl::Now();
  if (request.plan == nullptr || request.step < 0 ||
      request.arrays.size() != request.plan->arrays.size()) {
    return absl::InvalidArgumentError(
        "save request needs a step >= 0 and the plan of its arrays");
  }
  // 1.
  const std::string final_dir =
      JoinPath(request.root, StepDirName(request.step));
  ASSIGN_OR_RETURN(bool exists, storage.Exists(final_dir));
  if (exists && !request.overwrite) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "%s: step %d is already committed (ask for overwrite to replace it)",
        final_dir, request.step));
  }
  // 2.
  std::string tmp_name;
  absl::Status created;
  if (coordinator.rank() == 0) {
    tmp_name = TmpStepDirName(request.step);
    created = storage.CreateDir(JoinPath(request.root, tmp_name));
    if (created.ok()) {
      created = storage.CreateDir(JoinPath(request.root, tmp_name + "/data"));
    }
    if (!created.ok()) tmp_name.clear();  // tells the others
  }
  ASSIGN_OR_RETURN(tmp_name, coordinator.Broadcast("tmp_dir", tmp_name, 0));
  if (tmp_name.empty()) {
    if (!created.ok()) return created;
    return absl::AbortedError(absl::StrFormat(
        "step %d aborted: rank 0 could not create its directory",
        request.step));
  }
  const std::string tmp = JoinPath(request.root, tmp_name);
  absl::StatusOr<SaveResult> result = SaveInto(
      storage, coordinator, request, tmp, engine, devices, sources, start);
  if (!result.ok() && coordinator.rank() == 0) {
    storage.RemoveAll(tmp).IgnoreError();  // best effort; GC finishes it
  }
  return result;
}

absl::StatusOr<SaveResult> SaveCheckpoint(Storage& storage,
                                          Coordinator& coordinator,
                                          const SaveRequest& request,
                                          TransferEngine& engine,
                                          absl::Span<Device* const> devices,
                                          const ShardSources& sources) {
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
      storage, coordinator, wrapped, engine, devices, sources);
  const absl::Status status =
      result.ok() ? absl::InternalError("staging never reported")
                  : result.status();
  (*dispatched)(status);
  (*staged)(status);
  return result;
}

}  // namespace hoist
