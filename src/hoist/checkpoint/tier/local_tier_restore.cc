// The local tier's restore: see local_tier.h.
//
// A local restore (Restore):
//   1. which steps the ranks hold, of their own and copies, is gathered at
//      rank 0, which broadcasts the candidates: a step every rank's part of
//      which is here or described by a copy (its PART.json), with the ranks
//      whose part is lost;
//   2. for the newest candidate with a lost part, they all-gather the
//      extents of every part and copy they hold, and the whole manifest of
//      each lost part (with none lost, 2-4 are skipped);
//   3. each evaluates PlanRecovery: for each extent of a lost part, the
//      process that serves it (a data-parallel replica's own part, or a
//      copy), spreading the bytes over them;
//   4. shifts move those extents; the lost rank checks each one's hash,
//      writes its part's manifest pointing at the received files, fsyncs
//      and renames the directory into place: its part is back;
//   5. every rank restores from its part; the outcomes are gathered at rank
//      0, which broadcasts its verdict. A part or copy found bad is left
//      out and 2-5 run again; when no source is left, the next candidate.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/save/save.h"
#include "hoist/checkpoint/tier/arrivals.h"
#include "hoist/checkpoint/tier/local_tier.h"
#include "hoist/checkpoint/tier/part_files.h"
#include "hoist/checkpoint/tier/peer_shift.h"
#include "hoist/checkpoint/tier/replica_plan.h"
#include "hoist/format/extent_hash.h"
#include "hoist/format/layout.h"
#include "hoist/manifest.h"

namespace hoist {
namespace {

// "<tag> <rank> <step>,<step>,..." lines: what one rank holds.
void AppendSteps(std::string& out, absl::string_view tag, int rank,
                 const std::vector<int64_t>& steps) {
  absl::StrAppendFormat(&out, "%s %d %s\n", tag, rank,
                        absl::StrJoin(steps, ","));
}

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

// The manifest of this rank's lost part, pointing at the extents that
// arrived; a source whose bytes do not match is put in `attempt.bad`.
absl::StatusOr<std::string> RebuiltManifest(Tier tier, Attempt& attempt,
                                            const Arrivals& arrivals) {
  const int rank = tier.coordinator.rank();
  absl::Status status;
  Manifest manifest = attempt.manifest;
  size_t i = 0;
  for (ManifestArray& array : manifest.arrays) {
    for (ManifestExtent& extent : array.extents) {
      const int b = attempt.plan[rank][i];
      extent.file = arrivals.file(i);
      extent.offset_bytes = arrivals.offset(i);
      if (!arrivals.matched(i++)) {
        attempt.bad.insert(b);
        if (status.ok()) {
          status = absl::DataLossError(absl::StrFormat(
              "array '%s' %s from %s: its bytes do not match its hash",
              array.name, extent.box.ToString(),
              SourceName(attempt.sources[b], rank)));
        }
      }
    }
  }
  RETURN_IF_ERROR(status);
  return EncodeManifest(manifest);
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
  std::optional<Arrivals> arrivals;
  if (lost)
    arrivals.emplace(attempt.manifest, attempt.plan[rank], attempt.sources);
  const ReceivedBytes seen = [&](const std::string& path, int64_t offset,
                                 absl::Span<const uint8_t> bytes) {
    arrivals->See(path, offset, bytes);
  };
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
                   &attempt.received, receives ? seen : nullptr);
    if (receives && first.ok()) first = shifted;
  }
  if (!lost) return absl::OkStatus();
  if (first.ok()) {
    absl::StatusOr<std::string> manifest =
        RebuiltManifest(tier, attempt, *arrivals);
    first = manifest.ok() ? CommitStep(tier.storage, tier.own.path(),
                                       attempt.step, tmp, *manifest,
                                       /*overwrite=*/true)
                          : manifest.status();
  }
  if (!first.ok() && !tmp.empty()) tier.storage.RemoveAll(tmp).IgnoreError();
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

// What rank 0 makes of a try's outcomes on every rank, for every rank: the
// ranks whose parts are lost now, the copies found bad, and what to say.
struct TryVerdict {
  bool all_ok = false;
  bool stuck = false;  // no source to blame: trying again cannot help
  bool another_sharding = false;  // a rank's part does not serve it
  int failures = 0;
  std::set<int> lost;
  std::set<std::pair<int, int>> excluded;
  std::vector<std::string> notes;
};

// `results`: each rank's "CODE\tBAD SOURCES\tERROR" for `attempt`.
TryVerdict JudgeTry(const std::vector<std::string>& results,
                    const Attempt& attempt, const std::set<int>& lost,
                    const std::set<std::pair<int, int>>& excluded) {
  TryVerdict verdict;
  verdict.all_ok = true;
  verdict.lost = lost;
  verdict.excluded = excluded;
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
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
        verdict.lost.insert(source.rank);  // its own part is bad
      } else {
        verdict.excluded.insert({source.rank, source.origin});
      }
    }
    if (static_cast<absl::StatusCode>(code) == absl::StatusCode::kOk) continue;
    verdict.all_ok = false;
    const bool was_lost = attempt.lost.contains(r);
    // The first few ranks' errors (a job of many ranks fails alike).
    if (++verdict.failures <= kNotedFailures) {
      verdict.notes.push_back(absl::StrFormat(
          "rank %d's %spart: %s", r, was_lost ? "rebuilt " : "", fields[2]));
    }
    if (static_cast<absl::StatusCode>(code) ==
        absl::StatusCode::kFailedPrecondition) {
      verdict.another_sharding = true;
    } else if (!was_lost) {
      verdict.lost.insert(r);  // its part is bad: rebuild it
    } else if (!bad_found) {
      verdict.stuck = true;
    }
  }
  return verdict;
}

// A TryVerdict as records (part_files.h): flags and count, the lost ranks,
// the excluded copies (rank:origin), then one record per note.
std::string EncodeVerdict(const TryVerdict& verdict) {
  std::string out;
  AppendRecord(out, absl::StrCat(verdict.all_ok ? 1 : 0, verdict.stuck ? 1 : 0,
                                 verdict.another_sharding ? 1 : 0, " ",
                                 verdict.failures));
  AppendRecord(out, absl::StrJoin(verdict.lost, ","));
  std::vector<std::string> excluded;
  for (const auto& [rank, origin] : verdict.excluded) {
    excluded.push_back(absl::StrCat(rank, ":", origin));
  }
  AppendRecord(out, absl::StrJoin(excluded, ","));
  for (const std::string& note : verdict.notes) AppendRecord(out, note);
  return out;
}

absl::StatusOr<TryVerdict> DecodeVerdict(const std::string& in, int n) {
  const auto bad =
      absl::InternalError("local restore: a malformed verdict from rank 0");
  ASSIGN_OR_RETURN(std::vector<absl::string_view> records,
                   SplitRecords(in, "rank 0's verdict"));
  TryVerdict verdict;
  if (records.size() < 3 || records[0].size() < 5 || records[0][3] != ' ' ||
      !absl::SimpleAtoi(records[0].substr(4), &verdict.failures)) {
    return bad;
  }
  verdict.all_ok = records[0][0] == '1';
  verdict.stuck = records[0][1] == '1';
  verdict.another_sharding = records[0][2] == '1';
  for (absl::string_view r :
       absl::StrSplit(records[1], ',', absl::SkipEmpty())) {
    int rank = 0;
    if (!absl::SimpleAtoi(r, &rank) || rank < 0 || rank >= n) return bad;
    verdict.lost.insert(rank);
  }
  for (absl::string_view pair :
       absl::StrSplit(records[2], ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> both =
        absl::StrSplit(pair, absl::MaxSplits(':', 1));
    int rank = 0, origin = 0;
    if (!absl::SimpleAtoi(both.first, &rank) ||
        !absl::SimpleAtoi(both.second, &origin)) {
      return bad;
    }
    verdict.excluded.insert({rank, origin});
  }
  for (size_t i = 3; i < records.size(); ++i) {
    verdict.notes.emplace_back(records[i]);
  }
  return verdict;
}

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
    // Every part where it was saved: nothing to rebuild, each rank
    // restores from its own (one that fails is lost in the next try).
    absl::StatusOr<bool> gathered =
        lost.empty() ? true : GatherHoldings(tier, attempt, excluded, tag);
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
        lost.empty() ? std::vector<std::vector<int>>(n)
                     : PlanRecovery(attempt.needs, attempt.sources);
    if (!plan.ok()) {
      result.notes.push_back(std::string(plan.status().message()));
      return result;
    }
    attempt.plan = *std::move(plan);
    absl::Status rebuilt =
        lost.empty() ? absl::OkStatus() : Rebuild(tier, attempt);
    absl::StatusOr<RestoreStats> stats = [&]() -> absl::StatusOr<RestoreStats> {
      RETURN_IF_ERROR(rebuilt);
      ASSIGN_OR_RETURN(const std::string dir, tier.own.StepDir(s));
      return restore(dir);
    }();
    // Every rank's outcome, gathered at rank 0, which judges them for
    // everyone (TryVerdict).
    ASSIGN_OR_RETURN(
        std::vector<std::string> results,
        tier.coordinator.Gather(
            tag,
            absl::StrFormat("%d\t%s\t%s",
                            static_cast<int>(stats.status().code()),
                            absl::StrJoin(attempt.bad, ","),
                            stats.ok() ? "" : stats.status().ToString()),
            0));
    TryVerdict verdict;
    if (tier.coordinator.rank() == 0) {
      verdict = JudgeTry(results, attempt, lost, excluded);
    }
    ASSIGN_OR_RETURN(const std::string judged,
                     tier.coordinator.Broadcast(tag + " verdict",
                                                EncodeVerdict(verdict), 0));
    ASSIGN_OR_RETURN(verdict, DecodeVerdict(judged, n));
    lost = verdict.lost;
    excluded = verdict.excluded;
    for (std::string& note : verdict.notes) {
      result.notes.push_back(std::move(note));
    }
    result.another_sharding |= verdict.another_sharding;
    const bool all_ok = verdict.all_ok, stuck = verdict.stuck;
    const int failures = verdict.failures;
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

// What rank 0 makes of every rank's inventory: the newest durable step
// (`step` when asked for, and rank 0 lists it), and the local steps every
// rank's part of which is where it was saved or described by a copy
// (`step` alone when asked for), newest first, each with the ranks whose
// part is not where it was saved.
struct Schedule {
  std::optional<int64_t> newest_durable;
  std::vector<std::pair<int64_t, std::set<int>>> candidates;
};

Schedule ScheduleOf(const std::vector<std::string>& all,
                    std::optional<int64_t> step) {
  const int n = static_cast<int>(all.size());
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
  Schedule schedule;
  for (int64_t s : durable) {
    if (!step || s == *step) {
      schedule.newest_durable =
          std::max(schedule.newest_durable.value_or(s), s);
    }
  }
  for (auto it = seen.rbegin(); it != seen.rend(); ++it) {
    const int64_t s = *it;
    if (step && s != *step) continue;
    std::set<int> lost;
    bool complete = true;
    for (int r = 0; r < n && complete; ++r) {
      if (own[r].contains(s)) continue;
      complete = described.contains({r, s});
      lost.insert(r);
    }
    if (complete) schedule.candidates.emplace_back(s, std::move(lost));
  }
  return schedule;
}

// "D <newest durable step or ->" then "<step> <lost ranks, comma
// separated>" per candidate, a line each.
std::string EncodeSchedule(const Schedule& schedule) {
  std::string out = absl::StrCat("D ",
                                 schedule.newest_durable
                                     ? absl::StrCat(*schedule.newest_durable)
                                     : std::string("-"),
                                 "\n");
  for (const auto& [s, lost] : schedule.candidates) {
    absl::StrAppend(&out, s, " ", absl::StrJoin(lost, ","), "\n");
  }
  return out;
}

absl::StatusOr<Schedule> DecodeSchedule(const std::string& in, int n) {
  const auto bad =
      absl::InternalError("local restore: malformed candidates from rank 0");
  Schedule schedule;
  std::vector<absl::string_view> lines =
      absl::StrSplit(in, '\n', absl::SkipEmpty());
  if (lines.empty() || !absl::StartsWith(lines[0], "D ")) return bad;
  if (lines[0] != "D -") {
    int64_t durable = 0;
    if (!absl::SimpleAtoi(lines[0].substr(2), &durable)) return bad;
    schedule.newest_durable = durable;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> fields =
        absl::StrSplit(lines[i], absl::MaxSplits(' ', 1));
    int64_t s = 0;
    if (!absl::SimpleAtoi(fields.first, &s)) return bad;
    std::set<int> lost;
    for (absl::string_view r :
         absl::StrSplit(fields.second, ',', absl::SkipEmpty())) {
      int rank = 0;
      if (!absl::SimpleAtoi(r, &rank) || rank < 0 || rank >= n) return bad;
      lost.insert(rank);
    }
    schedule.candidates.emplace_back(s, std::move(lost));
  }
  return schedule;
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
      coordinator_.Gather("local restore inventory", inventory, 0));
  // Rank 0 works out the candidates and tells every rank (Schedule).
  ASSIGN_OR_RETURN(
      const std::string sent,
      coordinator_.Broadcast(
          "local restore candidates",
          rank == 0 ? EncodeSchedule(ScheduleOf(all, step)) : std::string(),
          0));
  ASSIGN_OR_RETURN(const Schedule schedule, DecodeSchedule(sent, n));
  const std::optional<int64_t> newest_durable = schedule.newest_durable;
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
  for (const auto& [s, lost] : schedule.candidates) {
    if (newest_durable && *newest_durable >= s) {
      if (!notes.empty()) break;
      return use_durable(absl::StrFormat(
          "it is at least as new as the newest complete local step, %d", s));
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
