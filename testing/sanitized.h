// Test helper: whether this build runs under AddressSanitizer or
// ThreadSanitizer (whose allocators' quarantine grows RSS, and whose mlock
// does nothing and succeeds).
#ifndef HOIST_TESTING_SANITIZED_H_
#define HOIST_TESTING_SANITIZED_H_

namespace hoist::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace hoist::testing

#endif  // HOIST_TESTING_SANITIZED_H_
