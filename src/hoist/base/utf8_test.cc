#include "hoist/base/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace hoist {
namespace {

TEST(Utf8Test, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("params/w"));
  EXPECT_TRUE(IsValidUtf8("\xc3\xa9t\xc3\xa9"));     // été
  EXPECT_TRUE(IsValidUtf8("\xe2\x82\xac"));          // €
  EXPECT_TRUE(IsValidUtf8("\xf0\x9f\x98\x80"));      // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));      // U+10FFFF
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));  // NUL is a character
}

TEST(Utf8Test, RefusesWhatJsonCannotCarry) {
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_FALSE(IsValidUtf8("caf\xe9"));           // Latin-1, as os.fsencode
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // lone surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));      // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\x80"));              // lone continuation
}

}  // namespace
}  // namespace hoist
