// The local tier: see local_tier.h. Parts move between processes through
// Coordinator::Exchange, one file per exchange, straight from the mapped
// file (the coordinator sends it in pieces), and are committed on the
// receiving side as any step is: data files written and fsynced, the
// manifest last, then the directory renamed into place.
#include "hoist/checkpoint/local_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "hoist/base/host_name.h"
#include "hoist/base/status_macros.h"
#include "hoist/checkpoint/save.h"
#include "hoist/format/layout.h"
#include "hoist/manifest.h"

namespace hoist {
namespace {

// A file mapped read-only for sending (no copy: the coordinator copies
// each piece it sends).
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      return absl::NotFoundError(
          absl::StrFormat("%s: %s", path, std::strerror(errno)));
    }
    struct stat st;
    MappedFile file;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::DataLossError(
          absl::StrFormat("%s: not a regular file", path));
    }
    file.size_ = st.st_size;
    if (file.size_ > 0) {
      void* at = mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
      if (at == MAP_FAILED) {
        const int error = errno;
        ::close(fd);
        return absl::InternalError(
            absl::StrFormat("mmap %s: %s", path, std::strerror(error)));
      }
      file.data_ = static_cast<const uint8_t*>(at);
    }
    ::close(fd);
    return file;
  }
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
  }
  absl::Span<const uint8_t> bytes() const {
    return {data_, static_cast<size_t>(size_)};
  }

 private:
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

struct StepFile {
  std::string path;  // relative to the step directory
  int64_t size = 0;
};

// A committed step directory's files: its data files, then its manifest
// (sent last, so that a receiver that dies mid-way leaves no manifest).
absl::StatusOr<std::vector<StepFile>> StepFiles(Storage& storage,
                                                const std::string& dir) {
  std::vector<StepFile> files;
  const std::string data = JoinPath(dir, kDataDirName);
  ASSIGN_OR_RETURN(bool has_data, storage.Exists(data));
  std::vector<std::string> names;
  if (has_data) {
    ASSIGN_OR_RETURN(names, storage.List(data));
  }
  names.push_back("");  // the manifest
  for (const std::string& name : names) {
    const std::string relative =
        name.empty() ? std::string(kManifestFileName)
                     : absl::StrFormat("%s/%s", kDataDirName, name);
    ASSIGN_OR_RETURN(std::unique_ptr<ReadableFile> file,
                     storage.OpenReadableBeneath(dir, relative));
    ASSIGN_OR_RETURN(int64_t size, file->Size());
    files.push_back({relative, size});
  }
  return files;
}

std::string EncodeFiles(int64_t step, const std::vector<StepFile>& files) {
  std::string out = absl::StrFormat("%d\n", step);
  for (const StepFile& file : files) {
    absl::StrAppendFormat(&out, "%s\t%d\n", file.path, file.size);
  }
  return out;
}

// A header EncodeFiles made on another rank; checked as anything read.
absl::StatusOr<std::vector<StepFile>> DecodeFiles(absl::string_view text,
                                                  int64_t step, int from) {
  std::vector<StepFile> files;
  if (text.empty()) return files;  // it sends nothing
  const auto bad = [&](std::string_view why) {
    return absl::DataLossError(absl::StrFormat(
        "the part of step %d rank %d sent: %s", step, from, why));
  };
  std::vector<absl::string_view> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  int64_t sent_step = -1;
  if (lines.empty() || !absl::SimpleAtoi(lines[0], &sent_step) ||
      sent_step != step) {
    return bad("it is of another step");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<absl::string_view> fields = absl::StrSplit(lines[i], '\t');
    StepFile file;
    if (fields.size() != 2 || !absl::SimpleAtoi(fields[1], &file.size) ||
        file.size < 0) {
      return bad(absl::StrFormat("line %d is not 'path<TAB>size'", i + 1));
    }
    file.path = std::string(fields[0]);
    const bool data_file =
        absl::StartsWith(file.path, std::string(kDataDirName) + "/") &&
        file.path.find('/', sizeof kDataDirName) == std::string::npos;
    if (!IsSafeRelativePath(file.path) ||
        (!data_file && file.path != kManifestFileName)) {
      return bad(absl::StrFormat("'%s' is not a file of a step", file.path));
    }
    files.push_back(std::move(file));
  }
  if (files.empty() || files.back().path != kManifestFileName) {
    return bad("it does not end with its manifest");
  }
  return files;
}

// "<tag> <rank> <step>,<step>,..." lines: what one rank holds.
void AppendSteps(std::string& out, std::string_view tag, int rank,
                 const std::vector<int64_t>& steps) {
  absl::StrAppendFormat(&out, "%s %d %s\n", tag, rank,
                        absl::StrJoin(steps, ","));
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
  return std::unique_ptr<LocalTier>(new LocalTier(coordinator, storage,
                                                  std::move(own), offsets,
                                                  std::move(kept), keep_last));
}

LocalTier::LocalTier(Coordinator& coordinator, Storage& storage,
                     std::unique_ptr<CheckpointRoot> own,
                     std::vector<int> offsets,
                     std::map<int, std::unique_ptr<CheckpointRoot>> kept,
                     int keep_last)
    : coordinator_(coordinator),
      storage_(storage),
      own_(std::move(own)),
      offsets_(std::move(offsets)),
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

absl::Status LocalTier::Shift(const std::string& name, int64_t step, int offset,
                              const std::string& send_dir, CheckpointRoot* into,
                              int64_t* sent, int64_t* received) {
  const int n = coordinator_.size(), rank = coordinator_.rank();
  const int to = (rank + offset) % n, from = (rank - offset + n) % n;
  absl::Status first;  // this rank's first error; the shift goes on
  std::vector<StepFile> files;
  if (!send_dir.empty()) {
    absl::StatusOr<std::vector<StepFile>> listed =
        StepFiles(storage_, send_dir);
    if (listed.ok()) {
      files = *std::move(listed);
    } else {
      first = listed.status();
    }
  }
  // Every rank makes as many exchanges as the rank sending the most files.
  ASSIGN_OR_RETURN(std::vector<std::string> counts,
                   coordinator_.AllGather(name + " files",
                                          absl::StrFormat("%d", files.size())));
  size_t rounds = 0;
  for (const std::string& count : counts) {
    size_t c = 0;
    if (absl::SimpleAtoi(count, &c)) rounds = std::max(rounds, c);
  }
  const std::string header = files.empty() ? "" : EncodeFiles(step, files);
  std::string their_header;
  RETURN_IF_ERROR(coordinator_.Exchange(
      name + " header",
      {reinterpret_cast<const uint8_t*>(header.data()), header.size()}, to,
      from, [&](absl::Span<const uint8_t> piece) {
        their_header.append(reinterpret_cast<const char*>(piece.data()),
                            piece.size());
        return absl::OkStatus();
      }));
  std::vector<StepFile> theirs;
  if (absl::StatusOr<std::vector<StepFile>> decoded =
          DecodeFiles(their_header, step, from);
      decoded.ok()) {
    theirs = *std::move(decoded);
  } else if (first.ok()) {
    first = decoded.status();
  }
  if (!theirs.empty() && into == nullptr && first.ok()) {
    first = absl::InternalError(absl::StrFormat(
        "rank %d sent a part of step %d that nothing here takes", from, step));
  }
  std::string tmp;
  if (!theirs.empty() && into != nullptr && first.ok()) {
    tmp = JoinPath(into->path(), TmpStepDirName(step));
    first = storage_.CreateDir(tmp);
    if (first.ok()) first = storage_.CreateDir(JoinPath(tmp, kDataDirName));
  }
  for (size_t i = 0; i < rounds; ++i) {
    MappedFile mapped;
    if (i < files.size()) {
      absl::StatusOr<MappedFile> m =
          MappedFile::Open(JoinPath(send_dir, files[i].path));
      if (m.ok()) {
        mapped = *std::move(m);
      } else if (first.ok()) {
        first = m.status();  // sends nothing: its receiver sees a short file
      }
    }
    std::unique_ptr<WritableFile> out;
    if (i < theirs.size() && !tmp.empty() && first.ok()) {
      absl::StatusOr<std::unique_ptr<WritableFile>> opened =
          storage_.OpenWritable(JoinPath(tmp, theirs[i].path));
      if (opened.ok()) {
        out = *std::move(opened);
      } else {
        first = opened.status();
      }
    }
    if (sent != nullptr) *sent += static_cast<int64_t>(mapped.bytes().size());
    int64_t at = 0;
    // The receiver never fails the exchange: the sender must not be left
    // mid-send, so a write's error is kept and the rest dropped.
    RETURN_IF_ERROR(coordinator_.Exchange(
        absl::StrFormat("%s file %d", name, i), mapped.bytes(), to, from,
        [&](absl::Span<const uint8_t> piece) {
          if (out == nullptr) return absl::OkStatus();
          absl::Status written = out->WriteAt(at, piece);
          at += static_cast<int64_t>(piece.size());
          if (!written.ok()) {
            if (first.ok()) first = written;
            out.reset();
          }
          return absl::OkStatus();
        }));
    if (received != nullptr) *received += at;
    if (out != nullptr) {
      if (at != theirs[i].size) {
        first = absl::DataLossError(absl::StrFormat(
            "%s of step %d from rank %d: %d of its %d bytes arrived",
            theirs[i].path, step, from, at, theirs[i].size));
      }
      if (first.ok()) first = out->Sync();
      if (absl::Status closed = out->Close(); first.ok()) first = closed;
    }
  }
  if (tmp.empty()) return first;
  if (first.ok()) first = storage_.SyncDir(JoinPath(tmp, kDataDirName));
  if (first.ok()) first = storage_.SyncDir(tmp);
  if (first.ok()) {
    first = PublishStep(storage_, into->path(), step, tmp, /*overwrite=*/true);
  }
  if (!first.ok()) storage_.RemoveAll(tmp).IgnoreError();
  return first;
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
  absl::Status first;
  const std::string dir = own_->StepDir(step).value_or("");
  const int n = coordinator_.size();
  for (int d : offsets_) {
    const int origin = (coordinator_.rank() - d + n) % n;
    absl::Status shifted =
        Shift(absl::StrFormat("local step %d +%d", step, d), step, d, dir,
              kept_.at(origin).get(), sent_bytes);
    if (first.ok()) first = shifted;
  }
  if (absl::Status pruned = Prune(*own_); first.ok()) first = pruned;
  for (const auto& [origin, root] : kept_) {
    if (absl::Status pruned = Prune(*root); first.ok()) first = pruned;
  }
  return first;
}

absl::StatusOr<LocalTier::Outcome> LocalTier::Restore(
    std::optional<int64_t> step, const std::vector<int64_t>& durable_steps,
    const std::function<absl::StatusOr<RestoreStats>(const std::string&)>&
        restore) {
  const int n = coordinator_.size(), rank = coordinator_.rank();
  // 1. What every rank holds.
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
  std::map<std::pair<int, int64_t>, std::vector<int>>
      holders;  // (origin, step)
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
          holders[{origin, at}].push_back(p);
          seen.insert(at);
        }
      }
    }
  }
  // Where each rank's part of `s` can come from: itself, then its holders
  // nearest first.
  const auto sources = [&](int64_t s) {
    std::vector<std::vector<int>> from(n);
    for (int r = 0; r < n; ++r) {
      if (own[r].contains(s)) from[r].push_back(r);
      auto it = holders.find({r, s});
      if (it == holders.end()) continue;
      std::vector<int> h = it->second;
      std::sort(h.begin(), h.end(), [&](int a, int b) {
        return (a - r + n) % n < (b - r + n) % n;
      });
      from[r].insert(from[r].end(), h.begin(), h.end());
    }
    return from;
  };
  const auto complete = [&](int64_t s) {
    for (const std::vector<int>& f : sources(s)) {
      if (f.empty()) return false;
    }
    return true;
  };
  std::optional<int64_t> local;
  for (auto it = seen.rbegin(); it != seen.rend() && !local; ++it) {
    if ((!step || *it == *step) && complete(*it)) local = *it;
  }
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
  if (!local) return use_durable("no local step has every rank's part");
  if (newest_durable && *newest_durable >= *local) {
    return use_durable(absl::StrFormat(
        "it is at least as new as the newest complete local step, %d", *local));
  }
  // 2. Each rank's part from its next source until every rank restores.
  const int64_t s = *local;
  const std::vector<std::vector<int>> from = sources(s);
  std::vector<size_t> cursor(n, 0);
  std::vector<std::string> notes;
  for (int attempt = 0;; ++attempt) {
    std::set<int> offsets;
    for (int r = 0; r < n; ++r) {
      if (from[r][cursor[r]] != r)
        offsets.insert((r - from[r][cursor[r]] + n) % n);
    }
    absl::Status mine;
    for (int d : offsets) {
      const int to = (rank + d) % n, back = (rank - d + n) % n;
      std::string send;
      if (from[to][cursor[to]] == rank && to != rank) {
        send = kept_.at(to)->StepDir(s).value_or("");
      }
      const bool receives = from[rank][cursor[rank]] == back && back != rank;
      absl::Status shifted =
          Shift(absl::StrFormat("local restore %d try %d +%d", s, attempt, d),
                s, d, send, receives ? own_.get() : nullptr, nullptr,
                &outcome.received_bytes);
      if (receives && mine.ok()) mine = shifted;
    }
    absl::StatusOr<RestoreStats> stats = [&]() -> absl::StatusOr<RestoreStats> {
      RETURN_IF_ERROR(mine);
      ASSIGN_OR_RETURN(const std::string dir, own_->StepDir(s));
      return restore(dir);
    }();
    ASSIGN_OR_RETURN(
        std::vector<std::string> results,
        coordinator_.AllGather(
            absl::StrFormat("local restore %d try %d", s, attempt),
            stats.ok() ? ""
                       : absl::StrFormat(
                             "%d %s", static_cast<int>(stats.status().code()),
                             stats.status().ToString())));
    bool all_ok = true, give_up = false;
    for (int r = 0; r < n; ++r) {
      if (results[r].empty()) continue;
      all_ok = false;
      int code = 0;
      if (!absl::SimpleAtoi(results[r].substr(0, results[r].find(' ')),
                            &code)) {
        code = static_cast<int>(absl::StatusCode::kUnknown);
      }
      notes.push_back(absl::StrFormat(
          "rank %d's part from rank %d: %s", r, from[r][cursor[r]],
          results[r].substr(results[r].find(' ') + 1)));
      if (static_cast<absl::StatusCode>(code) ==
              absl::StatusCode::kFailedPrecondition ||
          ++cursor[r] >= from[r].size()) {
        give_up = true;
      }
    }
    if (all_ok) {
      std::vector<std::string> used;
      for (int r = 0; r < n; ++r) {
        if (from[r][cursor[r]] != r) {
          used.push_back(absl::StrFormat(
              "rank %d's part from rank %d's replica", r, from[r][cursor[r]]));
        }
      }
      outcome.stats = *std::move(stats);
      outcome.step = s;
      outcome.note = absl::StrFormat(
          "local step %d%s%s%s", s, used.empty() ? "" : ": ",
          absl::StrJoin(used, "; "),
          notes.empty() ? "" : " (after: " + absl::StrJoin(notes, "; ") + ")");
      return outcome;
    }
    if (give_up) {
      return use_durable(
          absl::StrFormat("local step %d could not be restored: %s", s,
                          absl::StrJoin(notes, "; ")));
    }
  }
}

}  // namespace hoist
