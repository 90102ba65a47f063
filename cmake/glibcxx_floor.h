// Included into every file of the Python build (CMakeLists.txt), so that
// the wheel's binaries install where libstdc++ is older than this
// toolchain's. GCC 12's libstdc++ gave std::condition_variable::wait a new
// symbol version (GLIBCXX_3.4.30, for cancellation unwinding through it,
// which hoist never does); the only use of that version would raise the
// wheel's floor from manylinux_2_34 (RHEL 9, Amazon Linux 2023) to 2_35.
// Calls bind to the older version, which every libstdc++ since GCC 4.5 has
// and which waits the same way. (tools/check_wheel.py prints the floor.)
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
__asm__(
    ".symver _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE,"
    "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE@GLIBCXX_3.4.11");
#endif
