#include "plan/analysis/periodicity.h"

#include <gtest/gtest.h>

#include <random>

namespace loom::plan {
namespace {

TEST(AlignSequencesTest, OneExtraElementDoesNotShiftTheRest) {
  std::vector<uint64_t> a = {1, 2, 3, 4, 5};
  std::vector<uint64_t> b = {1, 2, 9, 3, 4, 5};
  Alignment al = AlignSequences(a, b);
  EXPECT_TRUE(al.exact);
  EXPECT_EQ(al.matched, 5u);
  EXPECT_EQ(al.a_to_b, (std::vector<int64_t>{0, 1, 3, 4, 5}));
  EXPECT_EQ(al.b_to_a, (std::vector<int64_t>{0, 1, -1, 2, 3, 4}));
}

TEST(AlignSequencesTest, SubstitutionsInsertionsAndDeletions) {
  // LCS of ABCABBA and CBABAC is 4 (Myers' example).
  std::vector<uint64_t> a = {'A', 'B', 'C', 'A', 'B', 'B', 'A'};
  std::vector<uint64_t> b = {'C', 'B', 'A', 'B', 'A', 'C'};
  Alignment al = AlignSequences(a, b);
  EXPECT_EQ(al.matched, 4u);
  // The pairs are a valid common subsequence: increasing and equal.
  int64_t last = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (al.a_to_b[i] < 0) continue;
    EXPECT_GT(al.a_to_b[i], last);
    last = al.a_to_b[i];
    EXPECT_EQ(a[i], b[al.a_to_b[i]]);
    EXPECT_EQ(al.b_to_a[al.a_to_b[i]], static_cast<int64_t>(i));
  }
  EXPECT_EQ(AlignSequences(a, {}).matched, 0u);
  EXPECT_EQ(AlignSequences({}, {}).matched, 0u);
  std::vector<uint64_t> c = {7, 8};
  EXPECT_EQ(AlignSequences(a, c).matched, 0u);
}

TEST(AlignSequencesTest, MatchesABruteForceLcsOnRandomInputs) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::vector<uint64_t> a(rng() % 12), b(rng() % 12);
    for (auto& x : a) x = rng() % 3;
    for (auto& x : b) x = rng() % 3;
    std::vector<std::vector<size_t>> lcs(a.size() + 1,
                                         std::vector<size_t>(b.size() + 1));
    for (size_t i = a.size(); i-- > 0;) {
      for (size_t j = b.size(); j-- > 0;) {
        lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1
                                 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    Alignment al = AlignSequences(a, b);
    ASSERT_EQ(al.matched, lcs[0][0]) << "round " << round;
    int64_t last = -1;
    size_t pairs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (al.a_to_b[i] < 0) continue;
      ASSERT_GT(al.a_to_b[i], last);
      ASSERT_EQ(a[i], b[al.a_to_b[i]]);
      last = al.a_to_b[i];
      ++pairs;
    }
    ASSERT_EQ(pairs, al.matched);
  }
}

TEST(AlignSequencesTest, FallsBackBeyondTheEditBudget) {
  std::vector<uint64_t> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint64_t> b = {1, 9, 3, 9, 5, 9};
  Alignment al = AlignSequences(a, b, /*max_edits=*/2);
  EXPECT_FALSE(al.exact);
  EXPECT_EQ(al.matched, 3u);  // positions 0, 2, 4
  EXPECT_TRUE(AlignSequences(a, b).exact);
}

std::vector<uint64_t> Repeat(const std::vector<uint64_t>& head,
                             const std::vector<uint64_t>& body, int times) {
  std::vector<uint64_t> out = head;
  for (int i = 0; i < times; ++i)
    out.insert(out.end(), body.begin(), body.end());
  return out;
}

TEST(DetectPeriodTest, FindsThePeriodAndHead) {
  std::vector<uint64_t> body = {1, 2, 3, 1, 2, 3, 1, 2,
                                3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<uint64_t> t = Repeat({100, 101, 102}, body, 5);
  PeriodResult p = DetectPeriod(t);
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.period, 16u);
  EXPECT_EQ(p.head, 3u);
  EXPECT_DOUBLE_EQ(p.match, 1.0);
  EXPECT_EQ(p.starts, (std::vector<size_t>{3, 19, 35, 51, 67}));
}

TEST(DetectPeriodTest, NoRepetitionIsNotFound) {
  std::vector<uint64_t> t;
  for (uint64_t i = 0; i < 200; ++i) t.push_back(i * 7919 % 1000);
  EXPECT_FALSE(DetectPeriod(t).found);
  EXPECT_FALSE(DetectPeriod(std::vector<uint64_t>{1, 2, 1, 2}).found);
  // One copy is not a repetition.
  std::vector<uint64_t> once = Repeat({}, t, 1);
  EXPECT_FALSE(DetectPeriod(once).found);
}

TEST(DetectPeriodTest, ToleratesAnInsertionAndResynchronisesBoundaries) {
  std::vector<uint64_t> body;
  for (uint64_t i = 0; i < 40; ++i)
    body.push_back(i % 10 == 9 ? 50 + i : i % 4);
  std::vector<uint64_t> t = Repeat({90, 91}, body, 6);
  // Two extra tokens inside the fourth repetition.
  t.insert(t.begin() + 2 + 3 * 40 + 17, {77, 78});
  PeriodResult p = DetectPeriod(t);
  ASSERT_TRUE(p.found);
  EXPECT_EQ(p.period, 40u);
  EXPECT_EQ(p.head, 2u);
  EXPECT_GT(p.match, 0.95);
  EXPECT_EQ(p.starts, (std::vector<size_t>{2, 42, 82, 122, 164, 204}));
}

}  // namespace
}  // namespace loom::plan
