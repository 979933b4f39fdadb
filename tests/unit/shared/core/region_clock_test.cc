#include "hvtrace/region_clock.h"

#include <gtest/gtest.h>
#include <time.h>
#include <x86intrin.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace hvtrace {
namespace {

uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// One real pair, taken the way the agent takes it (TSC around the clock
// read). Of a few tries the one with the tightest TSC bracket is kept: a try
// that was preempted or interrupted between its reads (this machine is shared
// and busy) would be off by the length of the interruption.
region::ClockSync RealSample(uint64_t seq) {
  region::ClockSync best{};
  uint64_t best_width = UINT64_MAX;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t t0 = __rdtsc();
    const uint64_t mono = MonoNs();
    const uint64_t t1 = __rdtsc();
    if (t1 - t0 < best_width) {
      best_width = t1 - t0;
      best.mono_ns = mono;
      best.tsc = t0 + (t1 - t0) / 2;
    }
  }
  best.seq = seq;
  return best;
}

// Real TSC <-> CLOCK_MONOTONIC pairs of this machine: samples 20 ms apart
// (as the agent's, scaled down), then held-out instants in between and after
// them converted and compared with the clock read at the same instant.
TEST(TscToMono, ConvertsRealPairsOfThisMachine) {
  std::vector<region::ClockSync> samples;
  for (int i = 0; i < 6; ++i) {
    samples.push_back(RealSample(2 * i + 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  TscToMono conv(samples);
  ASSERT_TRUE(conv.usable());
  EXPECT_EQ(conv.dropped(), 0u);
  std::printf("TSC rate from the samples: %.6f GHz\n", conv.tsc_hz() / 1e9);
  EXPECT_GT(conv.tsc_hz(), 1e8);
  EXPECT_LT(conv.tsc_hz(), 1e10);
  int64_t worst = 0;
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    const region::ClockSync probe = RealSample(0);
    auto mono = conv.ToMonoNs(probe.tsc);
    ASSERT_TRUE(mono.has_value());
    worst = std::max<int64_t>(
        worst, std::llabs(static_cast<int64_t>(*mono) - static_cast<int64_t>(probe.mono_ns)));
  }
  std::printf("worst conversion error over 20 probes (up to 60 ms past the last sample): %lld ns\n",
              static_cast<long long>(worst));
  // Accuracy, not speed: a converted stamp lands within 100 us of the truth
  // (a preempted sample read is the usual error; it is ~100 ns when quiet).
  EXPECT_LT(worst, 100000);
  // Order is kept: later TSC, later mono.
  EXPECT_LT(*conv.ToMonoNs(samples[1].tsc), *conv.ToMonoNs(samples[1].tsc + 1000000));
  EXPECT_EQ(*conv.ToMonoNs(samples[2].tsc), samples[2].mono_ns);
}

TEST(TscToMono, Malicious_SamplesThatGoBackwardsOrAreAbsurdAreDropped) {
  std::vector<region::ClockSync> s(6);
  s[0] = {2, 1000000000, 0, 0, 3000000000, {}};
  s[1] = {4, 2000000000, 0, 0, 6000000000, {}};   // 3 GHz: good.
  s[2] = {6, 1500000000, 0, 0, 7000000000, {}};   // mono backwards.
  s[3] = {8, 3000000000, 0, 0, 5000000000, {}};   // tsc backwards.
  s[4] = {10, 3000000000, 0, 0, 6000000001, {}};  // 1 tick per s: no TSC.
  s[5] = {12, 0, 0, 0, 0, {}};                    // empty.
  TscToMono conv(s);
  ASSERT_TRUE(conv.usable());
  EXPECT_EQ(conv.dropped(), 4u);
  EXPECT_NEAR(conv.tsc_hz(), 3e9, 1);
  EXPECT_EQ(*conv.ToMonoNs(4500000000), 1500000000u);
  EXPECT_EQ(*conv.ToMonoNs(9000000000), 3000000000u);  // Extended past the last.
  EXPECT_EQ(*conv.ToMonoNs(0), 0u);                    // And before the first.
  EXPECT_FALSE(conv.ToMonoNs(UINT64_MAX).has_value() && *conv.ToMonoNs(UINT64_MAX) < 3000000000u);
}

TEST(TscToMono, Malicious_OneSampleOrNoneConvertsNothing) {
  EXPECT_FALSE(TscToMono({}).usable());
  const region::ClockSync one{2, 5, 0, 0, 7, {}};
  TscToMono conv(std::span<const region::ClockSync>(&one, 1));
  EXPECT_FALSE(conv.usable());
  EXPECT_FALSE(conv.ToMonoNs(7).has_value());
  EXPECT_EQ(conv.tsc_hz(), 0);
}

TEST(TscToMono, Malicious_ASampleOffTheLineIsDroppedWhereverItSits) {
  // Six samples of a 2 GHz TSC a second apart; the fourth claims a time one
  // second late (both clocks still forward, a plausible rate on each side).
  std::vector<region::ClockSync> s;
  for (uint64_t i = 0; i < 6; ++i) {
    const uint64_t mono = (10 + i) * 1000000000ull + (i == 3 ? 1000000000ull : 0);
    s.push_back({2 * i + 2, mono, 0, 0, 5000 + 2 * (10 + i) * 1000000000ull, {}});
  }
  std::swap(s[1], s[4]);  // Order in the region does not matter.
  TscToMono conv(s);
  ASSERT_TRUE(conv.usable());
  EXPECT_EQ(conv.dropped(), 1u);
  EXPECT_EQ(conv.used(), 5u);
  EXPECT_NEAR(conv.tsc_hz(), 2e9, 1);
  EXPECT_EQ(*conv.ToMonoNs(5000 + 2 * 13500000000ull), 13500000000u);
}

TEST(TscToMono, OutsideTheSamplesTheOverallRateIsUsed) {
  // The last pair is 1 ppm off (a slewed clock): beyond it, the rate over
  // all samples continues from the last one.
  const std::vector<region::ClockSync> s = {{2, 1000000000, 0, 0, 3000000000, {}},
                                            {4, 2000000000, 0, 0, 6000000000, {}},
                                            {6, 3000001000, 0, 0, 9000000000, {}}};
  TscToMono conv(s);
  ASSERT_EQ(conv.used(), 3u);
  const double rate = (3000001000.0 - 1000000000.0) / (9000000000.0 - 3000000000.0);
  EXPECT_EQ(*conv.ToMonoNs(12000000000), 3000001000u + static_cast<uint64_t>(3000000000.0 * rate));
  EXPECT_EQ(*conv.ToMonoNs(7500000000), 2500000500u);  // Inside: between the two nearest.
}

TEST(TscToMono, Malicious_RandomSamplesNeverCrashAndKeepOrder) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 500; ++round) {
    std::vector<region::ClockSync> s(rng() % 17);
    for (region::ClockSync& c : s) {
      c.seq = rng();
      c.mono_ns = round % 2 ? rng() : rng() % 100000000000ull;
      c.tsc = round % 3 ? rng() : 3 * c.mono_ns + rng() % 1000;
    }
    TscToMono conv(s);
    EXPECT_LE(conv.used() + conv.dropped(), s.size());
    if (!conv.usable()) continue;
    // The conversion never reverses two stamps.
    std::vector<uint64_t> t(50);
    for (uint64_t& x : t) x = rng() >> (rng() % 64);
    std::sort(t.begin(), t.end());
    std::optional<uint64_t> prev;
    for (uint64_t x : t) {
      const std::optional<uint64_t> m = conv.ToMonoNs(x);
      if (!m) continue;
      if (prev) {
        EXPECT_LE(*prev, *m) << "round " << round;
      }
      prev = m;
    }
  }
}

TEST(RegionTimeline, ConvertsOnlyTscRingsToTheKernelsTraceClock) {
  const std::vector<region::ClockSync> s = {{2, 1000000000, 1500000000, 0, 3000000000, {}},
                                            {4, 2000000000, 2500000000, 0, 6000000000, {}}};
  const RegionTimeline mono(region::kClockMono, s);
  EXPECT_EQ(mono.ModeOf(region::kClockTsc), RegionTimeline::Mode::kConvert);
  EXPECT_EQ(mono.ModeOf(region::kClockMono), RegionTimeline::Mode::kAsIs);
  EXPECT_EQ(*mono.ToTraceClock(region::kClockTsc, 4500000000), 1500000000u);
  EXPECT_EQ(*mono.ToTraceClock(region::kClockMono, 77), 77u);
  // A "boot" trace clock: the samples' CLOCK_BOOTTIME.
  const RegionTimeline boot(region::kClockBoot, s);
  EXPECT_EQ(*boot.ToTraceClock(region::kClockTsc, 4500000000), 2000000000u);
  // An "x86-tsc" trace clock: TSC rings are already on it.
  const RegionTimeline tsc(region::kClockTsc, std::span<const region::ClockSync>());
  EXPECT_EQ(tsc.ModeOf(region::kClockTsc), RegionTimeline::Mode::kAsIs);
  // No samples: a TSC ring cannot be placed.
  const RegionTimeline none(region::kClockMono, std::span<const region::ClockSync>());
  EXPECT_EQ(none.ModeOf(region::kClockTsc), RegionTimeline::Mode::kUnplaceable);
  EXPECT_FALSE(none.ToTraceClock(region::kClockTsc, 5).has_value());
}

}  // namespace
}  // namespace hvtrace
