// What every process wrote, exchanged and agreed on (steps 4 and 5 of
// save.cc's protocol), and the manifest built from it.
#include "hoist/checkpoint/save/written.h"

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "hoist/base/status_macros.h"
#include "hoist/base/xxh3.h"
#include "hoist/coord/status_wire.h"
#include "hoist/format/layout.h"

namespace hoist {
namespace {

// (slice, hash, offset, referenced) of this process's slices, as bytes for
// the all-gather.
struct WrittenRecord {
  int32_t slice;
  uint8_t referenced;
  uint64_t low, high;
  int64_t offset;
};

std::string EncodeWritten(const SavePlan& plan, int process,
                          const WrittenExtents& written) {
  std::string out;
  for (int s : plan.SlicesOfProcess(process)) {
    const WrittenRecord record{s, written.referenced[s], written.hashes[s].low,
                               written.hashes[s].high, written.offsets[s]};
    out.append(reinterpret_cast<const char*>(&record.slice),
               sizeof record.slice);
    out.append(reinterpret_cast<const char*>(&record.referenced),
               sizeof record.referenced);
    out.append(reinterpret_cast<const char*>(&record.low), sizeof record.low);
    out.append(reinterpret_cast<const char*>(&record.high), sizeof record.high);
    out.append(reinterpret_cast<const char*>(&record.offset),
               sizeof record.offset);
  }
  return out;
}

absl::Status DecodeWritten(std::string_view bytes, WrittenExtents& written) {
  constexpr size_t kRecord = sizeof(int32_t) + sizeof(uint8_t) +
                             2 * sizeof(uint64_t) + sizeof(int64_t);
  if (bytes.size() % kRecord != 0) {
    return absl::InternalError("malformed extent hashes from a peer");
  }
  for (size_t at = 0; at < bytes.size(); at += kRecord) {
    WrittenRecord record;
    const char* p = bytes.data() + at;
    std::memcpy(&record.slice, p, sizeof record.slice);
    p += sizeof record.slice;
    std::memcpy(&record.referenced, p, sizeof record.referenced);
    p += sizeof record.referenced;
    std::memcpy(&record.low, p, sizeof record.low);
    p += sizeof record.low;
    std::memcpy(&record.high, p, sizeof record.high);
    p += sizeof record.high;
    std::memcpy(&record.offset, p, sizeof record.offset);
    if (record.slice < 0 ||
        static_cast<size_t>(record.slice) >= written.hashes.size()) {
      return absl::InternalError("extent hash for an unknown slice");
    }
    written.hashes[record.slice] = {record.low, record.high, true};
    written.offsets[record.slice] = record.offset;
    written.referenced[record.slice] = record.referenced;
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t PlanFingerprint(const SaveRequest& request) {
  SaveRequest bare = request;
  bare.metadata_json = "{}";
  bare.step = 0;
  const absl::StatusOr<std::string> text = EncodeManifest(
      BuildManifest(bare, WrittenExtents(*request.plan), nullptr));
  // The request was validated before any byte moved; an encoding error
  // would be the same on every rank.
  return text.ok() ? XXH3_64bits(text->data(), text->size()) : 0;
}

Manifest BuildManifest(const SaveRequest& request,
                       const WrittenExtents& written, const DeltaBase* base,
                       const ManifestScope& scope) {
  const SavePlan& plan = *request.plan;
  Manifest manifest;
  manifest.step = request.step;
  manifest.metadata_json = request.metadata_json;
  manifest.part = request.part;
  for (size_t a = 0; a < plan.arrays.size(); ++a) {
    const PlannedArray& array = plan.arrays[a];
    manifest.arrays.push_back({array.name,
                               array.dtype,
                               array.shape,
                               request.arrays[a].sharding.ToString(),
                               {}});
  }
  // Each file's name once, not once per slice (only the files named).
  std::vector<std::string> file_names(plan.files.size());
  plan.ForEachSlice(scope.process, [&](size_t s) {
    const PlannedSlice& slice = plan.slices[s];
    if (written.referenced[s] && base != nullptr && base->extents[s]) {
      manifest.arrays[slice.array].extents.push_back(base->Reference(s));
      return;
    }
    std::string& file = file_names[slice.file];
    if (file.empty()) {
      file = DataFileName(plan.files[slice.file].process,
                          plan.files[slice.file].stream, scope.spread_prefixes);
    }
    manifest.arrays[slice.array].extents.push_back(
        {slice.box, file, written.offsets[s], slice.length_bytes,
         written.hashes[s], std::nullopt});
  });
  return manifest;
}

absl::StatusOr<std::string> MetadataWithPerRank(
    const SaveRequest& request, const std::vector<std::string>& all) {
  const size_t given = absl::c_count_if(
      all, [](const std::string& json) { return !json.empty(); });
  if (given == 0) return request.metadata_json;
  if (given != all.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step %d: %d of %d ranks gave per-rank state: all or none must",
        request.step, given, all.size()));
  }
  const std::string& metadata = request.metadata_json;
  const size_t close = metadata.find_last_of('}');
  if (close == std::string::npos) {
    return absl::InvalidArgumentError("metadata is not a JSON object");
  }
  const bool empty =
      metadata.find_first_not_of(" \t\r\n", metadata.find('{') + 1) == close;
  return absl::StrCat(metadata.substr(0, close), empty ? "" : ", ",
                      "\"per_rank\": [", absl::StrJoin(all, ", "), "]}");
}

namespace {

// A length-prefixed section of a gathered record.
void AppendSection(std::string& out, std::string_view section) {
  const uint32_t length = static_cast<uint32_t>(section.size());
  out.append(reinterpret_cast<const char*>(&length), sizeof length);
  out += section;
}

absl::StatusOr<std::string_view> TakeSection(std::string_view& in,
                                             const char* what) {
  uint32_t length = 0;
  if (in.size() >= sizeof length) {
    std::memcpy(&length, in.data(), sizeof length);
  }
  if (in.size() < sizeof length || in.size() - sizeof length < length) {
    return absl::InternalError(
        absl::StrFormat("malformed %s from a peer", what));
  }
  std::string_view section = in.substr(sizeof length, length);
  in.remove_prefix(sizeof length + length);
  return section;
}

// Each phase's seconds and bytes, in order (the names are the same on
// every rank).
struct PhaseWire {
  double seconds;
  int64_t bytes;
};

std::string EncodePhases(absl::Span<const PhaseStat> phases) {
  std::string out(phases.size() * sizeof(PhaseWire), '\0');
  for (size_t i = 0; i < phases.size(); ++i) {
    const PhaseWire wire{absl::ToDoubleSeconds(phases[i].elapsed),
                         phases[i].bytes};
    std::memcpy(out.data() + i * sizeof wire, &wire, sizeof wire);
  }
  return out;
}

// Folds rank `rank`'s phases into the slowest so far.
absl::Status FoldSlowest(std::string_view wire, int rank,
                         absl::Span<const PhaseStat> mine,
                         std::vector<PhaseStat>& slowest) {
  if (wire.size() != mine.size() * sizeof(PhaseWire)) {
    return absl::InternalError(absl::StrFormat(
        "rank %d measured other save phases than this rank", rank));
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    PhaseWire theirs;
    std::memcpy(&theirs, wire.data() + i * sizeof theirs, sizeof theirs);
    const absl::Duration elapsed = absl::Seconds(theirs.seconds);
    if (slowest.size() <= i) {
      slowest.push_back({mine[i].phase, elapsed, theirs.bytes, rank});
    } else if (elapsed > slowest[i].elapsed) {
      slowest[i] = {mine[i].phase, elapsed, theirs.bytes, rank};
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Gathered> GatherOutcomes(Coordinator& coordinator,
                                        const SaveRequest& request,
                                        const absl::Status& local,
                                        const WrittenExtents& written,
                                        absl::Span<const PhaseStat> phases) {
  const SavePlan& plan = *request.plan;
  const int rank = coordinator.rank();
  // Each rank's outcome, plan fingerprint, per-rank state and phases,
  // length-prefixed, then (when it succeeded) its records. The
  // fingerprint costs an encoding of the whole plan: skipped when there is
  // no other process to disagree with, and made once per plan by a caller
  // that keeps it (SaveRequest::plan_fingerprint).
  const uint64_t fingerprint = coordinator.size() == 1 ? 0
                               : request.plan_fingerprint != 0
                                   ? request.plan_fingerprint
                                   : PlanFingerprint(request);
  std::string mine;
  AppendSection(mine, EncodeStatus(local));
  AppendSection(mine, absl::StrCat(absl::Hex(fingerprint)));
  AppendSection(mine, request.per_rank_json);
  AppendSection(mine, EncodePhases(phases));
  if (local.ok()) mine += EncodeWritten(plan, rank, written);
  ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                   coordinator.Gather("written", std::move(mine), 0));
  Gathered out{WrittenExtents(plan), {}, 0, {}};
  if (rank != 0) return out;
  std::string_view rank0_fingerprint;
  for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
    std::string_view in = gathered[r];
    out.received_bytes += static_cast<int64_t>(in.size());
    ASSIGN_OR_RETURN(std::string_view outcome, TakeSection(in, "outcome"));
    ASSIGN_OR_RETURN(std::string_view print, TakeSection(in, "fingerprint"));
    ASSIGN_OR_RETURN(std::string_view per_rank,
                     TakeSection(in, "per-rank state"));
    ASSIGN_OR_RETURN(std::string_view wire, TakeSection(in, "save phases"));
    if (r == 0) rank0_fingerprint = print;
    if (!out.verdict.status.ok()) continue;  // the first failure: the step's
    const absl::Status theirs = DecodeStatus(std::string(outcome), r);
    if (!theirs.ok()) {
      out.verdict.status = absl::AbortedError(absl::StrFormat(
          "step %d aborted: %s", request.step, theirs.message()));
      out.verdict.failed_rank = r;
      continue;
    }
    if (print != rank0_fingerprint) {
      out.verdict.status = absl::FailedPreconditionError(absl::StrFormat(
          "step %d aborted: rank %d planned a different checkpoint than "
          "rank 0 (different arrays, shapes, shardings or plan options)",
          request.step, r));
      continue;
    }
    out.per_rank.emplace_back(per_rank);
    RETURN_IF_ERROR(FoldSlowest(wire, r, phases, out.verdict.slowest));
    RETURN_IF_ERROR(DecodeWritten(in, out.all));
  }
  return out;
}

namespace {

// The slowest ranks' phases, as the verdict carries them.
std::string EncodeSlowest(absl::Span<const PhaseStat> slowest) {
  std::string out;
  for (const PhaseStat& phase : slowest) {
    AppendSection(out, phase.phase);
    const PhaseWire wire{absl::ToDoubleSeconds(phase.elapsed), phase.bytes};
    out.append(reinterpret_cast<const char*>(&wire), sizeof wire);
    const int32_t rank = phase.rank;
    out.append(reinterpret_cast<const char*>(&rank), sizeof rank);
  }
  return out;
}

absl::StatusOr<std::vector<PhaseStat>> DecodeSlowest(std::string_view in) {
  std::vector<PhaseStat> out;
  while (!in.empty()) {
    ASSIGN_OR_RETURN(std::string_view name, TakeSection(in, "verdict"));
    PhaseWire wire;
    int32_t rank = 0;
    if (in.size() < sizeof wire + sizeof rank) {
      return absl::InternalError("malformed verdict from rank 0");
    }
    std::memcpy(&wire, in.data(), sizeof wire);
    std::memcpy(&rank, in.data() + sizeof wire, sizeof rank);
    in.remove_prefix(sizeof wire + sizeof rank);
    out.push_back(
        {std::string(name), absl::Seconds(wire.seconds), wire.bytes, rank});
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<PhaseStat>> ShareVerdict(Coordinator& coordinator,
                                                    const SaveRequest& request,
                                                    const absl::Status& local,
                                                    const Verdict& verdict) {
  std::string mine;
  if (coordinator.rank() == 0) {
    // What the ranks other than the failed one return: a commit's error
    // reads as rank 0's.
    const absl::Status others = verdict.failed_rank == 0 && local.ok()
                                    ? FromRank(verdict.status, 0)
                                    : verdict.status;
    const int32_t failed = verdict.failed_rank;
    mine.append(reinterpret_cast<const char*>(&failed), sizeof failed);
    AppendSection(mine, EncodeStatus(others));
    mine += EncodeSlowest(verdict.slowest);
  }
  ASSIGN_OR_RETURN(std::string sent,
                   coordinator.Broadcast("committed", std::move(mine), 0));
  std::string_view in = sent;
  int32_t failed = -1;
  if (in.size() < sizeof failed) {
    return absl::InternalError("malformed verdict from rank 0");
  }
  std::memcpy(&failed, in.data(), sizeof failed);
  in.remove_prefix(sizeof failed);
  ASSIGN_OR_RETURN(std::string_view others, TakeSection(in, "verdict"));
  if (failed == coordinator.rank()) {
    // This rank's own failure keeps its code, and reads as the others
    // read it: which step, which rank. Rank 0's commit error is its own.
    if (local.ok()) return verdict.status;
    if (coordinator.size() == 1) return local;
    return absl::Status(
        local.code(),
        absl::StrFormat("step %d aborted: rank %d: %s", request.step,
                        coordinator.rank(), local.message()));
  }
  RETURN_IF_ERROR(DecodeStatusVerbatim(std::string(others)));
  return DecodeSlowest(in);
}

}  // namespace hoist
