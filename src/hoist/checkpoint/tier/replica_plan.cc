// Replication and recovery plans of the local tier: see replica_plan.h.
#include "hoist/checkpoint/tier/replica_plan.h"

#include <algorithm>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hoist/format/extent_hash.h"

namespace hoist {

std::string ExtentKey(const ManifestArray& array,
                      const ManifestExtent& extent) {
  // The name is length-prefixed: any byte may be in it.
  return absl::StrCat(array.name.size(), ":", array.name, " ",
                      extent.box.ToString(), " ", extent.length_bytes, " ",
                      FormatExtentHash(extent.hash));
}

std::vector<PartExtent> PartExtents(const Manifest& manifest) {
  std::vector<PartExtent> out;
  for (const ManifestArray& array : manifest.arrays) {
    for (const ManifestExtent& extent : array.extents) {
      out.push_back({ExtentKey(array, extent), extent.length_bytes});
    }
  }
  return out;
}

// "<count>\n" then "<length> <key size>:<key>" per extent.
std::string EncodePartExtents(const std::vector<PartExtent>& extents) {
  std::string out = absl::StrCat(extents.size(), "\n");
  for (const PartExtent& extent : extents) {
    absl::StrAppend(&out, extent.length_bytes, " ", extent.key.size(), ":",
                    extent.key);
  }
  return out;
}

absl::StatusOr<std::vector<PartExtent>> DecodePartExtents(
    absl::string_view text, absl::string_view what) {
  const auto bad = [&] {
    return absl::DataLossError(
        absl::StrFormat("%s: not a list of extents", what));
  };
  // Reads digits up to `end`, and skips it.
  const auto number = [&](char end, int64_t& value) {
    const size_t at = text.find(end);
    if (at == absl::string_view::npos ||
        !absl::SimpleAtoi(text.substr(0, at), &value) || value < 0) {
      return false;
    }
    text.remove_prefix(at + 1);
    return true;
  };
  int64_t count = 0;
  if (!number('\n', count) || count > static_cast<int64_t>(text.size())) {
    return bad();
  }
  std::vector<PartExtent> out(count);
  for (PartExtent& extent : out) {
    int64_t key_bytes = 0;
    if (!number(' ', extent.length_bytes) || !number(':', key_bytes) ||
        key_bytes > static_cast<int64_t>(text.size())) {
      return bad();
    }
    extent.key = std::string(text.substr(0, key_bytes));
    text.remove_prefix(key_bytes);
  }
  if (!text.empty()) return bad();
  return out;
}

std::vector<ReplicationSends> PlanReplication(
    const std::vector<std::vector<PartExtent>>& parts,
    const std::vector<std::string>& hosts, const std::vector<int>& offsets,
    int replicas) {
  const int n = static_cast<int>(parts.size());
  const bool across_hosts =
      std::set<std::string>(hosts.begin(), hosts.end()).size() > 1;
  // Every key's holders, and where in each holder's part it is; keys in
  // the order of first appearance (rank 0's part first), which every rank
  // sees alike.
  struct Held {
    std::vector<std::pair<int, int>> at;  // (rank, index in its part)
    int64_t length_bytes = 0;
  };
  absl::flat_hash_map<absl::string_view, size_t> index;
  std::vector<Held> keys;
  for (int p = 0; p < n; ++p) {
    for (size_t i = 0; i < parts[p].size(); ++i) {
      auto [it, added] = index.try_emplace(parts[p][i].key, keys.size());
      if (added) keys.push_back({{}, parts[p][i].length_bytes});
      Held& held = keys[it->second];
      // A key twice in one part (no part has that) counts once.
      if (held.at.empty() || held.at.back().first != p) {
        held.at.push_back({p, static_cast<int>(i)});
      }
    }
  }
  std::vector<ReplicationSends> sends(n);
  std::vector<int64_t> load(n, 0);
  for (const Held& held : keys) {
    std::set<int> holders;
    std::set<std::string> counted_hosts;
    for (const auto& [p, i] : held.at) {
      holders.insert(p);
      counted_hosts.insert(hosts[p]);
    }
    const auto count = [&] {
      return static_cast<int>(across_hosts ? counted_hosts.size()
                                           : holders.size());
    };
    if (count() >= replicas) continue;
    // The holder with the least to send so far (the lowest rank on a tie).
    const auto sender = *std::min_element(
        held.at.begin(), held.at.end(), [&](const auto& a, const auto& b) {
          return std::pair(load[a.first], a.first) <
                 std::pair(load[b.first], b.first);
        });
    for (int d : offsets) {
      if (count() >= replicas) break;
      const int to = (sender.first + d) % n;
      if (holders.contains(to) ||
          (across_hosts && counted_hosts.contains(hosts[to]))) {
        continue;
      }
      sends[sender.first][d].push_back(sender.second);
      load[sender.first] += held.length_bytes;
      holders.insert(to);
      counted_hosts.insert(hosts[to]);
    }
  }
  for (ReplicationSends& by_offset : sends) {
    for (auto& [d, indices] : by_offset)
      std::sort(indices.begin(), indices.end());
  }
  return sends;
}

absl::StatusOr<std::vector<std::vector<int>>> PlanRecovery(
    const std::vector<std::vector<PartExtent>>& needs,
    const std::vector<ExtentSource>& sources) {
  // Each key's sources, own parts first, then by rank.
  std::vector<int> order(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) order[s] = static_cast<int>(s);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const auto rank = [&](int s) {
      return std::pair(sources[s].rank != sources[s].origin, sources[s].rank);
    };
    return rank(a) < rank(b);
  });
  absl::flat_hash_map<absl::string_view, std::vector<int>> having;
  for (int s : order) {
    for (const PartExtent& extent : sources[s].extents) {
      std::vector<int>& list = having[extent.key];
      if (list.empty() || list.back() != s) list.push_back(s);
    }
  }
  std::map<int, int64_t> load;  // bytes each rank serves
  std::vector<std::vector<int>> plan(needs.size());
  for (size_t r = 0; r < needs.size(); ++r) {
    for (size_t i = 0; i < needs[r].size(); ++i) {
      const PartExtent& extent = needs[r][i];
      int best = -1;
      if (auto it = having.find(extent.key); it != having.end()) {
        for (int s : it->second) {
          if (sources[s].rank == static_cast<int>(r)) continue;
          if (best < 0 || load[sources[s].rank] < load[sources[best].rank]) {
            best = s;
          }
        }
      }
      if (best < 0) {
        return absl::NotFoundError(absl::StrFormat(
            "rank %d's extent %d of %d (%s) is held by no other process", r,
            i + 1, needs[r].size(), extent.key));
      }
      load[sources[best].rank] += extent.length_bytes;
      plan[r].push_back(best);
    }
  }
  return plan;
}

}  // namespace hoist
