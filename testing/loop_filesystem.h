// Test helper: a small, real ext4 filesystem of its own (an image file,
// mkfs.ext4 and a loop mount), so a test can fill a disk for real. Needs
// root and loop devices; where either is missing, ok() is false and
// reason() says why, for GTEST_SKIP. Unmounted when the object goes away.
#ifndef HOIST_TESTING_LOOP_FILESYSTEM_H_
#define HOIST_TESTING_LOOP_FILESYSTEM_H_

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "testing/temp_dir.h"

namespace hoist::testing {

class LoopFilesystem {
 public:
  explicit LoopFilesystem(int64_t bytes) {
    if (geteuid() != 0) {
      reason_ = "mounting a loop filesystem needs root";
      return;
    }
    const std::string image = temp_.path() + "/fs.img";
    path_ = temp_.path() + "/mnt";
    std::filesystem::create_directory(path_);
    std::ofstream(image).close();
    std::filesystem::resize_file(image, static_cast<uintmax_t>(bytes));
    if (!Run("mkfs.ext4 -q -F " + image)) {
      reason_ = "mkfs.ext4 failed (is e2fsprogs installed?)";
      return;
    }
    if (!Run("mount -o loop " + image + " " + path_)) {
      reason_ = "mount -o loop failed (no loop devices in this sandbox?)";
      return;
    }
    mounted_ = true;
  }
  ~LoopFilesystem() {
    if (mounted_ && !Run("umount " + path_)) Run("umount -l " + path_);
  }
  LoopFilesystem(const LoopFilesystem&) = delete;
  LoopFilesystem& operator=(const LoopFilesystem&) = delete;

  bool ok() const { return mounted_; }
  const std::string& reason() const { return reason_; }
  const std::string& path() const { return path_; }
  // Bytes still free to root.
  int64_t FreeBytes() const {
    struct statvfs s {};
    if (statvfs(path_.c_str(), &s) != 0) return -1;
    return static_cast<int64_t>(s.f_bfree) * static_cast<int64_t>(s.f_frsize);
  }

 private:
  static bool Run(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }

  TempDir temp_;
  std::string path_;
  std::string reason_;
  bool mounted_ = false;
};

}  // namespace hoist::testing

#endif  // HOIST_TESTING_LOOP_FILESYSTEM_H_
