// The object-store Storage against real servers (SeaweedFS for S3,
// fake-gcs-server for GCS, started once for this binary on 127.0.0.1): the
// shared conformance suite (testing/storage_conformance.h), then what an
// object store does differently from a filesystem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "hoist/storage.h"
#include "testing/object_store_server.h"
#include "testing/storage_conformance.h"

namespace hoist {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ObjectStoreServer;
using testing::StorageBackend;
using testing::StorageConformanceTest;
using testing::StorageSubject;

// A fresh prefix on the server of `kind`.
std::function<void(StorageSubject&)> OnServer(ObjectStoreServer::Kind kind) {
  return [kind](StorageSubject& s) {
    HOIST_REQUIRE_SERVERS();
    ObjectStoreServer* server = testing::TheServers().Of(kind);
    absl::StatusOr<std::unique_ptr<Storage>> storage =
        testing::OpenObjectStorage(server->Url(""));
    ASSERT_TRUE(storage.ok()) << storage.status();
    s.storage = *std::move(storage);
    s.root = server->Url(testing::UniquePrefix("conformance"));
  };
}

INSTANTIATE_TEST_SUITE_P(
    ObjectStores, StorageConformanceTest,
    ::testing::Values(
        StorageBackend{"S3", OnServer(ObjectStoreServer::Kind::kS3)},
        StorageBackend{"GCS", OnServer(ObjectStoreServer::Kind::kGcs)}),
    testing::StorageBackendName);

class ObjectStorageTest
    : public ::testing::TestWithParam<ObjectStoreServer::Kind> {
 protected:
  void SetUp() override {
    HOIST_REQUIRE_SERVERS();
    testing::SharedServers& servers = testing::TheServers();
    server_ = servers.Of(GetParam());
    absl::StatusOr<std::unique_ptr<Storage>> storage =
        testing::OpenObjectStorage(server_->Url(""));
    ASSERT_TRUE(storage.ok()) << storage.status();
    storage_ = *std::move(storage);
    root_ = server_->Url(testing::UniquePrefix("t"));
  }

  absl::Status Write(const std::string& path, const std::string& bytes) {
    absl::StatusOr<std::unique_ptr<WritableFile>> file =
        storage_->OpenWritable(path);
    if (!file.ok()) return file.status();
    if (absl::Status s = (*file)->WriteAt(
            0,
            absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()),
                                bytes.size()));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
    return (*file)->Close();
  }

  absl::StatusOr<std::string> Read(const std::string& path, int64_t offset,
                                   int64_t bytes) {
    absl::StatusOr<std::unique_ptr<ReadableFile>> file =
        storage_->OpenReadable(path);
    if (!file.ok()) return file.status();
    std::string out(static_cast<size_t>(bytes), '\0');
    absl::Status read = (*file)->ReadAt(
        offset,
        absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size()));
    if (!read.ok()) return read;
    return out;
  }

  ObjectStoreServer* server_ = nullptr;
  std::unique_ptr<Storage> storage_;
  std::string root_;
};

TEST_P(ObjectStorageTest,
       AnObjectIsWrittenInPartsFromStartToEndAndReadByRange) {
  const std::string path = JoinPath(root_, "data/r00000_w00.bin");
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      storage_->OpenWritable(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->sequential());
  // 24 MiB in three writes: whole 10 MiB parts go as they are, the rest
  // waits for the next write.
  std::string bytes(24 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  }
  const auto piece = [&](size_t from, size_t to) {
    return absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(bytes.data()) + from, to - from);
  };
  ASSERT_TRUE((*file)->WriteAt(0, piece(0, 4096)).ok());
  // Anywhere but the end is refused, naming the object.
  const absl::Status gap = (*file)->WriteAt(8192, piece(8192, 12288));
  EXPECT_EQ(gap.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gap.message(), HasSubstr(path));
  ASSERT_TRUE((*file)->WriteAt(4096, piece(4096, 15 << 20)).ok());
  ASSERT_TRUE((*file)->WriteAt(15 << 20, piece(15 << 20, bytes.size())).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());

  absl::StatusOr<std::string> middle = Read(path, (10 << 20) - 100, 1 << 20);
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ(*middle, bytes.substr((10 << 20) - 100, 1 << 20));
  absl::StatusOr<std::string> tail = Read(path, bytes.size() - 5, 5);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(*tail, bytes.substr(bytes.size() - 5));
  // Past the end: truncated, named.
  const absl::Status past = Read(path, bytes.size() - 5, 6).status();
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(past.message(), HasSubstr(path));
}

TEST_P(ObjectStorageTest, AnUploadClosedWithoutSyncLeavesNoObject) {
  const std::string path = JoinPath(root_, "abandoned.bin");
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      storage_->OpenWritable(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string bytes(12 << 20, 'x');
  ASSERT_TRUE(
      (*file)
          ->WriteAt(0, absl::MakeConstSpan(
                           reinterpret_cast<const uint8_t*>(bytes.data()),
                           bytes.size()))
          .ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_FALSE(*storage_->Exists(path));
  EXPECT_EQ(storage_->OpenReadable(path).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(ObjectStorageTest, CommitWritesInPlaceAndTheMarkerLast) {
  const std::string dir = JoinPath(root_, "step_00000003");
  // What an earlier save that never committed left there goes first.
  ASSERT_TRUE(Write(JoinPath(dir, "data/stale.bin"), "stale").ok());
  const std::string subdirs[] = {"data"};
  absl::StatusOr<std::string> begun = storage_->BeginDir(
      dir, JoinPath(root_, ".step_00000003.tmp-x"), subdirs, "MANIFEST.json",
      /*replace=*/false);
  ASSERT_TRUE(begun.ok()) << begun.status();
  EXPECT_EQ(*begun, dir);
  EXPECT_FALSE(*storage_->Exists(JoinPath(dir, "data/stale.bin")));
  ASSERT_TRUE(Write(JoinPath(dir, "data/r0.bin"), "bytes").ok());
  EXPECT_FALSE(*storage_->HasMarker(dir, "MANIFEST.json"));
  ASSERT_TRUE(
      storage_->CommitDir(dir, dir, "MANIFEST.json", R"({"step":3})", "").ok());
  EXPECT_TRUE(*storage_->HasMarker(dir, "MANIFEST.json"));
  EXPECT_EQ(*Read(JoinPath(dir, "MANIFEST.json"), 0, 10), R"({"step":3})");
  // A second commit of the same directory, not replacing, is refused.
  EXPECT_EQ(storage_->CommitDir(dir, dir, "MANIFEST.json", "{}", "").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(storage_
                ->BeginDir(dir, JoinPath(root_, ".tmp"), subdirs,
                           "MANIFEST.json", /*replace=*/false)
                .status()
                .code(),
            absl::StatusCode::kAlreadyExists);
  // Removing it takes everything, marker first.
  ASSERT_TRUE(storage_->RemoveCommitted(dir, "", "MANIFEST.json").ok());
  EXPECT_FALSE(*storage_->Exists(dir));
  EXPECT_EQ(storage_->RemoveCommitted(dir, "", "MANIFEST.json").code(),
            absl::StatusCode::kNotFound);
}

TEST_P(ObjectStorageTest, TheLockObjectNamesItsHolderAndGoesWithIt) {
  const std::string path = JoinPath(root_, ".hoist.lock");
  {
    absl::StatusOr<std::unique_ptr<FileLock>> lock =
        storage_->LockFile(path, "pid 1 on host, 00ff");
    ASSERT_TRUE(lock.ok()) << lock.status();
    EXPECT_EQ(*Read(path, 0, 19), "pid 1 on host, 00ff");
  }
  EXPECT_FALSE(*storage_->Exists(path));
}

TEST_P(ObjectStorageTest, AMissingBucketIsNamedAndNothingIsWritten) {
  const std::string url = GetParam() == ObjectStoreServer::Kind::kS3
                              ? "s3://no-such-bucket-here/run"
                              : "gs://no-such-bucket-here/run";
  const absl::Status status = storage_->CreateDirs(url);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no-such-bucket-here"));
}

TEST_P(ObjectStorageTest, AMalformedUrlIsRefused) {
  for (const char* url : {"s3://", "s3:///prefix", "gs://", "ftp://b/p"}) {
    absl::StatusOr<std::unique_ptr<Storage>> storage =
        testing::OpenObjectStorage(url);
    EXPECT_EQ(storage.status().code(), absl::StatusCode::kInvalidArgument)
        << url;
    EXPECT_THAT(storage.status().message(), HasSubstr(url));
  }
}

INSTANTIATE_TEST_SUITE_P(Servers, ObjectStorageTest,
                         ::testing::Values(ObjectStoreServer::Kind::kS3,
                                           ObjectStoreServer::Kind::kGcs),
                         testing::KindName);

TEST(S3StorageTest, WrongKeysAreRefusedWithoutNamingThem) {
  HOIST_REQUIRE_SERVERS();
  testing::SharedServers& servers = testing::TheServers();
  ObjectStoreOptions options;
  options.access_key_id = "AKIAWRONGWRONGWRONG0";
  options.secret_access_key = "wrong-secret-never-to-be-printed";
  options.max_attempts = 1;
  absl::StatusOr<std::unique_ptr<Storage>> storage =
      testing::OpenObjectStorage(servers.s3->Url("x"), options);
  ASSERT_TRUE(storage.ok()) << storage.status();
  const absl::Status status =
      (*storage)->OpenWritable(servers.s3->Url("x/object")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(), Not(HasSubstr("wrong-secret")));
}

}  // namespace
}  // namespace hoist
