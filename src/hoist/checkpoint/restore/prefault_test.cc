#include "hoist/checkpoint/restore/prefault.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "testing/smaps.h"

namespace hoist {
namespace {

using testing::SmapsField;

// Fresh anonymous memory between two inaccessible pages (so the kernel
// cannot merge it with a neighbouring mapping, and smaps counts its pages
// alone), unmapped at the end.
class Mapping {
 public:
  explicit Mapping(int64_t bytes, int prot = PROT_READ | PROT_WRITE)
      : page_(sysconf(_SC_PAGESIZE)), bytes_(bytes) {
    void* whole = mmap(nullptr, bytes + 2 * page_, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (whole == MAP_FAILED) std::abort();
    data_ = static_cast<uint8_t*>(whole) + page_;
    if (mprotect(data_, bytes, prot) != 0) std::abort();
  }
  ~Mapping() { munmap(data_ - page_, bytes_ + 2 * page_); }
  uint8_t* data() { return data_; }
  // Kilobytes resident, as smaps says.
  int64_t ResidentKiB() { return std::atoll(SmapsField(data_, "Rss").c_str()); }

 private:
  int64_t page_;
  int64_t bytes_;
  uint8_t* data_;
};

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(PrefaulterTest, FaultsInTheRangesOfRunsNotYetTaken) {
  Mapping memory(20 * kMiB);
  ASSERT_EQ(memory.ResidentKiB(), 0);
  // Run 0 (a reader has it) covers the first 4 MiB; runs 1 and 2 the next
  // 12 MiB, the last starting mid-page; the last 4 MiB belong to no run.
  std::atomic<size_t> taken{1};
  Prefaulter prefaulter({{0, memory.data(), 4 * kMiB},
                         {1, memory.data() + 4 * kMiB, 8 * kMiB},
                         {2, memory.data() + 12 * kMiB + 100, 4 * kMiB - 100}},
                        taken, 2);
  prefaulter.Join();
  EXPECT_EQ(prefaulter.populated_bytes(), 12 * kMiB);
  EXPECT_EQ(memory.ResidentKiB(), 12 * 1024);
  // Faulted in, not written: still zeros.
  EXPECT_EQ(memory.data()[4 * kMiB], 0);
  EXPECT_EQ(memory.data()[16 * kMiB - 1], 0);
}

TEST(PrefaulterTest, NothingToDoStartsNothing) {
  std::atomic<size_t> taken{0};
  Mapping memory(kMiB);
  Prefaulter none({}, taken, 2);
  none.Join();
  Prefaulter no_threads({{0, memory.data(), kMiB}}, taken, 0);
  no_threads.Join();
  EXPECT_EQ(no_threads.populated_bytes(), 0);
  EXPECT_EQ(memory.ResidentKiB(), 0);
}

TEST(PrefaulterTest, MemoryItCannotWriteStopsIt) {
  Mapping read_only(4 * kMiB, PROT_READ);
  std::atomic<size_t> taken{0};
  Prefaulter prefaulter({{0, read_only.data(), 4 * kMiB}}, taken, 1);
  prefaulter.Join();
  EXPECT_EQ(prefaulter.populated_bytes(), 0);
}

}  // namespace
}  // namespace hoist
