// The local tier's replication and recovery plans (replica_plan.h), on
// parts shaped as a data x model job's are.
#include "hoist/checkpoint/tier/replica_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Rank p of a data x model job with `model` model shards holds shard
// p % model of each of `arrays` arrays: ranks p and p + model are
// data-parallel replicas.
std::vector<std::vector<PartExtent>> DataByModel(int data, int model,
                                                 int arrays = 2) {
  std::vector<std::vector<PartExtent>> parts(data * model);
  for (int p = 0; p < data * model; ++p) {
    for (int a = 0; a < arrays; ++a) {
      parts[p].push_back(
          {absl::StrFormat("array %d shard %d", a, p % model), 1000 + a});
    }
  }
  return parts;
}

int64_t SentBytes(const std::vector<std::vector<PartExtent>>& parts,
                  const std::vector<ReplicationSends>& sends) {
  int64_t bytes = 0;
  for (size_t p = 0; p < sends.size(); ++p) {
    for (const auto& [d, indices] : sends[p]) {
      for (int i : indices) bytes += parts[p][i].length_bytes;
    }
  }
  return bytes;
}

TEST(PlanReplication, DataParallelReplicasAreNotSentOnOneHost) {
  const auto parts = DataByModel(2, 2);
  const std::vector<std::string> hosts(4, "h");
  const std::vector<ReplicationSends> sends =
      PlanReplication(parts, hosts, {1}, 2);
  EXPECT_EQ(SentBytes(parts, sends), 0);
}

TEST(PlanReplication, AModelParallelJobSendsEveryExtentOnce) {
  const auto parts = DataByModel(1, 4);
  const std::vector<ReplicationSends> sends =
      PlanReplication(parts, std::vector<std::string>(4, "h"), {1}, 2);
  for (int p = 0; p < 4; ++p) {
    ASSERT_EQ(sends[p].size(), 1u);
    EXPECT_THAT(sends[p].at(1), ElementsAre(0, 1)) << p;
  }
}

TEST(PlanReplication, MoreReplicasThanDataParallelSendsTheDifference) {
  // Each extent has 2 holders; 3 wanted: one copy each, spread so that
  // each pair of replicas sends half.
  const auto parts = DataByModel(2, 2);
  const std::vector<ReplicationSends> sends =
      PlanReplication(parts, std::vector<std::string>(4, "h"), {1, 2}, 3);
  EXPECT_EQ(SentBytes(parts, sends), 2 * (1000 + 1001));
  for (int p = 0; p < 4; ++p) {
    int64_t bytes = 0;
    for (const auto& [d, indices] : sends[p]) {
      for (int i : indices) bytes += parts[p][i].length_bytes;
      // Never to a rank that holds it: p + 2 is p's data-parallel replica.
      EXPECT_NE(d, 2);
    }
    EXPECT_LE(bytes, 1001) << p;
  }
}

TEST(PlanReplication, AcrossHostsOnlyHoldersOnOtherHostsCount) {
  // Replicas 0 and 2 share host a, 1 and 3 host b (model shards 0 and 1):
  // each extent is on one host, so one copy goes to the other host.
  const auto parts = DataByModel(2, 2);
  const std::vector<std::string> hosts = {"a", "b", "a", "b"};
  const std::vector<ReplicationSends> sends =
      PlanReplication(parts, hosts, {1, 3}, 2);
  EXPECT_EQ(SentBytes(parts, sends), 2 * (1000 + 1001));
  // With the replicas on two hosts, nothing.
  const std::vector<std::string> spread = {"a", "a", "b", "b"};
  EXPECT_EQ(SentBytes(parts, PlanReplication(parts, spread, {2, 1}, 2)), 0);
}

TEST(PlanReplication, OneReplicaSendsNothing) {
  const auto parts = DataByModel(1, 4);
  EXPECT_EQ(
      SentBytes(parts, PlanReplication(parts, std::vector<std::string>(4, "h"),
                                       {}, 1)),
      0);
}

TEST(PlanRecovery, ALostPartComesFromItsReplicaAndCopies) {
  // Rank 1 lost its part; rank 3 holds the same shard in its own part,
  // rank 2 a copy of its second extent.
  const auto parts = DataByModel(2, 2);
  std::vector<ExtentSource> sources = {{0, 0, parts[0]},
                                       {2, 2, parts[2]},
                                       {3, 3, parts[3]},
                                       {2, 1, {parts[1][1]}}};
  std::vector<std::vector<PartExtent>> needs(4);
  needs[1] = parts[1];
  absl::StatusOr<std::vector<std::vector<int>>> plan =
      PlanRecovery(needs, sources);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT((*plan)[0], IsEmpty());
  // Spread: rank 3's own part serves the first (only it has it), the copy
  // at rank 2 the second (rank 3 already serves more).
  EXPECT_THAT((*plan)[1], ElementsAre(2, 3));
}

TEST(PlanRecovery, AnExtentNoOtherProcessHoldsIsNamed) {
  const auto parts = DataByModel(1, 2);
  std::vector<ExtentSource> sources = {{0, 0, parts[0]},
                                       {1, 1, parts[1]}};  // its own: lost
  std::vector<std::vector<PartExtent>> needs = {{}, parts[1]};
  absl::StatusOr<std::vector<std::vector<int>>> plan =
      PlanRecovery(needs, sources);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("rank 1's extent 1 of 2 (array 0 shard 1)"));
}

TEST(PartExtents, EncodeDecodeRoundTripsAnyBytes) {
  const std::vector<PartExtent> extents = {
      {std::string("a\n3:b\0c", 7), 4096}, {"", 0}, {"plain", 12}};
  absl::StatusOr<std::vector<PartExtent>> back =
      DecodePartExtents(EncodePartExtents(extents), "test");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, extents);
  for (const char* bad : {"", "2\n1 1:a", "1\n1 9:a", "1\nx 1:a", "0\nz"}) {
    EXPECT_EQ(DecodePartExtents(bad, "test").status().code(),
              absl::StatusCode::kDataLoss)
        << bad;
  }
}

}  // namespace
}  // namespace hoist
