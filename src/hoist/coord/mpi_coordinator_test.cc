// Runs under mpirun (see CMakeLists.txt: 1, 2 and 4 ranks): every rank runs
// every test; a failure on any rank fails the run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "hoist/coord/launch.h"
#include "hoist/coordinator.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Coordinator> Make(absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<Coordinator>> c =
      MakeMpiCoordinator({.timeout = timeout});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(MpiCoordinatorTest, RanksAgreeWithMpi) {
  auto c = Make(absl::Seconds(60));
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(c->rank(), rank);
  EXPECT_EQ(c->size(), size);
  EXPECT_EQ(LaunchedByMpiWithSeveralRanks(), size > 1);
}

TEST(MpiCoordinatorTest, AllGatherBroadcastAndBarrier) {
  auto c = Make(absl::Seconds(60));
  for (int round = 0; round < 3; ++round) {
    // Sizes differ by rank, including empty contributions.
    const std::string mine(c->rank() * 1000 + round,
                           static_cast<char>('a' + c->rank()));
    absl::StatusOr<std::vector<std::string>> all = c->AllGather("gather", mine);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(static_cast<int>(all->size()), c->size());
    for (int r = 0; r < c->size(); ++r) {
      EXPECT_EQ((*all)[r],
                std::string(r * 1000 + round, static_cast<char>('a' + r)));
    }
    const int root = c->size() - 1;
    absl::StatusOr<std::string> got = c->Broadcast(
        "bcast", c->rank() == root ? "from the last rank" : "ignored", root);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, "from the last rank");
    EXPECT_TRUE(c->Barrier("barrier").ok());
  }
  EXPECT_EQ(c->Broadcast("bad", "", c->size()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MpiCoordinatorTest, GatherReachesOnlyItsRootAndTrafficIsCounted) {
  auto c = Make(absl::Seconds(60));
  for (int root : {0, c->size() - 1}) {
    const Coordinator::Traffic before = c->traffic();
    const std::string mine(100 + c->rank(), static_cast<char>('a' + c->rank()));
    absl::StatusOr<std::vector<std::string>> got = c->Gather("g", mine, root);
    ASSERT_TRUE(got.ok()) << got.status();
    const Coordinator::Traffic after = c->traffic();
    if (c->rank() != root) {
      EXPECT_TRUE(got->empty());
    } else {
      ASSERT_EQ(static_cast<int>(got->size()), c->size());
      for (int r = 0; r < c->size(); ++r) {
        EXPECT_EQ((*got)[r], std::string(100 + r, static_cast<char>('a' + r)));
      }
    }
    if (c->size() == 1) continue;
    // Every rank but 0 sends its request and receives one answer: every
    // rank's bytes only when it is the root, else a few bytes.
    const int64_t received = after.bytes_received - before.bytes_received;
    if (c->rank() != 0) {
      EXPECT_EQ(after.messages_sent - before.messages_sent, 1);
      EXPECT_EQ(after.messages_received - before.messages_received, 1);
      EXPECT_GE(after.bytes_sent - before.bytes_sent, 100 + c->rank());
      if (c->rank() == root) {
        EXPECT_GE(received, 100 * c->size());
      } else {
        EXPECT_LT(received, 16);
      }
    } else {
      EXPECT_EQ(after.messages_received - before.messages_received,
                c->size() - 1);
    }
  }
  EXPECT_EQ(c->Gather("bad", "", c->size()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MpiCoordinatorTest, ScatterGivesEachRankItsOwnPiece) {
  auto c = Make(absl::Seconds(60));
  for (int root : {0, c->size() - 1}) {
    std::vector<std::string> pieces;
    if (c->rank() == root) {
      for (int r = 0; r < c->size(); ++r) {
        pieces.push_back(std::string(10 * r, static_cast<char>('a' + r)));
      }
    }
    const Coordinator::Traffic before = c->traffic();
    absl::StatusOr<std::string> got = c->Scatter("s", pieces, root);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got,
              std::string(10 * c->rank(), static_cast<char>('a' + c->rank())));
    // A rank other than 0 receives its piece alone.
    if (c->rank() != 0) {
      EXPECT_LT(c->traffic().bytes_received - before.bytes_received,
                10 * c->rank() + 16);
    }
  }
  // On the root, pieces must be one per rank; the others learn why.
  absl::StatusOr<std::string> wrong =
      c->Scatter("wrong", std::vector<std::string>(c->size() + 1), 0);
  EXPECT_FALSE(wrong.ok());
  if (c->rank() == 0) {
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(c->Barrier("after").ok());
}

TEST(MpiCoordinatorTest, RanksCallingDifferentOperationsAllFailNamingTheRank) {
  auto c = Make(absl::Seconds(60));
  if (c->size() < 2) GTEST_SKIP() << "needs two ranks";
  absl::Status s = c->Barrier(c->rank() == 1 ? "other" : "barrier");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("rank 1 called Barrier('other'"));
  EXPECT_THAT(s.message(), HasSubstr("rank 0 called Barrier('barrier'"));
  EXPECT_TRUE(c->Barrier("after").ok());  // the coordinator goes on
}

TEST(MpiCoordinatorTest, HungRankTimesOutNamedAndTheOthersGoOn) {
  auto quick = Make(absl::Seconds(1));
  auto patient = Make(absl::Seconds(60));
  if (quick->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int late = quick->size() - 1;
  // The late rank arrives only once the others have given up on it (they
  // say so on the patient coordinator).
  absl::Status s;
  if (quick->rank() == late) {
    ASSERT_TRUE(patient->Barrier("the others gave up").ok());
    s = quick->Barrier("written");
  } else {
    s = quick->Barrier("written");
    ASSERT_TRUE(patient->Barrier("the others gave up").ok());
  }
  ASSERT_FALSE(s.ok());
  if (quick->rank() == late) {
    // Rank 0 gave up before this rank arrived: no answer ever comes.
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 0 did not answer"));
  } else {
    EXPECT_THAT(s.message(), HasSubstr(absl::StrFormat(
                                 "'written': rank %d did not arrive", late)));
    EXPECT_EQ(s.code(), quick->rank() == 0 ? absl::StatusCode::kDeadlineExceeded
                                           : absl::StatusCode::kAborted)
        << s;
  }
  ASSERT_TRUE(patient->Barrier("resync").ok());
  // The late request stays behind under its own tag; the next operation is
  // unaffected.
  absl::StatusOr<std::vector<std::string>> all =
      quick->AllGather("next", std::to_string(quick->rank()));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)[late], std::to_string(late));
}

// What rank `rank` sends in ExchangeTest: `bytes` of a pattern of its own.
std::vector<uint8_t> Pattern(int rank, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    out[i] = static_cast<uint8_t>(i * 7 + rank * 13 + (i >> 20));
  }
  return out;
}

TEST(MpiCoordinatorTest, ExchangeShiftsEveryRanksDataInPieces) {
  auto c = Make(absl::Seconds(60));
  const int n = c->size(), r = c->rank();
  // Over one 64 MiB piece, and a different size per rank.
  const auto size_of = [](int rank) {
    return (size_t{64} << 20) + 12345 + rank * 1000;
  };
  const std::vector<uint8_t> mine = Pattern(r, size_of(r));
  const int to = (r + 1) % n, from = (r + n - 1) % n;
  std::vector<uint8_t> got;
  size_t pieces = 0;
  absl::Status s =
      c->Exchange("replicate", mine, to, from,
                  [&](absl::Span<const uint8_t> piece) -> absl::Status {
                    EXPECT_LE(piece.size(), size_t{64} << 20);
                    got.insert(got.end(), piece.begin(), piece.end());
                    ++pieces;
                    return absl::OkStatus();
                  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(pieces, 2u);
  EXPECT_TRUE(got == Pattern(from, size_of(from))) << "from rank " << from;
  // The coordinator's other operations go on, in order.
  EXPECT_TRUE(c->Barrier("after the exchange").ok());
}

TEST(MpiCoordinatorTest, GatheredExchangeSendsTheConcatenationOfItsPieces) {
  auto c = Make(absl::Seconds(60));
  const int n = c->size(), r = c->rank();
  // Pieces of uneven sizes, an empty one among them, crossing the 64 MiB
  // boundary of the coordinator's own pieces.
  const std::vector<uint8_t> whole = Pattern(r, (size_t{64} << 20) + 5000);
  const absl::Span<const uint8_t> all(whole);
  const std::vector<absl::Span<const uint8_t>> pieces = {
      all.subspan(0, 3), all.subspan(3, 0), all.subspan(3, (size_t{64} << 20)),
      all.subspan(3 + (size_t{64} << 20))};
  const int to = (r + 1) % n, from = (r + n - 1) % n;
  std::vector<uint8_t> got;
  absl::Status s =
      c->ExchangeGathered("gathered", pieces, to, from,
                          [&](absl::Span<const uint8_t> piece) -> absl::Status {
                            got.insert(got.end(), piece.begin(), piece.end());
                            return absl::OkStatus();
                          });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(got == Pattern(from, whole.size())) << "from rank " << from;
}

TEST(MpiCoordinatorTest, ExchangeOfNothingAndWithItselfAndBadRanks) {
  auto c = Make(absl::Seconds(60));
  size_t calls = 0;
  const auto count = [&](absl::Span<const uint8_t>) {
    ++calls;
    return absl::OkStatus();
  };
  const int r = c->rank(), n = c->size();
  ASSERT_TRUE(
      c->Exchange("nothing", {}, (r + 1) % n, (r + n - 1) % n, count).ok());
  EXPECT_EQ(calls, 0u);
  const std::vector<uint8_t> mine = Pattern(r, 1000);
  std::vector<uint8_t> got;
  ASSERT_TRUE(
      c->Exchange("itself", mine, r, r, [&](absl::Span<const uint8_t> piece) {
         got.assign(piece.begin(), piece.end());
         return absl::OkStatus();
       }).ok());
  EXPECT_EQ(got, mine);
  EXPECT_EQ(c->Exchange("bad", mine, n, 0, count).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MpiCoordinatorTest, ExchangeUnderAnotherNameOrAFailingReceiverFails) {
  auto c = Make(absl::Seconds(60));
  if (c->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int n = c->size(), r = c->rank();
  const int to = (r + 1) % n, from = (r + n - 1) % n;
  const std::vector<uint8_t> mine = Pattern(r, 100);
  const auto keep = [](absl::Span<const uint8_t>) { return absl::OkStatus(); };
  absl::Status s =
      c->Exchange(r == 1 ? "other" : "replicate", mine, to, from, keep);
  if (from == 1) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 1 sent exchange 'other'"));
  } else if (r == 1) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  } else {
    EXPECT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE(c->Barrier("after the mismatch").ok());
  s = c->Exchange("refused", mine, to, from, [](absl::Span<const uint8_t>) {
    return absl::DataLossError("the replica's disk is full");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE(c->Barrier("after the refusal").ok());
}

TEST(MpiCoordinatorTest, ExchangeWithAPeerThatNeverComesTimesOutNamingIt) {
  auto quick = Make(absl::Seconds(1));
  auto patient = Make(absl::Seconds(60));
  if (quick->size() < 2) GTEST_SKIP() << "needs two ranks";
  const int n = quick->size(), r = quick->rank(), late = n - 1;
  const int to = (r + 1) % n, from = (r + n - 1) % n;
  if (r != late) {
    const std::vector<uint8_t> mine = Pattern(r, 100);
    absl::Status s = quick->Exchange(
        "replicate", mine, to, from,
        [](absl::Span<const uint8_t>) { return absl::OkStatus(); });
    if (from == late) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_THAT(s.message(),
                  HasSubstr(absl::StrFormat("and %d (from) within 1s", late)));
    }
  }
  // `quick` is out of step now (the late rank never made that call).
  EXPECT_TRUE(patient->Barrier("after the timeout").ok());
}

}  // namespace
}  // namespace hoist
