// UTF-8 validation for text hoist writes into JSON (array names, metadata).
#ifndef HOIST_BASE_UTF8_H_
#define HOIST_BASE_UTF8_H_

#include <string_view>

namespace hoist {

// True if `text` is well-formed UTF-8 (RFC 3629): no overlong forms, no
// surrogates (U+D800..U+DFFF), nothing above U+10FFFF.
bool IsValidUtf8(std::string_view text);

}  // namespace hoist

#endif  // HOIST_BASE_UTF8_H_
