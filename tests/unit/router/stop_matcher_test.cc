#include "router/stop_matcher.h"

#include <string>

#include "gtest/gtest.h"

namespace tandem::router {
namespace {

TEST(StopMatcher, WithoutStopStringsEverythingPassesAtOnce) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("hello"), "hello");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, CutsAtTheStopStringAcrossPieces) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.Push("abc E"), "abc ");  // "E" might start "END"
  EXPECT_EQ(m.Push("N"), "");
  EXPECT_EQ(m.Push("D and more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("x"), "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, HeldTextIsReleasedWhenItIsNotAStop) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.Push("xEN"), "x");
  EXPECT_EQ(m.Push("x"), "ENx");
  EXPECT_EQ(m.Push("E"), "");
  EXPECT_EQ(m.Flush(), "E");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo"});
  EXPECT_EQ(m.Push("hello world"), "hel");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, MultiByteCharactersAreNeverSplit) {
  StopMatcher m({"\xC3\xA9t\xC3\xA9"});  // "été"
  EXPECT_EQ(m.Push("caf\xC3\xA9"), "caf");
  EXPECT_EQ(m.Push("!"), "\xC3\xA9!");
}

TEST(StopMatcher, StopAtTheVeryStart) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.Push("\n\nrest"), "");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace tandem::router
