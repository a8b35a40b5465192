// Tuning: the typed kernel choices that replaced environment variables.
#include "kvgraph/tuning.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kvgraph/error.h"
#include "kvgraph/stream.h"

using namespace kvgraph;
using ::testing::HasSubstr;

TEST(Tuning, DefaultsDescribeThemselvesAndParseBack) {
  const Tuning t;
  EXPECT_EQ(t.describe(), "gemv=auto,attn=auto,attn-heads=auto,verify-heads=auto,attn-chunk=auto,attn-merge=cluster,attn-prefetch=off,pdl=on,qx=int8,qgemv=stream,qring=auto,mt=auto,prefill-attn=flash,qmma=auto");
  EXPECT_EQ(Tuning::parse(t.describe()), t);
  EXPECT_EQ(Tuning::parse(""), t);
}

TEST(Tuning, EveryKeyParses) {
  const Tuning t =
      Tuning::parse("gemv=warp4,attn=legacy,attn-heads=2,verify-heads=1,attn-chunk=64,attn-merge=global,attn-prefetch=on,pdl=off,qx=f32,qgemv=regs,qring=32x8x2,mt=r4u2,prefill-attn=legacy,qmma=256");
  EXPECT_EQ(t.gemv, Tuning::Gemv::warp4);
  EXPECT_EQ(t.decode_attn, Tuning::DecodeAttn::legacy);
  EXPECT_EQ(t.attn_heads, 2);
  EXPECT_EQ(t.verify_heads, 1);
  EXPECT_EQ(t.attn_chunk, 64);
  EXPECT_EQ(t.attn_merge, Tuning::AttnMerge::global);
  EXPECT_TRUE(t.attn_prefetch);
  EXPECT_FALSE(t.programmatic_launch);
  EXPECT_FALSE(t.quantized_int8_x);
  EXPECT_FALSE(t.quantized_stream);
  EXPECT_EQ(t.qring_chunk, 32);
  EXPECT_EQ(t.qring_stages, 8);
  EXPECT_EQ(t.qring_blocks, 2);
  EXPECT_EQ(t.multi, Tuning::Multi::r4u2);
  EXPECT_EQ(t.prefill_attn, Tuning::PrefillAttn::legacy);
  EXPECT_EQ(t.qmma_tokens, 256);
  EXPECT_EQ(Tuning::parse(t.describe()), t);
  EXPECT_EQ(Tuning::parse("qmma=0").qmma_tokens, 0);  // 0: always the slabs, not auto
  const Tuning blocks = Tuning::parse("qgemv=blocks");
  EXPECT_TRUE(blocks.quantized_blocks);
  EXPECT_TRUE(blocks.quantized_stream);  // (where the blocks kernel does not fit)
  EXPECT_EQ(Tuning::parse(blocks.describe()), blocks);
  EXPECT_FALSE(Tuning::parse("qgemv=blocks,qgemv=regs").quantized_blocks);
  EXPECT_NE(Tuning::parse("qmma=0"), Tuning{});
  EXPECT_EQ(Tuning::parse("qmma=auto"), Tuning{});
  EXPECT_EQ(Tuning{}.prefill_attn, Tuning::PrefillAttn::flash);
  EXPECT_NE(Tuning::parse("prefill-attn=legacy"), Tuning{});
  EXPECT_EQ(Tuning::parse("prefill-attn=flash"), Tuning{});
  EXPECT_EQ(Tuning::parse("gemv=block2").gemv, Tuning::Gemv::block2);
  const Tuning staged = Tuning::parse("attn=staged");
  EXPECT_EQ(staged.decode_attn, Tuning::DecodeAttn::staged);
  EXPECT_EQ(Tuning::parse("attn=fast").decode_attn, Tuning::DecodeAttn::fast);
  EXPECT_NE(Tuning::parse("attn=fast"), Tuning{});
  EXPECT_EQ(Tuning::parse(staged.describe()), staged);
  EXPECT_NE(staged, Tuning{});
  EXPECT_NE(Tuning::parse("gemv=block2"), Tuning{});
}

TEST(Tuning, EveryGemvAndMultiNameParsesToItsValue) {
  using G = Tuning::Gemv;
  using M = Tuning::Multi;
  for (auto [name, g] : {std::pair{"auto", G::automatic}, {"block2", G::block2}, {"warp2", G::warp2}, {"warp4", G::warp4},
                         {"mma", G::mma}, {"mma8", G::mma8}, {"mma16", G::mma16}, {"mmax", G::mmax}})
    EXPECT_EQ(Tuning::parse(std::string("gemv=") + name).gemv, g) << name;
  for (auto [name, m] : {std::pair{"auto", M::automatic}, {"r8u2", M::r8u2}, {"r4u2", M::r4u2}, {"r8u1", M::r8u1},
                         {"r4u4", M::r4u4}, {"p4u2", M::p4u2}, {"p2u4", M::p2u4}, {"p8u1", M::p8u1}, {"h8u1", M::h8u1}, {"h4u2", M::h4u2}, {"h4u1", M::h4u1}, {"s8x3", M::s8x3}, {"s4x4", M::s4x4}, {"s4x6", M::s4x6}})
    EXPECT_EQ(Tuning::parse(std::string("mt=") + name).multi, m) << name;
}

TEST(Tuning, EveryCompiledRingParsesWithAndWithoutABlockCap) {
  for (const auto& r : Tuning::kQRings) {
    const int c = r[0], st = r[1];
    const std::string shape = std::to_string(c) + "x" + std::to_string(st);
    const Tuning t = Tuning::parse("qring=" + shape);
    EXPECT_EQ(t.qring_chunk, c) << shape;
    EXPECT_EQ(t.qring_stages, st) << shape;
    EXPECT_EQ(t.qring_blocks, 0) << shape;
    EXPECT_EQ(Tuning::parse(t.describe()), t) << shape;
    EXPECT_NE(t, Tuning{}) << shape;
    for (int b : {1, 2, 8}) {
      const Tuning tb = Tuning::parse("qring=" + shape + "x" + std::to_string(b));
      EXPECT_EQ(tb.qring_chunk, c);
      EXPECT_EQ(tb.qring_stages, st);
      EXPECT_EQ(tb.qring_blocks, b);
      EXPECT_THAT(tb.describe(), HasSubstr("qring=" + shape + "x" + std::to_string(b) + ","));
      EXPECT_EQ(Tuning::parse(tb.describe()), tb);
      EXPECT_NE(tb, t);
    }
  }
  EXPECT_EQ(Tuning::parse("qring=64x4,qring=auto"), Tuning{});
}

TEST(Tuning, BadSpecsNameTheKeyAndValue) {
  auto expect_error = [](const char* spec, const char* what) {
    try {
      Tuning::parse(spec);
      ADD_FAILURE() << "no error for " << spec;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("[tuning]"));
      EXPECT_THAT(e.what(), HasSubstr(what)) << spec;
    }
  };
  expect_error("gemv=fast", "gemv=fast: expected auto, block2, warp2, warp4, mma, mma8, mma16 or mmax");
  expect_error("attn-heads=3", "attn-heads=3");
  expect_error("verify-heads=3", "verify-heads=3: expected auto, 1, 2, 4 or 8");
  expect_error("attn-chunk=-1", "attn-chunk=-1");
  expect_error("attn-chunk=12x", "attn-chunk=12x");
  expect_error("pdl=maybe", "pdl=maybe");
  expect_error("qgemv=fast", "qgemv=fast: expected stream, regs or blocks");
  for (const char* bad : {"qring=", "qring=64", "qring=64x", "qring=64x5", "qring=96x4", "qring=64x4x0", "qring=64x4x9",
                          "qring=64x4x-1", "qring=64x4x2x1", "qring=128x3", "qring=x4", "qring=64y4", "qring=64x4 ", "qring=fast"})
    expect_error(bad, (std::string(bad) + ": expected auto, CxS or CxSxB").c_str());
  expect_error("mt=r16u1", "mt=r16u1: expected auto, r8u2, r4u2, r8u1, r4u4, p4u2, p2u4, p8u1, h8u1, h4u2, h4u1, s8x3, s4x4 or s4x6");
  expect_error("mt=", "mt=: expected auto");
  expect_error("prefill-attn=fast", "prefill-attn=fast");
  expect_error("attn-merge=atomic", "attn-merge=atomic: expected cluster or global");
  expect_error("attn-prefetch=yes", "attn-prefetch=yes: expected on or off");
  expect_error("colour=blue", "unknown key \"colour\" (keys: gemv, attn, attn-heads, verify-heads, attn-chunk, attn-merge, attn-prefetch, pdl, qx, qgemv, qring, mt, prefill-attn, qmma)");
  expect_error("gemv", "expected key=value");
}

TEST(Tuning, ACpuStreamCarriesItAndANewTuningDropsTheRecording) {
  Stream s(Device::CPU, Tuning::parse("attn-heads=4"));
  EXPECT_EQ(s.tuning().attn_heads, 4);
  int runs = 0;
  s.begin_record();
  s.submit([&] { ++runs; });
  s.end_record();
  ASSERT_TRUE(s.has_recording());
  s.set_tuning(s.tuning());  // the same tuning keeps the recording
  EXPECT_TRUE(s.has_recording());
  s.set_tuning(Tuning{});
  EXPECT_FALSE(s.has_recording());
  EXPECT_EQ(runs, 0);
}

TEST(Tuning, ACudaStreamWithoutADeviceIsOneClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(Stream(Device::CUDA), Error);
  try {
    parse_device("cuda");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--device cuda"));
  }
}
