// The shared conformance suite (testing/storage_conformance.h) on every
// local Storage, then what is specific to POSIX, the in-memory model and
// the fault injector.
#include "hoist/storage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "hoist/io/fault_storage.h"
#include "hoist/io/memory_storage.h"
#include "testing/storage_conformance.h"
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::StorageBackend;
using testing::StorageConformanceTest;
using testing::StorageSubject;

// A local filesystem through `open`, in a fresh temporary directory.
std::function<void(StorageSubject&)> OnDisk(
    std::function<absl::StatusOr<std::unique_ptr<Storage>>()> open) {
  return [open](StorageSubject& s) {
    auto temp = std::make_shared<testing::TempDir>();
    s.root = temp->path();
    s.keep = temp;
    absl::StatusOr<std::unique_ptr<Storage>> storage = open();
    ASSERT_TRUE(storage.ok()) << storage.status();  // io_uring works here
    s.storage = *std::move(storage);
  };
}

INSTANTIATE_TEST_SUITE_P(
    Local, StorageConformanceTest,
    ::testing::Values(
        StorageBackend{"posix", OnDisk([] { return OpenLocalStorage(); })},
        StorageBackend{"io_uring", OnDisk([] {
                         return OpenLocalStorage({.io = IoEngine::kIoUring});
                       })},
        StorageBackend{"memory",
                       [](StorageSubject& s) {
                         s.storage = std::make_unique<MemoryStorage>();
                         s.root = "/ckpt";
                         ASSERT_TRUE(s.storage->CreateDir(s.root).ok());
                       }},
        StorageBackend{"fault_injecting_without_faults",
                       [](StorageSubject& s) {
                         s.base = std::make_unique<MemoryStorage>();
                         s.storage = std::make_unique<FaultInjectingStorage>(
                             *s.base, FaultPlan{});
                         s.root = "/ckpt";
                         ASSERT_TRUE(s.storage->CreateDir(s.root).ok());
                       }}),
    testing::StorageBackendName);

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
  return v;
}

// A root is input: what a hostile user can put in it.
class PosixHostileRootTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) {
    return JoinPath(temp_.path(), name);
  }
  void WriteFile(const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  testing::TempDir temp_;
  testing::TempDir outside_;
  std::unique_ptr<Storage> storage_ = MakePosixStorage();
};

TEST_F(PosixHostileRootTest, ReserveAllocatesTheBytesAhead) {
  auto file = storage_->OpenWritable(Path("r.bin"));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Reserve(0, int64_t{4} << 20).ok());
  struct stat st;
  ASSERT_EQ(stat(Path("r.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, int64_t{4} << 20);
  EXPECT_GE(static_cast<int64_t>(st.st_blocks) * 512, int64_t{4} << 20);
  // A range further on: the size reaches its end, the gap stays a hole.
  ASSERT_TRUE((*file)->Reserve(int64_t{16} << 20, int64_t{2} << 20).ok());
  ASSERT_EQ(stat(Path("r.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, int64_t{18} << 20);
  EXPECT_GE(static_cast<int64_t>(st.st_blocks) * 512, int64_t{6} << 20);
  EXPECT_LT(static_cast<int64_t>(st.st_blocks) * 512, int64_t{18} << 20);
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ((*file)->Reserve(0, 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(PosixHostileRootTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo(Path("MANIFEST.json").c_str(), 0644), 0);
  absl::Status status = storage_->OpenReadable(Path("MANIFEST.json")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("not a regular file"));
  EXPECT_EQ(storage_->OpenWritable(Path("MANIFEST.json")).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(PosixHostileRootTest, NoLinkIsFollowedToReadOrWrite) {
  const std::string target = JoinPath(outside_.path(), "precious");
  WriteFile(target, "keep me");
  ASSERT_EQ(symlink(target.c_str(), Path("link").c_str()), 0);
  EXPECT_EQ(storage_->OpenWritable(Path("link")).status().code(),
            absl::StatusCode::kAlreadyExists);
  absl::Status read = storage_->OpenReadable(Path("link")).status();
  EXPECT_EQ(read.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.message(), HasSubstr("symbolic link"));
  // A linked directory on the way down is refused too.
  ASSERT_EQ(symlink(outside_.path().c_str(), Path("data").c_str()), 0);
  absl::Status beneath =
      storage_->OpenReadableBeneath(temp_.path(), "data/precious").status();
  EXPECT_EQ(beneath.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(beneath.message(), HasSubstr("not a directory inside"));
  EXPECT_EQ(ReadFile(target), "keep me");
}

TEST_F(PosixHostileRootTest, RemoveAllRemovesLinksNotWhatTheyPointTo) {
  const std::string target = JoinPath(outside_.path(), "precious");
  WriteFile(target, "keep me");
  ASSERT_TRUE(storage_->CreateDir(Path("tree")).ok());
  ASSERT_EQ(symlink(outside_.path().c_str(), Path("tree/dir_link").c_str()), 0);
  ASSERT_EQ(symlink(target.c_str(), Path("tree/file_link").c_str()), 0);
  ASSERT_EQ(symlink(outside_.path().c_str(), Path("top_link").c_str()), 0);
  ASSERT_TRUE(storage_->RemoveAll(Path("tree")).ok());
  ASSERT_TRUE(storage_->RemoveAll(Path("top_link")).ok());
  EXPECT_FALSE(*storage_->Exists(Path("tree")));
  EXPECT_FALSE(*storage_->Exists(Path("top_link")));
  EXPECT_EQ(ReadFile(target), "keep me");
}

TEST(MemoryStorageTest, CrashKeepsOnlySyncedBytesAndNames) {
  MemoryStorage storage;
  ASSERT_TRUE(storage.CreateDir("/r").ok());
  ASSERT_TRUE(storage.SyncDir("/").ok());
  auto synced = *storage.OpenWritable("/r/synced");
  ASSERT_TRUE(synced->WriteAt(0, Bytes(10, 1)).ok());
  ASSERT_TRUE(synced->Sync().ok());
  ASSERT_TRUE(synced->WriteAt(10, Bytes(10, 2)).ok());  // not synced
  auto unnamed = *storage.OpenWritable("/r/unnamed");
  ASSERT_TRUE(storage.SyncDir("/r").ok());       // both names durable
  auto late = *storage.OpenWritable("/r/late");  // name never synced
  ASSERT_TRUE(late->Sync().ok());

  storage.Crash();
  EXPECT_THAT(*storage.List("/r"), ElementsAre("synced", "unnamed"));
  EXPECT_EQ(*(*storage.OpenReadable("/r/synced"))->Size(), 10);
  EXPECT_EQ(*(*storage.OpenReadable("/r/unnamed"))->Size(), 0);
}

TEST(MemoryStorageTest, RenameIsDurableOnlyAfterSyncDirOfTheParent) {
  MemoryStorage storage;
  ASSERT_TRUE(storage.CreateDir("/tmp1").ok());
  auto f = *storage.OpenWritable("/tmp1/x");
  ASSERT_TRUE(f->WriteAt(0, Bytes(4, 0)).ok());
  ASSERT_TRUE(f->Sync().ok());
  ASSERT_TRUE(storage.SyncDir("/tmp1").ok());
  ASSERT_TRUE(storage.SyncDir("/").ok());
  ASSERT_TRUE(storage.Rename("/tmp1", "/final").ok());
  storage.Crash();
  EXPECT_TRUE(*storage.Exists("/tmp1/x"));
  EXPECT_FALSE(*storage.Exists("/final"));

  ASSERT_TRUE(storage.Rename("/tmp1", "/final").ok());
  ASSERT_TRUE(storage.SyncDir("/").ok());
  storage.Crash();
  EXPECT_EQ(*(*storage.OpenReadable("/final/x"))->Size(), 4);
}

TEST(FaultInjectingStorageTest, NthWriteFailsWithTheInjectedErrno) {
  MemoryStorage memory;
  FaultInjectingStorage storage(memory, {.fail_write = 1, .error = ENOSPC});
  auto f = *storage.OpenWritable("/f");
  EXPECT_TRUE(f->WriteAt(0, Bytes(8, 0)).ok());
  absl::Status status = f->WriteAt(8, Bytes(8, 0));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("/f: injected write failure"));
  EXPECT_TRUE(f->WriteAt(16, Bytes(8, 0)).ok());
}

TEST(FaultInjectingStorageTest, TornWriteLandsHalf) {
  MemoryStorage memory;
  FaultInjectingStorage storage(memory, {.fail_write = 0, .torn = true});
  auto f = *storage.OpenWritable("/f");
  EXPECT_EQ(f->WriteAt(0, Bytes(100, 0)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(*(*memory.OpenReadable("/f"))->Size(), 50);
}

TEST(FaultInjectingStorageTest, CrashAtSyncStopsEverythingAfter) {
  MemoryStorage memory;
  FaultInjectingStorage storage(memory, {.crash_at_sync = 1});
  auto f = *storage.OpenWritable("/f");
  EXPECT_TRUE(f->Sync().ok());              // sync 0
  EXPECT_FALSE(storage.SyncDir("/").ok());  // sync 1: the crash
  EXPECT_TRUE(storage.crashed());
  EXPECT_EQ(f->WriteAt(0, Bytes(1, 0)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(storage.CreateDir("/d").code(), absl::StatusCode::kAborted);
  memory.Crash();
  EXPECT_FALSE(*memory.Exists("/f"));  // its name was never made durable
}

}  // namespace
}  // namespace hoist
