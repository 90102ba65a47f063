// The local tier: see local_tier.h.
//
// A local save, once every rank's part committed (Replicate):
//   1. the ranks all-gather the extents of their parts (replica_plan.h);
//   2. each evaluates PlanReplication on them: an extent is sent only while
//      fewer than `replicas` processes (hosts, across hosts) hold it, so a
//      data-parallel replica's extents are not sent;
//   3. for each replica offset d, a shift (peer_shift.h): each rank sends
//      rank + d a copy of its part holding only the extents planned for it
//      (one data file, each extent at a multiple of 4 KiB, and a
//      MANIFEST.json naming them) and its whole manifest as PART.json (what
//      the part holds, and its per-rank metadata), even when no extent goes.
//      The receiver writes them into a temporary directory, fsyncs them,
//      checks the manifest and renames the directory to
//      peers/rNNNNN/step_N, replacing an older copy.
// A local restore (Restore):
//   1. the ranks all-gather which steps they hold, of their own and copies;
//      a step is a candidate when every rank's part of it is here or
//      described by a copy (its PART.json);
//   2. for the newest candidate, they all-gather the extents of every part
//      and copy they hold, and the whole manifest of each lost part;
//   3. each evaluates PlanRecovery: for each extent of a lost part, the
//      process that serves it (a data-parallel replica's own part, or a
//      copy), spreading the bytes over them;
//   4. shifts move those extents; the lost rank checks each one's hash,
//      writes its part's manifest pointing at the received files, fsyncs
//      and renames the directory into place: its part is back;
//   5. every rank restores from its part. A part or copy found bad is left
//      out and 2-5 run again; when no source is left, the next candidate.
#include "hoist/checkpoint/local_tier.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "hoist/base/checked_math.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/peer_shift.h"
#include "hoist/checkpoint/replica_plan.h"
#include "hoist/checkpoint/save.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/format/manifest_file.h"
#include "hoist/manifest.h"

namespace hoist {
namespace {

// "<tag> <rank> <step>,<step>,..." lines: what one rank holds.
void AppendSteps(std::string& out, absl::string_view tag, int rank,
                 const std::vector<int64_t>& steps) {
  absl::StrAppendFormat(&out, "%s %d %s\n", tag, rank,
                        absl::StrJoin(steps, ","));
}

// Length-prefixed records ("<size>:<bytes>"), for messages whose fields
// may hold any byte.
void AppendRecord(std::string& out, absl::string_view record) {
  absl::StrAppend(&out, record.size(), ":", record);
}

absl::StatusOr<std::vector<absl::string_view>> SplitRecords(
    absl::string_view text, absl::string_view what) {
  std::vector<absl::string_view> records;
  while (!text.empty()) {
    const size_t colon = text.find(':');
    size_t size = 0;
    if (colon == absl::string_view::npos ||
        !absl::SimpleAtoi(text.substr(0, colon), &size) ||
        size > text.size() - colon - 1) {
      return absl::DataLossError(
          absl::StrFormat("%s: a record is cut short", what));
    }
    records.push_back(text.substr(colon + 1, size));
    text.remove_prefix(colon + 1 + size);
  }
  return records;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return std::string(reinterpret_cast<const char*>(file.bytes().data()),
                     file.bytes().size());
}

// The data file of a copy made by rank `rank` of rank `origin`'s part's
// extents (its own part's: origin == rank).
std::string CopyFileName(int rank, int origin) {
  return rank == origin ? absl::StrFormat("%s/r%05d.bin", kDataDirName, rank)
                        : absl::StrFormat("%s/r%05d_of_r%05d.bin", kDataDirName,
                                          rank, origin);
}

// Offsets of extents of `lengths` bytes laid one after another in a file,
// each at a multiple of kExtentAlignmentBytes.
std::vector<int64_t> PackedOffsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets;
  int64_t end = 0;
  for (int64_t length : lengths) {
    offsets.push_back(AlignUp(end, kExtentAlignmentBytes));
    end = offsets.back() + length;
  }
  return offsets;
}

// A part, or a copy of one, held by this rank and opened to send extents.
struct HeldPart {
  std::string dir;
  Manifest manifest;
  std::vector<PartExtent> extents;         // PartExtents(manifest)
  std::vector<std::pair<int, int>> where;  // (array, extent) of each
  std::unordered_map<std::string, int> by_key;
  std::map<std::string, MappedFile> files;  // mapped on first use
};

absl::StatusOr<std::unique_ptr<HeldPart>> OpenHeldPart(Storage& storage,
                                                       const std::string& dir) {
  auto part = std::make_unique<HeldPart>();
  part->dir = dir;
  ASSIGN_OR_RETURN(part->manifest, ReadManifestFile(storage, dir));
  for (size_t a = 0; a < part->manifest.arrays.size(); ++a) {
    for (size_t e = 0; e < part->manifest.arrays[a].extents.size(); ++e) {
      part->where.push_back({static_cast<int>(a), static_cast<int>(e)});
    }
  }
  part->extents = PartExtents(part->manifest);
  for (size_t i = 0; i < part->extents.size(); ++i) {
    part->by_key.emplace(part->extents[i].key, static_cast<int>(i));
  }
  return part;
}

// The bytes of extent `i` of `part`, in its mapped data file.
absl::StatusOr<absl::Span<const uint8_t>> ExtentBytes(HeldPart& part, int i) {
  const auto [a, e] = part.where[i];
  const ManifestExtent& extent = part.manifest.arrays[a].extents[e];
  const std::string path = JoinPath(part.dir, extent.file);
  if (extent.step) {
    return absl::DataLossError(absl::StrFormat(
        "%s: array '%s' references step %d: a part holds its own bytes",
        part.dir, part.manifest.arrays[a].name, *extent.step));
  }
  auto it = part.files.find(extent.file);
  if (it == part.files.end()) {
    ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
    it = part.files.emplace(extent.file, std::move(file)).first;
  }
  const absl::Span<const uint8_t> bytes = it->second.bytes();
  if (extent.offset_bytes + extent.length_bytes >
      static_cast<int64_t>(bytes.size())) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d bytes, but array '%s' %s ends at %d", path, bytes.size(),
        part.manifest.arrays[a].name, extent.box.ToString(),
        extent.offset_bytes + extent.length_bytes));
  }
  return bytes.subspan(extent.offset_bytes, extent.length_bytes);
}

// A data file `path` of `part`'s extents `indices` (in that order), packed.
absl::StatusOr<OutgoingFile> PackedFile(HeldPart& part, std::string path,
                                        const std::vector<int>& indices) {
  OutgoingFile file{std::move(path), {}};
  int64_t end = 0;
  for (int i : indices) {
    ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes, ExtentBytes(part, i));
    const int64_t at = AlignUp(end, kExtentAlignmentBytes);
    if (at > end) file.pieces.push_back(ZeroPadding(at - end));
    file.pieces.push_back(bytes);
    end = at + static_cast<int64_t>(bytes.size());
  }
  return file;
}

// What a rank sends a holder after a local save: a copy of its part with
// the extents `indices` (ascending) in one data file, and the whole part's
// manifest `part_text`. The strings the files point into live here.
struct PartCopy {
  std::string manifest;
  std::vector<OutgoingFile> files;
  int64_t data_bytes = 0;
};

absl::StatusOr<std::unique_ptr<PartCopy>> CopyOfPart(
    HeldPart& part, const std::string& part_text,
    const std::vector<int>& indices, int rank) {
  auto copy = std::make_unique<PartCopy>();
  const std::string path = CopyFileName(rank, rank);
  ASSIGN_OR_RETURN(OutgoingFile data, PackedFile(part, path, indices));
  Manifest kept;
  kept.step = part.manifest.step;
  kept.metadata_json = part.manifest.metadata_json;
  kept.part = part.manifest.part;
  std::vector<int64_t> lengths;
  for (int i : indices) lengths.push_back(part.extents[i].length_bytes);
  const std::vector<int64_t> offsets = PackedOffsets(lengths);
  int last_array = -1;
  for (size_t k = 0; k < indices.size(); ++k) {
    const auto [a, e] = part.where[indices[k]];
    const ManifestArray& array = part.manifest.arrays[a];
    if (a != last_array) {
      kept.arrays.push_back(
          {array.name, array.dtype, array.shape, array.sharding, {}});
      last_array = a;
    }
    ManifestExtent extent = array.extents[e];
    extent.file = path;
    extent.offset_bytes = offsets[k];
    copy->data_bytes += extent.length_bytes;
    kept.arrays.back().extents.push_back(std::move(extent));
  }
  ASSIGN_OR_RETURN(copy->manifest, EncodeManifest(kept));
  const auto span = [](const std::string& text) {
    return absl::Span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(text.data()), text.size());
  };
  copy->files.push_back(std::move(data));
  copy->files.push_back({kPartManifestFileName, {span(part_text)}});
  copy->files.push_back(
      {std::string(kManifestFileName), {span(copy->manifest)}});
  return copy;
}

absl::Status WriteSynced(Storage& storage, const std::string& path,
                         absl::string_view text) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   storage.OpenWritable(path));
  absl::Status written = file->WriteAt(
      0, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  if (written.ok()) written = file->Sync();
  if (absl::Status closed = file->Close(); written.ok()) written = closed;
  return written;
}

// Syncs the temporary step directory `tmp` and renames it to step `step` of
// `root`, replacing it; removes `tmp` on an error.
absl::Status Publish(Storage& storage, const std::string& root, int64_t step,
                     const std::string& tmp) {
  absl::Status status = storage.SyncDir(JoinPath(tmp, kDataDirName));
  if (status.ok()) status = storage.SyncDir(tmp);
  if (status.ok()) status = PublishStep(storage, root, step, tmp, true);
  if (!status.ok()) storage.RemoveAll(tmp).IgnoreError();
  return status;
}

// Creates the temporary directory of `step` under `root`, with data/.
absl::StatusOr<std::string> MakeTmpStep(Storage& storage,
                                        const std::string& root, int64_t step) {
  const std::string tmp = JoinPath(root, TmpStepDirName(step));
  if (absl::StatusOr<bool> there = storage.Exists(tmp); there.ok() && *there) {
    RETURN_IF_ERROR(storage.RemoveAll(tmp));
  }
  RETURN_IF_ERROR(storage.CreateDir(tmp));
  RETURN_IF_ERROR(storage.CreateDir(JoinPath(tmp, kDataDirName)));
  return tmp;
}

}  // namespace

std::vector<int> ReplicaOffsets(const std::vector<std::string>& hosts,
                                int replicas) {
  const int n = static_cast<int>(hosts.size());
  std::vector<int> across, within;
  for (int d = 1; d < n; ++d) {
    bool other_host = true;
    for (int p = 0; p < n && other_host; ++p) {
      other_host = hosts[p] != hosts[(p + d) % n];
    }
    (other_host ? across : within).push_back(d);
  }
  across.insert(across.end(), within.begin(), within.end());
  across.resize(std::min<size_t>(across.size(), std::max(0, replicas - 1)));
  return across;
}

absl::StatusOr<std::unique_ptr<LocalTier>> LocalTier::Open(
    const std::string& root_pattern, int replicas, int keep_last,
    Coordinator& coordinator, Storage& storage) {
  if (replicas < 1 || keep_last < 1 || root_pattern.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "local tier: replicas (%d) and keep_last (%d) must be at least 1 and "
        "the root must be named",
        replicas, keep_last));
  }
  const int rank = coordinator.rank(), n = coordinator.size();
  const std::string path = absl::StrReplaceAll(
      root_pattern, {{"{rank}", absl::StrFormat("%d", rank)}});
  ASSIGN_OR_RETURN(
      std::vector<std::string> places,
      coordinator.AllGather("local tier hosts", HostName() + "\n" + path));
  std::vector<std::string> hosts;
  std::set<std::string> seen;
  for (int p = 0; p < n; ++p) {
    hosts.push_back(places[p].substr(0, places[p].find('\n')));
    if (!seen.insert(places[p]).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "local tier: two ranks on host %s would share the local root %s; "
          "put {rank} in its name",
          hosts.back(), places[p].substr(places[p].find('\n') + 1)));
    }
  }
  const std::vector<int> offsets = ReplicaOffsets(hosts, replicas);
  // Replication moves parts through Exchange: a coordinator without it
  // (the Python ones today) is refused now, not at the first local save.
  if (!offsets.empty()) {
    const int d = offsets.front();
    absl::Status probe = coordinator.Exchange(
        "local tier probe", {}, (rank + d) % n, (rank - d + n) % n,
        [](absl::Span<const uint8_t>) { return absl::OkStatus(); });
    if (probe.code() == absl::StatusCode::kUnimplemented) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "local tier: replicas %d copies each process's part to other "
          "processes through Coordinator::Exchange, which this job's "
          "coordinator lacks (%s); use replicas 1 (no copy: a lost node's "
          "steps come from the durable tier), or a coordinator that moves bulk "
          "data (MPI; Python's torch and JAX coordinators)",
          replicas, probe.message()));
    }
    RETURN_IF_ERROR(probe);
  }
  // Every rank opens its roots, then learns whether all could.
  std::unique_ptr<CheckpointRoot> own;
  std::map<int, std::unique_ptr<CheckpointRoot>> kept;
  absl::Status opened = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(own, CheckpointRoot::Open(path, &storage));
    for (int d : offsets) {
      const int origin = (rank - d + n) % n;
      ASSIGN_OR_RETURN(
          kept[origin],
          CheckpointRoot::Open(
              JoinPath(path, absl::StrFormat("peers/r%05d", origin)),
              &storage));
    }
    return absl::OkStatus();
  }();
  ASSIGN_OR_RETURN(std::vector<std::string> outcomes,
                   coordinator.AllGather("local tier open",
                                         opened.ok() ? "" : opened.ToString()));
  RETURN_IF_ERROR(opened);
  for (int p = 0; p < n; ++p) {
    if (!outcomes[p].empty()) {
      return absl::AbortedError(absl::StrFormat(
          "local tier: rank %d could not open its local root: %s", p,
          outcomes[p]));
    }
  }
  return std::unique_ptr<LocalTier>(
      new LocalTier(coordinator, storage, std::move(own), std::move(hosts),
                    offsets, replicas, std::move(kept), keep_last));
}

LocalTier::LocalTier(Coordinator& coordinator, Storage& storage,
                     std::unique_ptr<CheckpointRoot> own,
                     std::vector<std::string> hosts, std::vector<int> offsets,
                     int replicas,
                     std::map<int, std::unique_ptr<CheckpointRoot>> kept,
                     int keep_last)
    : coordinator_(coordinator),
      storage_(storage),
      own_(std::move(own)),
      hosts_(std::move(hosts)),
      offsets_(std::move(offsets)),
      replicas_(replicas),
      kept_(std::move(kept)),
      keep_last_(keep_last) {}

LocalTier::~LocalTier() = default;

std::vector<int> LocalTier::replica_holders() const {
  std::vector<int> holders;
  for (int d : offsets_) {
    holders.push_back((coordinator_.rank() + d) % coordinator_.size());
  }
  return holders;
}

absl::Status LocalTier::Prune(CheckpointRoot& root) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, root.List());
  for (size_t i = 0; i + keep_last_ < steps.size(); ++i) {
    RETURN_IF_ERROR(root.Delete(steps[i]));
  }
  return absl::OkStatus();
}

absl::Status LocalTier::Replicate(int64_t step, const absl::Status& saved,
                                  int64_t* sent_bytes) {
  ASSIGN_OR_RETURN(
      std::vector<std::string> outcomes,
      coordinator_.AllGather(absl::StrFormat("local step %d saved", step),
                             saved.ok() ? "" : saved.ToString()));
  std::vector<int> failed;
  for (size_t p = 0; p < outcomes.size(); ++p) {
    if (!outcomes[p].empty()) failed.push_back(static_cast<int>(p));
  }
  if (!failed.empty()) {
    if (!saved.ok()) return saved;
    if (own_->StepDir(step).ok()) RETURN_IF_ERROR(own_->Delete(step));
    return absl::AbortedError(absl::StrFormat(
        "local step %d: the part of rank(s) %s failed (%s), so no rank keeps "
        "its part",
        step, absl::StrJoin(failed, ", "), outcomes[failed[0]]));
  }
  const int n = coordinator_.size(), rank = coordinator_.rank();
  // 1. Every rank's extents.
  absl::Status first;  // this rank's first error; it still takes part
  std::unique_ptr<HeldPart> part;
  std::string part_text;
  if (absl::Status opened = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(const std::string dir, own_->StepDir(step));
        ASSIGN_OR_RETURN(part, OpenHeldPart(storage_, dir));
        ASSIGN_OR_RETURN(
            part_text, ReadText(JoinPath(dir, std::string(kManifestFileName))));
        return absl::OkStatus();
      }();
      !opened.ok()) {
    first = opened;
    part = nullptr;
  }
  ASSIGN_OR_RETURN(
      std::vector<std::string> listed,
      coordinator_.AllGather(
          absl::StrFormat("local step %d extents", step),
          EncodePartExtents(part ? part->extents : std::vector<PartExtent>{})));
  std::vector<std::vector<PartExtent>> parts(n);
  for (int p = 0; p < n; ++p) {
    absl::StatusOr<std::vector<PartExtent>> decoded = DecodePartExtents(
        listed[p], absl::StrFormat("rank %d's part of step %d", p, step));
    if (decoded.ok()) {
      parts[p] = *std::move(decoded);
    } else if (first.ok()) {
      first = decoded.status();
    }
  }
  // 2. What goes where.
  const std::vector<ReplicationSends> plan =
      PlanReplication(parts, hosts_, offsets_, replicas_);
  // 3. A copy to each holder; the copies this rank keeps.
  for (int d : offsets_) {
    const int origin = (rank - d + n) % n;
    std::unique_ptr<PartCopy> copy;
    if (part != nullptr) {
      const auto it = plan[rank].find(d);
      absl::StatusOr<std::unique_ptr<PartCopy>> made = CopyOfPart(
          *part, part_text,
          it == plan[rank].end() ? std::vector<int>{} : it->second, rank);
      if (made.ok()) {
        copy = *std::move(made);
      } else if (first.ok()) {
        first = made.status();
      }
    }
    CheckpointRoot& into = *kept_.at(origin);
    absl::StatusOr<std::string> tmp = MakeTmpStep(storage_, into.path(), step);
    absl::Status kept =
        ShiftFiles(coordinator_, storage_,
                   absl::StrFormat("local step %d +%d", step, d), step, d,
                   copy ? absl::Span<const OutgoingFile>(copy->files)
                        : absl::Span<const OutgoingFile>(),
                   tmp.value_or(""));
    if (copy != nullptr && sent_bytes != nullptr) {
      *sent_bytes += copy->data_bytes;
    }
    if (!tmp.ok()) {
      kept = tmp.status();
    } else if (kept.ok()) {
      // What arrived is a part of `origin`'s, of this step.
      absl::StatusOr<Manifest> manifest = ReadManifestFile(storage_, *tmp);
      if (!manifest.ok()) {
        kept = absl::DataLossError(
            absl::StrFormat("the copy of its part of step %d rank %d sent: %s",
                            step, origin, manifest.status().message()));
      } else if (!manifest->part || manifest->part->process != origin) {
        kept = absl::DataLossError(absl::StrFormat(
            "the copy of step %d rank %d sent is not its part", step, origin));
      }
    }
    if (tmp.ok()) {
      if (kept.ok()) {
        kept = Publish(storage_, into.path(), step, *tmp);
      } else {
        storage_.RemoveAll(*tmp).IgnoreError();
      }
    }
    if (first.ok()) first = kept;
  }
  if (absl::Status pruned = Prune(*own_); first.ok()) first = pruned;
  for (const auto& [origin, root] : kept_) {
    if (absl::Status pruned = Prune(*root); first.ok()) first = pruned;
  }
  return first;
}
namespace {

// What a restore from the local tier works with on this rank.
struct Tier {
  Coordinator& coordinator;
  Storage& storage;
  CheckpointRoot& own;
  const std::map<int, std::unique_ptr<CheckpointRoot>>& kept;
};

// One try at rebuilding the lost parts of a step (steps 2-4 of a restore).
struct Attempt {
  int64_t step = 0;
  std::set<int> lost;                             // ranks whose part is rebuilt
  std::map<int, std::unique_ptr<HeldPart>> held;  // this rank's, by origin
  std::vector<ExtentSource> sources;              // every rank's, gathered
  std::vector<std::vector<PartExtent>> needs;     // of each lost part
  Manifest manifest;                              // this rank's, when lost
  std::vector<std::vector<int>> plan;  // PlanRecovery(needs, sources)
  std::set<int> bad;                   // sources this rank found bad (indices)
  int64_t received = 0;                // bytes this rank received
};

std::string SourceName(const ExtentSource& source, int lost) {
  if (source.rank == source.origin) {
    return absl::StrFormat("rank %d's part", source.rank);
  }
  if (source.origin == lost) {
    return absl::StrFormat("rank %d's replica of it", source.rank);
  }
  return absl::StrFormat("rank %d's replica of rank %d's part", source.rank,
                         source.origin);
}

// The indices of `r`'s extents that source `b` serves, ascending.
std::vector<int> Served(const Attempt& attempt, int r, int b) {
  std::vector<int> indices;
  for (size_t i = 0; i < attempt.plan[r].size(); ++i) {
    if (attempt.plan[r][i] == b) indices.push_back(static_cast<int>(i));
  }
  return indices;
}

// Step 2: each rank's holdings of the step, gathered. This rank's part
// (unless lost), and its copies not found bad, are opened in `held`; a
// holder of a lost part's copy adds the part's whole manifest. False when
// a part was missing that the ranks thought there: it is lost now, and its
// holders describe it in the next try.
absl::StatusOr<bool> GatherHoldings(
    Tier tier, Attempt& attempt, const std::set<std::pair<int, int>>& excluded,
    const std::string& tag) {
  const int n = tier.coordinator.size(), rank = tier.coordinator.rank();
  std::string message;
  const auto hold = [&](int origin, CheckpointRoot& root) {
    absl::StatusOr<std::string> dir = root.StepDir(attempt.step);
    if (!dir.ok()) return;
    absl::StatusOr<std::unique_ptr<HeldPart>> opened =
        OpenHeldPart(tier.storage, *dir);
    if (!opened.ok()) return;  // an unreadable part serves nothing
    AppendRecord(message, origin == rank ? "own" : "kept");
    AppendRecord(message, absl::StrCat(origin));
    AppendRecord(message, EncodePartExtents((*opened)->extents));
    if (attempt.lost.contains(origin)) {
      // A copy made before PART.json existed holds the whole part.
      absl::StatusOr<std::string> text =
          ReadText(JoinPath(*dir, kPartManifestFileName));
      if (!text.ok())
        text = ReadText(JoinPath(*dir, std::string(kManifestFileName)));
      if (text.ok()) {
        AppendRecord(message, "part");
        AppendRecord(message, absl::StrCat(origin));
        AppendRecord(message, *text);
      }
    }
    attempt.held[origin] = *std::move(opened);
  };
  if (!attempt.lost.contains(rank)) hold(rank, tier.own);
  for (const auto& [origin, root] : tier.kept) {
    if (!excluded.contains({rank, origin})) hold(origin, *root);
  }
  ASSIGN_OR_RETURN(std::vector<std::string> all,
                   tier.coordinator.AllGather(tag + " holdings", message));
  std::set<int> own;
  std::map<int, std::vector<absl::string_view>> texts;
  for (int p = 0; p < n; ++p) {
    const std::string what = absl::StrFormat("rank %d's holdings", p);
    ASSIGN_OR_RETURN(std::vector<absl::string_view> records,
                     SplitRecords(all[p], what));
    for (size_t i = 0; i + 2 < records.size(); i += 3) {
      int origin = -1;
      if (!absl::SimpleAtoi(records[i + 1], &origin) || origin < 0 ||
          origin >= n) {
        return absl::DataLossError(absl::StrFormat("%s: no rank", what));
      }
      if (records[i] == "part") {
        texts[origin].push_back(records[i + 2]);
        continue;
      }
      ASSIGN_OR_RETURN(std::vector<PartExtent> extents,
                       DecodePartExtents(records[i + 2], what));
      if (records[i] == "own") own.insert(p);
      attempt.sources.push_back({p, origin, std::move(extents)});
    }
  }
  bool more_lost = false;
  for (int r = 0; r < n; ++r) {
    if (!attempt.lost.contains(r) && !own.contains(r)) {
      attempt.lost.insert(r);
      more_lost = true;
    }
  }
  if (more_lost) return false;
  // Each lost part's own manifest: what it held, and its metadata.
  attempt.needs.assign(n, {});
  for (int r : attempt.lost) {
    bool found = false;
    for (absl::string_view text : texts[r]) {
      absl::StatusOr<Manifest> manifest =
          DecodeManifest(std::string_view(text.data(), text.size()));
      if (!manifest.ok() || !manifest->part || manifest->part->process != r ||
          manifest->step != attempt.step) {
        continue;
      }
      attempt.needs[r] = PartExtents(*manifest);
      if (r == rank) attempt.manifest = *std::move(manifest);
      found = true;
      break;
    }
    if (!found) {
      return absl::NotFoundError(absl::StrFormat(
          "no process holds a readable copy of rank %d's part", r));
    }
  }
  return true;
}

// Checks the extents of this rank's lost part that arrived in `tmp`, and
// writes its manifest there, pointing at them.
absl::Status WriteRebuiltManifest(Tier tier, Attempt& attempt,
                                  const std::string& tmp) {
  const int rank = tier.coordinator.rank();
  std::map<int, std::vector<int64_t>> offsets;  // by source
  std::map<int, size_t> next;
  std::map<int, MappedFile> files;
  absl::Status status;
  Manifest manifest = attempt.manifest;
  size_t i = 0;
  for (ManifestArray& array : manifest.arrays) {
    for (ManifestExtent& extent : array.extents) {
      const int b = attempt.plan[rank][i++];
      const ExtentSource& source = attempt.sources[b];
      if (!offsets.contains(b)) {
        std::vector<int64_t> lengths;
        for (int k : Served(attempt, rank, b)) {
          lengths.push_back(attempt.needs[rank][k].length_bytes);
        }
        offsets[b] = PackedOffsets(lengths);
        ASSIGN_OR_RETURN(files[b],
                         MappedFile::Open(JoinPath(
                             tmp, CopyFileName(source.rank, source.origin))));
      }
      extent.file = CopyFileName(source.rank, source.origin);
      extent.offset_bytes = offsets[b][next[b]++];
      const absl::Span<const uint8_t> bytes = files[b].bytes();
      if (extent.offset_bytes + extent.length_bytes >
              static_cast<int64_t>(bytes.size()) ||
          !ExtentMatches(extent.hash, bytes.data() + extent.offset_bytes,
                         extent.length_bytes)) {
        attempt.bad.insert(b);
        if (status.ok()) {
          status = absl::DataLossError(absl::StrFormat(
              "array '%s' %s from %s: its bytes do not match its hash",
              array.name, extent.box.ToString(), SourceName(source, rank)));
        }
      }
    }
  }
  RETURN_IF_ERROR(status);
  ASSIGN_OR_RETURN(const std::string text, EncodeManifest(manifest));
  return WriteSynced(tier.storage,
                     JoinPath(tmp, std::string(kManifestFileName)), text);
}

// Steps 3-4: moves the extents of the lost parts to their ranks, which
// check them and commit their parts again. Errors: this rank's, as a lost
// part; a source this rank could not send from is put in `attempt.bad`.
absl::Status Rebuild(Tier tier, Attempt& attempt) {
  const int n = tier.coordinator.size(), rank = tier.coordinator.rank();
  std::set<int> offsets;
  for (int r : attempt.lost) {
    for (int b : attempt.plan[r]) {
      offsets.insert((r - attempt.sources[b].rank + n) % n);
    }
  }
  const bool lost = attempt.lost.contains(rank);
  absl::Status first;
  std::string tmp;
  if (lost) {
    absl::StatusOr<std::string> made =
        MakeTmpStep(tier.storage, tier.own.path(), attempt.step);
    if (made.ok()) {
      tmp = *made;
    } else {
      first = made.status();
    }
  }
  for (int d : offsets) {
    const int to = (rank + d) % n, from = (rank - d + n) % n;
    std::vector<OutgoingFile> files;
    for (size_t b = 0; b < attempt.sources.size() && attempt.lost.contains(to);
         ++b) {
      const ExtentSource& source = attempt.sources[b];
      if (source.rank != rank) continue;
      const std::vector<int> served = Served(attempt, to, b);
      if (served.empty()) continue;
      HeldPart& part = *attempt.held.at(source.origin);
      std::vector<int> indices;
      for (int i : served) {
        indices.push_back(part.by_key.at(attempt.needs[to][i].key));
      }
      absl::StatusOr<OutgoingFile> file =
          PackedFile(part, CopyFileName(rank, source.origin), indices);
      if (file.ok()) {
        files.push_back(*std::move(file));
      } else {
        attempt.bad.insert(static_cast<int>(b));  // it arrives short
      }
    }
    const bool receives =
        lost && absl::c_any_of(attempt.plan[rank], [&](int b) {
          return attempt.sources[b].rank == from;
        });
    absl::Status shifted =
        ShiftFiles(tier.coordinator, tier.storage,
                   absl::StrFormat("local restore %d +%d", attempt.step, d),
                   attempt.step, d, files, receives && first.ok() ? tmp : "",
                   nullptr, &attempt.received);
    if (receives && first.ok()) first = shifted;
  }
  if (!lost) return absl::OkStatus();
  if (first.ok()) first = WriteRebuiltManifest(tier, attempt, tmp);
  if (first.ok())
    return Publish(tier.storage, tier.own.path(), attempt.step, tmp);
  if (!tmp.empty()) tier.storage.RemoveAll(tmp).IgnoreError();
  return first;
}

// How many ranks' errors a try's note names.
constexpr int kNotedFailures = 2;

// How restoring step `s` from the local tier went.
struct StepResult {
  std::optional<LocalTier::Outcome> outcome;  // set when it was restored
  bool another_sharding = false;              // a rank's part does not serve it
  std::vector<std::string> notes;
};

// Steps 2-5 for step `s`, whose parts of `lost` ranks are not where they
// were saved.
absl::StatusOr<StepResult> RestoreStep(
    Tier tier, int64_t s, std::set<int> lost,
    const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
        restore) {
  const int n = tier.coordinator.size();
  std::set<std::pair<int, int>> excluded;  // copies found bad
  StepResult result;
  for (int t = 0; t < 4 * n + 4; ++t) {
    const std::string tag = absl::StrFormat("local restore %d try %d", s, t);
    Attempt attempt;
    attempt.step = s;
    attempt.lost = lost;
    absl::StatusOr<bool> gathered =
        GatherHoldings(tier, attempt, excluded, tag);
    if (absl::IsNotFound(gathered.status())) {
      result.notes.push_back(std::string(gathered.status().message()));
      return result;
    }
    RETURN_IF_ERROR(gathered.status());
    if (!*gathered) {
      lost = attempt.lost;
      continue;
    }
    absl::StatusOr<std::vector<std::vector<int>>> plan =
        PlanRecovery(attempt.needs, attempt.sources);
    if (!plan.ok()) {
      result.notes.push_back(std::string(plan.status().message()));
      return result;
    }
    attempt.plan = *std::move(plan);
    absl::Status rebuilt = Rebuild(tier, attempt);
    absl::StatusOr<RestoreStats> stats = [&]() -> absl::StatusOr<RestoreStats> {
      RETURN_IF_ERROR(rebuilt);
      ASSIGN_OR_RETURN(const std::string dir, tier.own.StepDir(s));
      return restore(dir);
    }();
    ASSIGN_OR_RETURN(
        std::vector<std::string> results,
        tier.coordinator.AllGather(
            tag, absl::StrFormat("%d\t%s\t%s",
                                 static_cast<int>(stats.status().code()),
                                 absl::StrJoin(attempt.bad, ","),
                                 stats.ok() ? "" : stats.status().ToString())));
    bool all_ok = true, stuck = false;
    int failures = 0;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> fields =
          absl::StrSplit(results[r], absl::MaxSplits('\t', 2));
      int code = static_cast<int>(absl::StatusCode::kUnknown);
      if (fields.size() != 3 || !absl::SimpleAtoi(fields[0], &code)) {
        fields = {"", "", results[r]};
      }
      bool bad_found = false;
      for (absl::string_view at :
           absl::StrSplit(fields[1], ',', absl::SkipEmpty())) {
        size_t b = 0;
        if (!absl::SimpleAtoi(at, &b) || b >= attempt.sources.size()) continue;
        const ExtentSource& source = attempt.sources[b];
        bad_found = true;
        if (source.rank == source.origin) {
          lost.insert(source.rank);  // its own part is bad
        } else {
          excluded.insert({source.rank, source.origin});
        }
      }
      if (static_cast<absl::StatusCode>(code) == absl::StatusCode::kOk)
        continue;
      all_ok = false;
      const bool was_lost = attempt.lost.contains(r);
      // The first few ranks' errors (a job of many ranks fails alike).
      if (++failures <= kNotedFailures) {
        result.notes.push_back(absl::StrFormat(
            "rank %d's %spart: %s", r, was_lost ? "rebuilt " : "", fields[2]));
      }
      if (static_cast<absl::StatusCode>(code) ==
          absl::StatusCode::kFailedPrecondition) {
        result.another_sharding = true;
      } else if (!was_lost) {
        lost.insert(r);  // its part is bad: rebuild it
      } else if (!bad_found) {
        stuck = true;  // no source to blame: trying again cannot help
      }
    }
    if (all_ok) {
      std::vector<std::string> used;
      for (int r : attempt.lost) {
        std::map<int, int64_t> bytes;  // by source
        for (size_t i = 0; i < attempt.plan[r].size(); ++i) {
          bytes[attempt.plan[r][i]] += attempt.needs[r][i].length_bytes;
        }
        std::vector<std::string> from;
        for (const auto& [b, size] : bytes) {
          from.push_back(absl::StrFormat(
              "%s (%d bytes)", SourceName(attempt.sources[b], r), size));
        }
        used.push_back(absl::StrFormat("rank %d's part from %s", r,
                                       absl::StrJoin(from, ", ")));
      }
      LocalTier::Outcome outcome;
      outcome.stats = *std::move(stats);
      outcome.step = s;
      outcome.received_bytes = attempt.received;
      outcome.note = absl::StrFormat(
          "local step %d%s%s%s", s, used.empty() ? "" : ": ",
          absl::StrJoin(used, "; "),
          result.notes.empty()
              ? ""
              : " (after: " + absl::StrJoin(result.notes, "; ") + ")");
      result.outcome = std::move(outcome);
      return result;
    }
    if (failures > kNotedFailures) {
      result.notes.push_back(
          absl::StrFormat("and %d more ranks", failures - kNotedFailures));
    }
    if (result.another_sharding || stuck) return result;
  }
  result.notes.push_back("every try failed");
  return result;
}

}  // namespace

absl::StatusOr<LocalTier::Outcome> LocalTier::Restore(
    std::optional<int64_t> step, const std::vector<int64_t>& durable_steps,
    const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
        restore) {
  const int n = coordinator_.size(), rank = coordinator_.rank();
  // 1. Which steps every rank holds.
  std::string inventory;
  AppendSteps(inventory, "durable", rank, durable_steps);
  AppendSteps(inventory, "own", rank,
              own_->List().value_or(std::vector<int64_t>{}));
  for (const auto& [origin, root] : kept_) {
    AppendSteps(inventory, "kept", origin,
                root->List().value_or(std::vector<int64_t>{}));
  }
  ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      coordinator_.AllGather("local restore inventory", inventory));
  std::vector<int64_t> durable;  // rank 0's view decides
  std::vector<std::set<int64_t>> own(n);
  std::set<std::pair<int, int64_t>> described;  // (origin, step) copies
  std::set<int64_t> seen;
  for (int p = 0; p < n; ++p) {
    for (absl::string_view line :
         absl::StrSplit(all[p], '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
      int origin = -1;
      if (fields.size() != 3 || !absl::SimpleAtoi(fields[1], &origin) ||
          origin < 0 || origin >= n) {
        continue;
      }
      for (absl::string_view s :
           absl::StrSplit(fields[2], ',', absl::SkipEmpty())) {
        int64_t at = 0;
        if (!absl::SimpleAtoi(s, &at)) continue;
        if (fields[0] == "durable") {
          if (p == 0) durable.push_back(at);
        } else if (fields[0] == "own" && origin == p) {
          own[p].insert(at);
          seen.insert(at);
        } else if (fields[0] == "kept") {
          described.insert({origin, at});
          seen.insert(at);
        }
      }
    }
  }
  // A candidate: every rank's part is where it was saved or described by
  // a copy.
  const auto candidate = [&](int64_t s) {
    for (int r = 0; r < n; ++r) {
      if (!own[r].contains(s) && !described.contains({r, s})) return false;
    }
    return true;
  };
  std::optional<int64_t> newest_durable;
  for (int64_t s : durable) {
    if (!step || s == *step) {
      newest_durable = std::max(newest_durable.value_or(s), s);
    }
  }
  Outcome outcome;
  const auto use_durable = [&](std::string why) {
    outcome.durable = newest_durable.has_value();
    outcome.none = !outcome.durable;
    outcome.step = newest_durable.value_or(-1);
    outcome.note =
        outcome.durable
            ? absl::StrFormat("durable step %d: %s", outcome.step, why)
            : absl::StrFormat("no step to restore: %s", why);
    return outcome;
  };
  // 2-5, for each candidate, newest first, newer than the durable step.
  std::vector<std::string> notes;
  for (auto it = seen.rbegin(); it != seen.rend(); ++it) {
    const int64_t s = *it;
    if ((step && s != *step) || !candidate(s)) continue;
    if (newest_durable && *newest_durable >= s) {
      if (!notes.empty()) break;
      return use_durable(absl::StrFormat(
          "it is at least as new as the newest complete local step, %d", s));
    }
    std::set<int> lost;
    for (int r = 0; r < n; ++r) {
      if (!own[r].contains(s)) lost.insert(r);
    }
    ASSIGN_OR_RETURN(
        StepResult result,
        RestoreStep({coordinator_, storage_, *own_, kept_}, s, lost, restore));
    if (result.outcome) return *std::move(result.outcome);
    notes.push_back(absl::StrFormat("local step %d could not be restored: %s",
                                    s, absl::StrJoin(result.notes, "; ")));
    if (result.another_sharding) break;
  }
  if (notes.empty()) return use_durable("no local step has every rank's part");
  return use_durable(absl::StrJoin(notes, "; "));
}

}  // namespace hoist
