#pragma once
// Kernel tuning: launch-shape choices that never change results beyond
// rounding, carried by the Stream (so a recorded step bakes in the tuning it
// was recorded with) and set by the CLI/bench flags. The defaults are what
// the measurements in docs/design.md chose; the other values exist for
// experiments (`kvgraph bench --tune gemv=warp4,attn-heads=2`).
#include <cstdint>
#include <string>
#include <string_view>

namespace kvgraph {

struct Tuning {
  // Launch shape of the T == 1 GEMV. automatic: a block per row pair for
  // long rows (K >= 2048 bf16), a warp per row pair otherwise.
  // mma / mma8 / mma16: bf16 weights on the tensor cores, one kernel for
  // every step of up to 8 tokens (8 or 16 rows a block; mma picks by N):
  // a 5-token verify step costs ~1.2x a one-token step instead of ~1.5x,
  // but the one-token step is 18% slower than the default (H100,
  // llama3.1-8b: 6.56 vs 5.58 ms; docs/design.md), so it is not the default.
  // mmax: the same products with x staged through shared memory (one
  // float a lane a token in registers), so registers go to weights in flight
  // (H100, llama3.1-8b: 6.15 ms, verify 1.26x). (A split along K over a
  // thread-block cluster, session 23, measured 6.7-7.2 ms and verify 1.5-2x
  // on the same card and was removed: docs/design.md.)
  enum class Gemv : uint8_t { automatic, block2, warp2, warp4, mma, mma8, mma16, mmax };
  Gemv gemv = Gemv::automatic;
  // Decode (T <= kMaxDecodeQueries) attention: fast (the decode kernel,
  // K/V rows read straight from global memory), staged (the decode kernel
  // with its K/V tiles copied to shared memory by cp.async, coalesced and
  // double buffered; 16-bit pools at head dim 64/128/256), mma (tensor
  // cores, each warp its own cp.async pipeline, q and P carried as two
  // rounded halves; 16-bit pools at head dim 64/128/256), legacy (through
  // the T > 1 kernel, for comparison). automatic: mma over spans of more
  // than 2K keys at head dim 128 (16-bit and, for one-token steps,
  // quantized pools), staged at head dim 256, fast otherwise
  // (H200: mma 1.3-1.8x faster on llama3.1-8b at 8K-128K keys, slower at
  // head dims 64 and 256; staged 11-21% faster on gemma3-1b; figures in
  // docs/design.md).
  enum class DecodeAttn : uint8_t { automatic, fast, staged, legacy, mma };
  DecodeAttn decode_attn = DecodeAttn::automatic;
  int attn_heads = 0;   // most query heads per decode block (1, 2, 4, 8); 0: by span
  // Steps of 2..kMaxDecodeQueries queries (a speculative verify step) over
  // f32/16-bit pools under the fast decode kernel: query heads a block (1,
  // 2, 4, 8; 0: automatic, 4 or the one-token step's if more), so each K/V
  // row is read once for that many heads, with the split count a one-token
  // step takes (each row stays bitwise a one-token step's: a head's sums do
  // not depend on its block's heads). H100, 5-token verify step: llama3.1-8b
  // 8.49 -> 8.10 ms, llama3.2-1b 1.96 -> 1.85 (2 and 8 within 1% at 8B;
  // 8 slower on qwen2.5-0.5b); decode unchanged.
  int verify_heads = 0;
  int attn_chunk = 0;   // fewest keys per decode split; 0: from the head dim
  // How a decode step's splits merge: cluster (the step's splits of one head
  // group are one thread-block cluster, up to kMaxClusterSplits of them; each
  // keeps its partial in shared memory and the blocks merge them through
  // distributed shared memory, no global partials, fence or counter) or
  // global (partials in global memory, the last block to arrive merges).
  // cluster applies to the fast and staged decode kernels and to the one
  // over quantized pools (not the tensor-core ones) when the step has
  // 2..kMaxClusterSplits splits, else global; both give the same bits (the
  // same sums in the same order).
  enum class AttnMerge : uint8_t { cluster, global };
  AttnMerge attn_merge = AttnMerge::cluster;
  static constexpr int kMaxClusterSplits = 16;
  // The fast and quantized decode kernels ask L1 for their first tile's
  // pool rows (prefetch.global.L1) before the prologue (off: not measured
  // on a GPU yet; docs/design.md "Short spans").
  bool attn_prefetch = false;
  // Programmatic dependent launch on every CUDA kernel.
  bool programmatic_launch = true;
  // T == 1 on affine-quantized weights: x quantized to int8 per vector of
  // the weights (once per block, in shared memory) and integer dot products
  // (DP4A), the default since its H200 run (8B int4 5.2 -> 2.6 ms/token,
  // held-out perplexity +0.03-0.05%); qx=f32: f32 x with the codes converted
  // in the weight stream, which is what steps of 2-8 tokens always use (so
  // speculative decoding, whose verify rows must be decode rows, takes it).
  bool quantized_int8_x = true;
  // qx=int8 kernel: stream (weights staged in shared memory by cp.async,
  // each warp its own ring; the default where scales and biases allow it) or
  // regs (qgemv_x8_kernel: the stream held in registers, one batch ahead).
  bool quantized_stream = true;
  // qgemv=blocks: qgemv_blocks_kernel instead (a block of 2-8 rows x the
  // whole K in registers, after xprep_kernel has quantized x once for the
  // whole grid; linear.cu).
  bool quantized_blocks = false;
  // The streamed kernel's ring: qring_chunk code vectors of both rows of a
  // warp's pair a stage, qring_stages stages a warp (a pair of kQRings
  // below: what is compiled), at most qring_blocks
  // 256-thread blocks an SM (0: as many as fit). qring_chunk 0: automatic
  // (64 x 4, as many blocks as fit: the sweep in docs/design.md).
  int qring_chunk = 0;
  int qring_stages = 0;
  int qring_blocks = 0;
  // The compiled rings {chunk, stages}: the one list the CUDA launcher
  // instantiates and the parser accepts. Not 128 x 3 (the default before
  // 2026-12-06): with the one-pass quantize_x, CUDA 13's ptxas emits one of
  // its cp.async copies as `LDGSTS.E.BYPASS.128 [R25+UR0], desc[UR1][..]`,
  // a memory descriptor in an odd uniform register, and every launch dies
  // with cudaErrorIllegalInstruction (H100 and H200; compute-sanitizer
  // names the cp.async; docs/design.md). 64 x 3 fails the same way at int4
  // (int8 ran, no faster than 64 x 4): three stages are out while ptxas
  // does this.
  static constexpr int kQRings[4][2] = {{128, 4}, {64, 4}, {64, 6}, {32, 8}};
  // The several-token GEMV (2..8 tokens: verify steps, short prefill chunks):
  // rows per thread group and load batches in flight. Every variant sums
  // each token's row as the one-token GEMV does (bitwise); they differ in
  // registers and occupancy. p4u2 / p2u4 / p8u1 (bf16/f16 weights, long
  // rows; else r4u2): the block on 4 / 2 / 8 rows, 2 / 4 / 1 vectors a row a
  // batch, the next batch's loads in flight while this one computes,
  // accumulators for exactly T. h8u1 / h4u2 / h4u1: the same blocks, each
  // weight vector widened to f32 once for all tokens. s8x3 / s4x4 / s4x6:
  // 8 / 4 rows, the weights streamed by cp.async through a ring of 3 / 4 /
  // 6 stages in shared memory. automatic: p4u2 at T = 2, p8u1 above, r4u2
  // for f32 weights and short rows (fastest on the H200, figures in
  // src/ops/cuda/linear.cu).
  enum class Multi : uint8_t { automatic, r8u2, r4u2, r8u1, r4u4, p4u2, p2u4, p8u1, h8u1, h4u2, h4u1, s8x3, s4x4, s4x6 };
  Multi multi = Multi::automatic;
  // Attention of steps of more than kMaxDecodeQueries tokens (prefill chunks)
  // over bf16/f16 pools at head dim 64/128/256: legacy (attend_kernel, f32
  // FMAs, one block per query) or flash (tensor cores, FlashAttention-2
  // style tiles of 64 queries; q and P rounded to the K/V type; the default
  // since its H200 run: 8B prefill of 8K tokens 2.8K -> 22.8K tokens/s). Other
  // storage, head dims and short steps keep the legacy kernels either way.
  enum class PrefillAttn : uint8_t { legacy, flash };
  PrefillAttn prefill_attn = PrefillAttn::flash;
  // Steps of 9..qmma_tokens tokens on affine-quantized weights take the fused
  // tensor-core GEMM (LinearParams::qmma_tokens; at most 512 apply), longer
  // ones the dequantised slabs for cuBLAS; 0: always the slabs; -1
  // (qmma=auto): the launcher's default.
  int qmma_tokens = -1;

  // Spelled out: the CUDA sources, which include this, are C++17.
  bool operator==(const Tuning& o) const {
    return gemv == o.gemv && decode_attn == o.decode_attn && attn_heads == o.attn_heads && verify_heads == o.verify_heads &&
           attn_chunk == o.attn_chunk && attn_merge == o.attn_merge && attn_prefetch == o.attn_prefetch && programmatic_launch == o.programmatic_launch &&
           quantized_int8_x == o.quantized_int8_x && quantized_stream == o.quantized_stream &&
           quantized_blocks == o.quantized_blocks &&
           qring_chunk == o.qring_chunk && qring_stages == o.qring_stages && qring_blocks == o.qring_blocks &&
           multi == o.multi &&
           prefill_attn == o.prefill_attn && qmma_tokens == o.qmma_tokens;
  }

  // "gemv=auto,attn=auto,attn-heads=auto,verify-heads=auto,attn-chunk=auto,attn-merge=cluster,attn-prefetch=off,pdl=on,qx=int8,qgemv=stream,qring=auto,mt=auto,prefill-attn=flash,qmma=auto":
  // every field, in the form parse() reads.
  std::string describe() const;
  // Comma-separated key=value pairs over the defaults (keys: gemv
  // auto|block2|warp2|warp4, attn auto|fast|staged|legacy, attn-heads 0|1|2|4|8,
  // attn-chunk N >= 0, attn-merge cluster|global, attn-prefetch on|off, pdl on|off, qx f32|int8, qgemv stream|regs, qring auto|CxS|CxSxB, mt auto|r8u2|r4u2|r8u1|r4u4,
  // prefill-attn legacy|flash, qmma auto|N >= 0). Throws kvgraph::Error("[tuning] ...") on an
  // unknown key or value.
  static Tuning parse(std::string_view spec);
};

}  // namespace kvgraph
