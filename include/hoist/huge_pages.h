// Whether memory a restore writes for the first time is worth advising for
// transparent huge pages (MADV_HUGEPAGE). Where the kernel grants them, a
// huge page costs one fault instead of 512 and direct reads into it move
// bytes faster (bench/results/disk-limit-2026-12-02.txt: 1.5-2x on this
// project's VM). But a VM whose balloon reports free pages to its host
// (virtio-balloon free page reporting) has the host discard every free
// 2 MiB block a few seconds after it is freed, and a huge page is made of
// exactly such blocks: its first touch then waits on the host, measured
// 3-8 s for 2 GiB against about 1.1 s in small pages. GPU hosts never
// report (device passthrough pins all guest memory).
#ifndef HOIST_HUGE_PAGES_H_
#define HOIST_HUGE_PAGES_H_

#include <cstdint>
#include <string>

namespace hoist {

inline constexpr int64_t kHugePageBytes = int64_t{2} << 20;

// True unless a virtio balloon under `virtio_devices` (a sysfs directory
// of virtio devices) negotiated free page reporting.
bool HugePagesPay(const std::string& virtio_devices);

// HugePagesPay("/sys/bus/virtio/devices"), looked up once per process.
bool AdviseHugePages();

// Advises [data, data + bytes) (fresh memory this process mapped; its first
// whole 2 MiB blocks, from `data`) for huge pages where AdviseHugePages():
// advice only, a kernel without THP keeps small pages, and it gives huge
// pages only to the 2 MiB-aligned blocks.
void AdviseHugePagesFor(void* data, int64_t bytes);

// Advises [data, data + bytes) for huge pages everywhere, even where their
// first touch costs more: for I/O buffers (the staging pool, a restore
// reader's buffer), faulted in once and then the source or target of many
// direct transfers. A direct transfer from huge pages is a few large
// segments for the device, from small pages hundreds of 4 KiB ones: on
// this project's VM (virtio-blk, at most 254 segments a request) O_DIRECT
// reads of 2 GiB into resident small pages ran at 0.55-0.6 of the same
// reads into huge pages (bench/results/save-bench-2026-12-03.txt).
void AdviseHugePagesForIo(void* data, int64_t bytes);

}  // namespace hoist

#endif  // HOIST_HUGE_PAGES_H_
