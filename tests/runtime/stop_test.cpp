#include <gtest/gtest.h>

#include "runtime/stop.h"

namespace exl3 {
namespace {

// Feeds the pieces in turn; returns what was emitted and whether a stop string ended it.
std::pair<std::string, bool> run(StopMatcher& m, const std::vector<std::string>& pieces) {
    std::string out;
    for (const auto& p : pieces) {
        bool stopped = false;
        out += m.feed(p, &stopped);
        if (stopped) return {out, true};
    }
    return {out + m.flush(), false};
}

TEST(StopMatcher, NoStopsPassesEverything) {
    StopMatcher m;
    EXPECT_EQ(run(m, {"a", "bc", ""}), std::make_pair(std::string("abc"), false));
}

TEST(StopMatcher, StopSpanningPiecesIsNeverEmitted) {
    StopMatcher m({"</end>"});
    bool stopped = false;
    EXPECT_EQ(m.feed("Hello </", &stopped), "Hello ");  // "</" could begin the stop string: held back
    EXPECT_FALSE(stopped);
    EXPECT_EQ(m.feed("en", &stopped), "");
    EXPECT_FALSE(stopped);
    EXPECT_EQ(m.feed("d> tail", &stopped), "");
    EXPECT_TRUE(stopped);
}

TEST(StopMatcher, HeldTextIsReleasedWhenRuledOut) {
    StopMatcher m({"abc"});
    bool stopped = false;
    EXPECT_EQ(m.feed("xab", &stopped), "x");
    EXPECT_EQ(m.feed("d", &stopped), "abd");
    EXPECT_FALSE(stopped);
    EXPECT_EQ(m.feed("a", &stopped), "");
    EXPECT_EQ(m.flush(), "a");  // generation ended another way: the held text is output after all
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
    StopMatcher m({"world", "lo w", "zz"});
    EXPECT_TRUE(m.matched().empty());
    EXPECT_EQ(run(m, {"hel", "lo", " wor", "ld"}), std::make_pair(std::string("hel"), true));
    EXPECT_EQ(m.matched(), "lo w");  // the one that matched, for the Anthropic API's stop_sequence
}

TEST(StopMatcher, StopInsideOnePiece) {
    StopMatcher m({"\n\n"});
    EXPECT_EQ(run(m, {"one\n", "\ntwo"}), std::make_pair(std::string("one"), true));
    StopMatcher m2({"X"});
    EXPECT_EQ(run(m2, {"abXcd"}), std::make_pair(std::string("ab"), true));
}

TEST(StopMatcher, OverlappingPrefixesHoldTheLongestCandidate) {
    StopMatcher m({"aab"});
    bool stopped = false;
    EXPECT_EQ(m.feed("aa", &stopped), "");
    EXPECT_EQ(m.feed("a", &stopped), "a");  // "aaa": only the last "aa" can still start "aab"
    EXPECT_EQ(m.feed("b", &stopped), "");
    EXPECT_TRUE(stopped);
}

}  // namespace
}  // namespace exl3
