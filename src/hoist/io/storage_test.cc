// One conformance suite for every Storage, then what is specific to the
// in-memory model and the fault injector.
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
#include "testing/temp_dir.h"

namespace hoist {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A storage under test and the directory to work in.
struct Subject {
  std::unique_ptr<testing::TempDir> temp;
  std::unique_ptr<Storage> base;
  std::unique_ptr<Storage> storage;
  std::string root;
};

using Factory = std::function<Subject()>;

struct Named {
  std::string name;
  Factory make;
};

std::vector<Named> Factories() {
  return {
      {"posix",
       [] {
         Subject s;
         s.temp = std::make_unique<testing::TempDir>();
         s.storage = MakePosixStorage();
         s.root = s.temp->path();
         return s;
       }},
      {"io_uring",
       [] {
         Subject s;
         s.temp = std::make_unique<testing::TempDir>();
         absl::StatusOr<std::unique_ptr<Storage>> uring = MakeIoUringStorage();
         EXPECT_TRUE(uring.ok()) << uring.status();  // io_uring works here
         s.storage = uring.ok() ? *std::move(uring) : MakePosixStorage();
         s.root = s.temp->path();
         return s;
       }},
      {"memory",
       [] {
         Subject s;
         s.storage = std::make_unique<MemoryStorage>();
         s.root = "/ckpt";
         EXPECT_TRUE(s.storage->CreateDir(s.root).ok());
         return s;
       }},
      {"fault_injecting_without_faults",
       [] {
         Subject s;
         s.base = std::make_unique<MemoryStorage>();
         s.storage =
             std::make_unique<FaultInjectingStorage>(*s.base, FaultPlan{});
         s.root = "/ckpt";
         EXPECT_TRUE(s.storage->CreateDir(s.root).ok());
         return s;
       }},
  };
}

class StorageConformanceTest : public ::testing::TestWithParam<Named> {
 protected:
  void SetUp() override { s_ = GetParam().make(); }
  Storage& storage() { return *s_.storage; }
  std::string Path(const std::string& name) { return JoinPath(s_.root, name); }
  Subject s_;
};

INSTANTIATE_TEST_SUITE_P(All, StorageConformanceTest,
                         ::testing::ValuesIn(Factories()),
                         [](const auto& info) { return info.param.name; });

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
  return v;
}

// A 4 KiB-aligned buffer, as staged extents are.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n, uint8_t seed)
      : data(static_cast<uint8_t*>(
            std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))),
        size(n) {
    std::vector<uint8_t> v = Bytes(n, seed);
    std::memcpy(data, v.data(), n);
  }
  ~AlignedBuffer() { std::free(data); }
  absl::Span<const uint8_t> span() const { return {data, size}; }
  uint8_t* data;
  size_t size;
};

TEST_P(StorageConformanceTest, WritesAtOffsetsReadBack) {
  auto file = storage().OpenWritable(Path("f.bin"));
  ASSERT_TRUE(file.ok()) << file.status();
  const AlignedBuffer aligned(8192, 1);          // O_DIRECT-eligible
  const AlignedBuffer with_tail(4096 + 100, 2);  // aligned body + tail
  const std::vector<uint8_t> unaligned = Bytes(333, 3);
  ASSERT_TRUE((*file)->WriteAt(0, aligned.span()).ok());
  ASSERT_TRUE((*file)->WriteAt(8192, with_tail.span()).ok());
  ASSERT_TRUE((*file)->WriteAt(20000, unaligned).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());

  auto reader = storage().OpenReadable(Path("f.bin"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->Size(), 20000 + 333);
  std::vector<uint8_t> out(8192);
  ASSERT_TRUE((*reader)->ReadAt(0, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), aligned.data));
  out.resize(4196);
  ASSERT_TRUE((*reader)->ReadAt(8192, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), with_tail.data));
  out.resize(333);
  ASSERT_TRUE((*reader)->ReadAt(20000, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, unaligned);
}

TEST_P(StorageConformanceTest, ConcurrentDisjointWritesToOneFile) {
  auto file = storage().OpenWritable(Path("f.bin"));
  ASSERT_TRUE(file.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const AlignedBuffer chunk(4096, static_cast<uint8_t>(t));
      for (int i = 0; i < 8; ++i) {
        EXPECT_TRUE((*file)->WriteAt((i * 4 + t) * 4096, chunk.span()).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE((*file)->Sync().ok());
  auto reader = storage().OpenReadable(Path("f.bin"));
  std::vector<uint8_t> out(4096);
  for (int block = 0; block < 32; ++block) {
    ASSERT_TRUE((*reader)->ReadAt(block * 4096, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, Bytes(4096, static_cast<uint8_t>(block % 4))) << block;
  }
}

TEST_P(StorageConformanceTest, WritesIntoAReservedFileReadBack) {
  auto file = storage().OpenWritable(Path("r.bin"));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Reserve(0, 1 << 20).ok());
  const AlignedBuffer block(8192, 7);
  ASSERT_TRUE((*file)->WriteAt(4096, block.span()).ok());
  ASSERT_TRUE((*file)->WriteAt((1 << 20) - 100, Bytes(100, 8)).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto reader = storage().OpenReadable(Path("r.bin"));
  EXPECT_EQ(*(*reader)->Size(), 1 << 20);
  std::vector<uint8_t> out(8192);
  ASSERT_TRUE((*reader)->ReadAt(4096, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), block.data));
  out.resize(100);
  ASSERT_TRUE((*reader)->ReadAt((1 << 20) - 100, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, Bytes(100, 8));
}

TEST_P(StorageConformanceTest, ReadPastTheEndIsDataLossNamingTheFile) {
  auto file = storage().OpenWritable(Path("short.bin"));
  ASSERT_TRUE((*file)->WriteAt(0, Bytes(100, 0)).ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto reader = storage().OpenReadable(Path("short.bin"));
  std::vector<uint8_t> out(50);
  absl::Status status = (*reader)->ReadAt(80, absl::MakeSpan(out));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("short.bin: truncated"));
}

TEST_P(StorageConformanceTest, MissingFileIsNotFound) {
  EXPECT_EQ(storage().OpenReadable(Path("nope")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(storage().List(Path("nope")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(*storage().Exists(Path("nope")));
  EXPECT_EQ(storage().OpenWritable(Path("nodir/f")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(StorageConformanceTest, DirectoriesListRenameAndRemove) {
  ASSERT_TRUE(storage().CreateDir(Path("d")).ok());
  EXPECT_EQ(storage().CreateDir(Path("d")).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(storage().CreateDir(Path("d/sub")).ok());
  ASSERT_TRUE((*storage().OpenWritable(Path("d/b")))->Close().ok());
  ASSERT_TRUE((*storage().OpenWritable(Path("d/a")))->Close().ok());
  EXPECT_THAT(*storage().List(Path("d")), ElementsAre("a", "b", "sub"));
  EXPECT_TRUE(*storage().IsDir(Path("d/sub")));
  EXPECT_FALSE(*storage().IsDir(Path("d/a")));
  ASSERT_TRUE(storage().SyncDir(Path("d")).ok());

  ASSERT_TRUE(storage().Rename(Path("d"), Path("e")).ok());
  EXPECT_FALSE(*storage().Exists(Path("d")));
  EXPECT_TRUE(*storage().Exists(Path("e/sub")));
  ASSERT_TRUE(storage().CreateDir(Path("f")).ok());
  EXPECT_EQ(storage().Rename(Path("e"), Path("f")).code(),
            absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(storage().RemoveAll(Path("e") + "/").ok());
  EXPECT_FALSE(*storage().Exists(Path("e")));
  EXPECT_TRUE(storage().RemoveAll(Path("never-was")).ok());
}

TEST_P(StorageConformanceTest, OpenWritableRefusesAnExistingName) {
  auto file = storage().OpenWritable(Path("f"));
  ASSERT_TRUE((*file)->WriteAt(0, Bytes(1000, 0)).ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(storage().OpenWritable(Path("f")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*(*storage().OpenReadable(Path("f")))->Size(), 1000);  // kept
  ASSERT_TRUE(storage().CreateDir(Path("d")).ok());
  EXPECT_EQ(storage().OpenWritable(Path("d")).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_P(StorageConformanceTest, OpenReadableRefusesADirectory) {
  ASSERT_TRUE(storage().CreateDir(Path("d")).ok());
  absl::Status status = storage().OpenReadable(Path("d")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("not a regular file"));
}

TEST_P(StorageConformanceTest, OpenReadableBeneathWalksRealDirectories) {
  ASSERT_TRUE(storage().CreateDir(Path("step")).ok());
  ASSERT_TRUE(storage().CreateDir(Path("step/data")).ok());
  auto file = storage().OpenWritable(Path("step/data/x.bin"));
  ASSERT_TRUE((*file)->WriteAt(0, Bytes(10, 0)).ok());
  ASSERT_TRUE((*file)->Close().ok());
  auto read = storage().OpenReadableBeneath(Path("step"), "data/x.bin");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*(*read)->Size(), 10);
  absl::Status missing =
      storage().OpenReadableBeneath(Path("step"), "nodir/x.bin").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(missing.message(), HasSubstr("not a directory inside"));
  EXPECT_EQ(
      storage().OpenReadableBeneath(Path("step"), "data/y.bin").status().code(),
      absl::StatusCode::kNotFound);
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
