#include "hoist/huge_pages.h"

#include <sys/mman.h>

#include <filesystem>
#include <fstream>

namespace hoist {
namespace {

constexpr char kBalloonDevice[] = "0x0005";  // virtio device id: balloon
constexpr size_t kFreePageReporting = 5;     // VIRTIO_BALLOON_F_REPORTING

}  // namespace

bool HugePagesPay(const std::string& virtio_devices) {
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator(virtio_devices, error)) {
    std::string id, features;
    std::ifstream(entry.path() / "device") >> id;
    if (id != kBalloonDevice) continue;
    // One character per feature bit, bit 0 first.
    std::ifstream(entry.path() / "features") >> features;
    if (features.size() > kFreePageReporting &&
        features[kFreePageReporting] == '1') {
      return false;
    }
  }
  return true;
}

bool AdviseHugePages() {
  static const bool advise = HugePagesPay("/sys/bus/virtio/devices");
  return advise;
}

void AdviseHugePagesFor(void* data, int64_t bytes) {
  const int64_t whole = bytes / kHugePageBytes * kHugePageBytes;
  if (whole > 0 && AdviseHugePages()) madvise(data, whole, MADV_HUGEPAGE);
}

void AdviseHugePagesForIo(void* data, int64_t bytes) {
  if (bytes > 0) madvise(data, bytes, MADV_HUGEPAGE);
}

}  // namespace hoist
