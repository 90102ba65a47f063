#include "hoist/huge_pages.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "testing/temp_dir.h"

namespace hoist {
namespace {

// A virtio device as sysfs shows it: its id and negotiated feature bits.
void AddDevice(const std::string& dir, const std::string& name,
               const std::string& id, const std::string& features) {
  std::filesystem::create_directories(dir + "/" + name);
  std::ofstream(dir + "/" + name + "/device") << id << "\n";
  std::ofstream(dir + "/" + name + "/features") << features << "\n";
}

TEST(HugePagesTest, PayUnlessABalloonReportsFreePages) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/devices";
  EXPECT_TRUE(HugePagesPay(dir));  // no such directory: bare metal
  std::filesystem::create_directories(dir);
  AddDevice(dir, "virtio0", "0x0002", "0000011111");  // a disk: bit 5 set
  EXPECT_TRUE(HugePagesPay(dir));
  AddDevice(dir, "virtio1", "0x0005", "0110000100");  // balloon, no reporting
  EXPECT_TRUE(HugePagesPay(dir));
  AddDevice(dir, "virtio2", "0x0005", "0110010100");  // reporting (bit 5)
  EXPECT_FALSE(HugePagesPay(dir));
}

}  // namespace
}  // namespace hoist
