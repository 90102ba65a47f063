// The local tier: see local_tier.h.
//
// A local save, once every rank's part committed (Replicate):
//   1. the ranks' outcomes and the extents of their parts are gathered at
//      rank 0 (replica_plan.h);
//   2. rank 0 evaluates PlanReplication on them: an extent is sent only
//      while fewer than `replicas` processes (hosts, across hosts) hold it,
//      so a data-parallel replica's extents are not sent; and scatters
//      each rank its share (what it sends each holder, what each sender
//      sends it), so no rank but 0 handles the others' extents;
//   3. for each replica offset d, a shift (peer_shift.h): each rank sends
//      rank + d the extents planned for it (one data file, each extent at a
//      multiple of 4 KiB) and its whole manifest as PART.json (what the
//      part holds, and its per-rank metadata), even when no extent goes.
//      The receiver writes them into a temporary directory, derives the
//      copy's MANIFEST.json from PART.json and the plan (ManifestOfCopy),
//      and commits it as any step (CommitStep: the manifest last, fsyncs,
//      the rename to peers/rNNNNN/step_N, replacing an older copy).
#include "hoist/checkpoint/tier/local_tier.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/save/save.h"
#include "hoist/checkpoint/tier/part_files.h"
#include "hoist/checkpoint/tier/peer_shift.h"
#include "hoist/checkpoint/tier/replica_plan.h"
#include "hoist/manifest.h"

namespace hoist {
namespace {

// What a rank sends a holder after a local save: the extents `indices`
// (ascending) of its part in one data file, and the whole part's manifest
// `part_text` (from which the holder derives the copy's own manifest,
// ManifestOfCopy). The string the files point into lives here.
struct PartCopy {
  std::string part_text;
  std::vector<OutgoingFile> files;
  int64_t data_bytes = 0;
};

absl::StatusOr<std::unique_ptr<PartCopy>> CopyOfPart(
    HeldPart& part, const std::vector<int>& indices, int rank) {
  auto copy = std::make_unique<PartCopy>();
  ASSIGN_OR_RETURN(OutgoingFile data,
                   PackedFile(part, CopyFileName(rank, rank), indices));
  for (int i : indices) copy->data_bytes += part.extents[i].length_bytes;
  ASSIGN_OR_RETURN(copy->part_text, EncodeManifest(part.manifest));
  copy->files.push_back(std::move(data));
  copy->files.push_back(
      {kPartManifestFileName,
       {{reinterpret_cast<const uint8_t*>(copy->part_text.data()),
         copy->part_text.size()}}});
  return copy;
}

// The copy of rank `origin`'s part of `step` that arrived in `tmp`, with the
// extents `indices` of it: its manifest, checked against what was planned.
absl::StatusOr<std::string> ReceivedCopyManifest(
    const std::string& tmp, int64_t step, int origin,
    const std::vector<int>& indices) {
  const auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrFormat(
        "the copy of its part of step %d rank %d sent: %s", step, origin, why));
  };
  absl::StatusOr<std::string> text =
      ReadText(JoinPath(tmp, kPartManifestFileName));
  if (!text.ok()) return bad(text.status().message());
  absl::StatusOr<Manifest> part = DecodeManifest(*text);
  if (!part.ok()) return bad(part.status().message());
  if (!part->part || part->part->process != origin || part->step != step) {
    return bad("its manifest is not of its part of this step");
  }
  absl::StatusOr<Manifest> copy =
      ManifestOfCopy(*part, indices, CopyFileName(origin, origin));
  if (!copy.ok()) return bad(copy.status().message());
  return EncodeManifest(*copy);
}

// A rank's share of the replication plan, as rank 0 sends it: lists of
// extent indices, each u32 count | i32 indices.
std::string EncodeShare(const std::vector<const std::vector<int>*>& lists) {
  std::string out;
  for (const std::vector<int>* list : lists) {
    const uint32_t count = static_cast<uint32_t>(list->size());
    out.append(reinterpret_cast<const char*>(&count), sizeof count);
    out.append(reinterpret_cast<const char*>(list->data()),
               list->size() * sizeof(int));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<int>>> DecodeShare(std::string_view in,
                                                          size_t lists,
                                                          int64_t step) {
  std::vector<std::vector<int>> out(lists);
  for (std::vector<int>& list : out) {
    uint32_t count = 0;
    if (in.size() < sizeof count) break;
    std::memcpy(&count, in.data(), sizeof count);
    in.remove_prefix(sizeof count);
    if (in.size() / sizeof(int) < count) {
      in = std::string_view();
      count = 0;
    }
    list.resize(count);
    std::memcpy(list.data(), in.data(), count * sizeof(int));
    in.remove_prefix(count * sizeof(int));
  }
  if (!in.empty() || out.size() != lists) {
    return absl::InternalError(absl::StrFormat(
        "local step %d: a malformed replication plan from rank 0", step));
  }
  return out;
}

}  // namespace

absl::Status LocalTier::PlanShares(int64_t step,
                                   const std::vector<std::string>& listed,
                                   std::vector<std::string>& shares) const {
  const int n = static_cast<int>(listed.size());
  absl::Status problem;
  std::vector<int> failed;
  std::vector<std::vector<PartExtent>> parts(n);
  for (int p = 0; p < n; ++p) {
    if (absl::StartsWith(listed[p], "!")) {
      failed.push_back(p);
      continue;
    }
    absl::StatusOr<std::vector<PartExtent>> decoded = DecodePartExtents(
        listed[p].substr(1),
        absl::StrFormat("rank %d's part of step %d", p, step));
    if (decoded.ok()) {
      parts[p] = *std::move(decoded);
    } else if (problem.ok()) {
      problem = decoded.status();
    }
  }
  if (!failed.empty()) {
    const std::string why = absl::StrFormat(
        "!local step %d: the part of rank(s) %s failed (%s), so no rank keeps "
        "its part",
        step, absl::StrJoin(failed, ", "), listed[failed[0]].substr(1));
    shares.assign(n, why);
    return absl::OkStatus();
  }
  const std::vector<ReplicationSends> plan =
      PlanReplication(parts, hosts_, offsets_, replicas_);
  const std::vector<int> none;
  const auto planned = [&](int p, int d) -> const std::vector<int>* {
    const auto it = plan[p].find(d);
    return it == plan[p].end() ? &none : &it->second;
  };
  shares.resize(n);
  for (int r = 0; r < n; ++r) {
    std::vector<const std::vector<int>*> lists;
    for (int d : offsets_) {
      lists.push_back(planned(r, d));
      lists.push_back(planned((r - d + n) % n, d));
    }
    shares[r] = EncodeShare(lists);
  }
  return problem;
}

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
  const int n = coordinator_.size(), rank = coordinator_.rank();
  absl::Status first;  // this rank's first error; it still takes part
  std::unique_ptr<HeldPart> part;
  if (saved.ok()) {
    if (absl::Status opened = [&]() -> absl::Status {
          ASSIGN_OR_RETURN(const std::string dir, own_->StepDir(step));
          ASSIGN_OR_RETURN(part, OpenHeldPart(storage_, dir));
          return absl::OkStatus();
        }();
        !opened.ok()) {
      first = opened;
    }
  }
  // 1. Each rank's outcome and its part's extents, gathered at rank 0.
  ASSIGN_OR_RETURN(
      std::vector<std::string> listed,
      coordinator_.Gather(
          absl::StrFormat("local step %d extents", step),
          saved.ok() ? absl::StrCat("+", EncodePartExtents(
                                             part ? part->extents
                                                  : std::vector<PartExtent>{}))
                     : absl::StrCat("!", saved.ToString()),
          0));
  // 2. What goes where, decided by rank 0; each rank learns its share.
  std::vector<std::string> shares;
  if (rank == 0) {
    absl::Status planned = PlanShares(step, listed, shares);
    if (first.ok()) first = planned;
  }
  ASSIGN_OR_RETURN(
      const std::string share,
      coordinator_.Scatter(absl::StrFormat("local step %d plan", step),
                           std::move(shares), 0));
  if (absl::StartsWith(share, "!")) {
    if (!saved.ok()) return saved;
    if (own_->StepDir(step).ok()) RETURN_IF_ERROR(own_->Delete(step));
    return absl::AbortedError(share.substr(1));
  }
  ASSIGN_OR_RETURN(const std::vector<std::vector<int>> lists,
                   DecodeShare(share, 2 * offsets_.size(), step));
  // Per offset d: the extents this rank sends rank + d, and those rank - d
  // sends this rank.
  const auto planned = [&](int p, int d) -> const std::vector<int>& {
    const size_t k = absl::c_find(offsets_, d) - offsets_.begin();
    return lists[2 * k + (p == rank ? 0 : 1)];
  };
  // 3. A copy to each holder; the copies this rank keeps.
  for (int d : offsets_) {
    const int origin = (rank - d + n) % n;
    std::unique_ptr<PartCopy> copy;
    if (part != nullptr) {
      absl::StatusOr<std::unique_ptr<PartCopy>> made =
          CopyOfPart(*part, planned(rank, d), rank);
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
      // Committed as any step, its manifest written last.
      absl::StatusOr<std::string> manifest =
          ReceivedCopyManifest(*tmp, step, origin, planned(origin, d));
      kept = manifest.ok() ? CommitStep(storage_, into.path(), step, *tmp,
                                        *manifest, /*overwrite=*/true)
                           : manifest.status();
    }
    if (tmp.ok() && !kept.ok()) storage_.RemoveAll(*tmp).IgnoreError();
    if (first.ok()) first = kept;
  }
  if (absl::Status pruned = Prune(*own_); first.ok()) first = pruned;
  for (const auto& [origin, root] : kept_) {
    if (absl::Status pruned = Prune(*root); first.ok()) first = pruned;
  }
  return first;
}

}  // namespace hoist
