// kvgraph_kernel_bench: timed reports of single CUDA kernels on decode shapes.
// A timed number is a benchmark, not a test: these reports were once GPU
// tests (GemvBandwidthReport, DecodeBandwidthReport, the bandwidth probes)
// and moved here so the GPU suite runs end to end under compute-sanitizer.
//
//   kvgraph_kernel_bench [bandwidth] [gemv] [qgemv] [attention]   (default: all)
//
// Every line names the shape, the time per launch and the bandwidth it
// reaches; gemv lines also give the fraction of the streaming-read probe
// measured in the same process (PERF.md: the target is >= 90% on large
// shapes).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "kvgraph/dtype.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/runtime.h"

namespace kvgraph::cuda {
namespace {

void fill(DeviceBuffer& b, int byte) { KVGRAPH_CUDA_CHECK(cudaMemset(b.data(), byte, b.bytes())); }

void bandwidth_report() {
  std::printf("[bandwidth] device-to-device copy (read + write): %.0f GB/s; streaming read: %.0f GB/s\n",
              measure_copy_bandwidth_gbs(), measure_read_bandwidth_gbs());
}

// Decode-shaped GEMVs (bf16 weights, T = 1): every launch shape, plain and
// with the RMSNorm prologue, weights rotated through enough copies that they
// cannot sit in L2.
void gemv_report() {
  const double read_gbs = measure_read_bandwidth_gbs();
  struct Shape {
    const char* name;
    int N, K;
  };
  const Shape shapes[] = {
      {"llama1b.qkv 3072x2048", 3072, 2048},       {"llama1b.o 2048x2048", 2048, 2048},
      {"llama1b.gate_up 16384x2048", 16384, 2048}, {"llama1b.down 2048x8192", 2048, 8192},
      {"llama1b.lm_head 128256x2048", 128256, 2048}, {"llama8b.qkv 6144x4096", 6144, 4096},
      {"llama8b.gate_up 28672x4096", 28672, 4096}, {"llama8b.down 4096x14336", 4096, 14336},
      {"qwen0.5b.qkv 1152x896", 1152, 896},        {"qwen0.5b.o 896x896", 896, 896},
      {"qwen0.5b.gate_up 9728x896", 9728, 896},    {"qwen0.5b.down 896x4864", 896, 4864},
      {"qwen0.5b.lm_head 151936x896", 151936, 896}, {"gemma1b.gate_up 13824x1152", 13824, 1152},
  };
  const std::pair<GemvShape, const char*> variants[] = {
      {GemvShape::automatic, "auto"}, {GemvShape::block2, "block2"}, {GemvShape::warp2, "warp2"},
      {GemvShape::warp4, "warp4"}};
  CudaStream s;
  CudaEvent e0, e1;
  for (const Shape& sh : shapes) {
    DeviceBuffer w(size_t(sh.N) * sh.K * 2), x(size_t(sh.K) * 4), g(size_t(sh.K) * 4), out(size_t(sh.N) * 4);
    fill(w, 0x3c);  // bf16 ~0.01
    fill(x, 0x3c);
    fill(g, 0x3c);
    const int copies = std::max<int>(1, int((200ull << 20) / w.bytes()) + 1);
    std::vector<DeviceBuffer> extra;
    for (int c = 1; c < copies; ++c) {
      extra.emplace_back(w.bytes());
      fill(extra.back(), 0x3c);
    }
    std::string line;
    double auto_gbs = 0;
    for (bool norm : {false, true}) {
      line += norm ? " | norm" : "";
      for (const auto& [variant, vname] : variants) {
        LinearParams p;
        p.shape = variant;
        p.x = x.as<float>();
        p.w = w.data();
        p.w_dtype = DType::BF16;
        p.out = out.as<float>();
        p.N = sh.N;
        p.K = sh.K;
        if (norm) p.norm = g.as<float>();
        const int iters = 60;
        for (int i = 0; i < 5; ++i) linear(p, nullptr, s.get());
        e0.record(s.get());
        for (int i = 0; i < iters; ++i) {
          const int c = i % copies;
          p.w = c == 0 ? w.data() : extra[c - 1].data();
          linear(p, nullptr, s.get());
        }
        e1.record(s.get());
        e1.synchronize();
        const double us = 1e3 * CudaEvent::elapsed_ms(e0, e1) / iters;
        if (variant == GemvShape::automatic && !norm) auto_gbs = double(w.bytes()) / (us * 1e-6) / 1e9;
        char buf[64];
        std::snprintf(buf, sizeof buf, " %s %.1f", vname, us);
        line += buf;
      }
    }
    std::printf("[gemv bf16] %-28s %5.1f%% of %.0f GB/s (auto) | us:%s\n", sh.name, 100.0 * auto_gbs / read_gbs,
                read_gbs, line.c_str());
  }
}

// Quantized GEMVs (T = 1, affine groups, bf16 scales and biases): time per
// launch and the bandwidth of the bytes read (words + scales + biases), as a
// fraction of the streaming-read probe: f32 x in each launch shape, then
// int8 x (qgemv_stream_kernel, and qgemv_x8_kernel as int8x-regs).
void qgemv_report() {
  const double read_gbs = measure_read_bandwidth_gbs();
  struct Shape {
    const char* name;
    int N, K;
  };
  const Shape shapes[] = {{"llama1b.qkv 3072x2048", 3072, 2048},       {"llama1b.gate_up 16384x2048", 16384, 2048},
                          {"llama1b.down 2048x8192", 2048, 8192},      {"llama1b.lm_head 128256x2048", 128256, 2048},
                          {"llama8b.qkv 6144x4096", 6144, 4096},       {"llama8b.o 4096x4096", 4096, 4096},
                          {"llama8b.gate_up 28672x4096", 28672, 4096}, {"llama8b.down 4096x14336", 4096, 14336},
                          {"llama8b.lm_head 128256x4096", 128256, 4096}};
  const std::pair<GemvShape, const char*> variants[] = {
      {GemvShape::automatic, "auto"}, {GemvShape::block2, "block2"}, {GemvShape::warp2, "warp2"},
      {GemvShape::warp4, "warp4"}};
  CudaStream s;
  CudaEvent e0, e1;
  for (int bits : {4, 8}) {
    const int group = 64;
    for (const Shape& sh : shapes) {
      const size_t wbytes = size_t(sh.N) * sh.K * bits / 8, sbytes = size_t(sh.N) * (sh.K / group) * 2;
      const size_t bytes = wbytes + 2 * sbytes;
      const int copies = std::max<int>(1, int((200ull << 20) / bytes) + 1);
      std::vector<DeviceBuffer> w, sc, bi;
      for (int c = 0; c < copies; ++c) {
        w.emplace_back(wbytes);
        sc.emplace_back(sbytes);
        bi.emplace_back(sbytes);
        fill(w.back(), 0x5a);
        fill(sc.back(), 0x3c);
        fill(bi.back(), 0xbc);
      }
      DeviceBuffer x(size_t(sh.K) * 4), out(size_t(sh.N) * 4);
      fill(x, 0x3c);
      std::string line;
      double auto_gbs = 0;
      for (int vi = 0; vi < 6; ++vi) {  // the f32-x shapes, then int8 x streamed and in registers
        const GemvShape variant = vi < 4 ? variants[vi].first : GemvShape::automatic;
        const char* vname = vi < 4 ? variants[vi].second : vi == 4 ? "int8x" : "int8x-regs";
        LinearParams p;
        p.shape = variant;
        p.int8_x = vi >= 4;
        p.qstream = vi != 5;
        p.x = x.as<float>();
        p.w_dtype = DType::BF16;
        p.qbits = bits;
        p.group = group;
        p.out = out.as<float>();
        p.N = sh.N;
        p.K = sh.K;
        auto point = [&](int c) {
          p.w = w[c].data();
          p.scales = sc[c].data();
          p.biases = bi[c].data();
        };
        const int iters = 60;
        point(0);
        for (int i = 0; i < 5; ++i) linear(p, nullptr, s.get());
        e0.record(s.get());
        for (int i = 0; i < iters; ++i) {
          point(i % copies);
          linear(p, nullptr, s.get());
        }
        e1.record(s.get());
        e1.synchronize();
        const double us = 1e3 * CudaEvent::elapsed_ms(e0, e1) / iters;
        if (vi == 0) auto_gbs = double(bytes) / (us * 1e-6) / 1e9;
        char buf[64];
        std::snprintf(buf, sizeof buf, " %s %.1f (%.0f%%)", vname, us, 100.0 * double(bytes) / (us * 1e-6) / 1e9 / read_gbs);
        line += buf;
      }
      std::printf("[qgemv int%d g%d] %-28s %5.1f%% of %.0f GB/s (auto, %.1f MB read) | us:%s\n", bits, group, sh.name,
                  100.0 * auto_gbs / read_gbs, read_gbs, bytes / 1e6, line.c_str());
    }
  }
}

// Decode attention (T = 1, bf16 pools) at long contexts and at the bench's
// context with several chunk floors: achieved K+V read bandwidth.
void attention_report() {
  struct Shape {
    const char* name;
    int Hq, Hkv, D, L;
    int min_chunk = 128;  // as the session's workspace
    int max_splits = 0;   // 0: choose_splits
  };
  const Shape shapes[] = {{"llama8b layer, 8K ctx", 32, 8, 128, 8192},
                          {"llama8b layer, 32K ctx", 32, 8, 128, 32768},
                          {"llama1b layer, 4K ctx", 32, 8, 64, 4096},
                          {"gemma3-1b global layer, 8K ctx", 4, 1, 256, 8192},
                          {"qwen0.5b layer, 8K ctx", 14, 2, 64, 8192},
                          {"qwen0.5b 640 ctx, chunk>=128", 14, 2, 64, 640, 128, 64},
                          {"qwen0.5b 640 ctx, chunk>=64", 14, 2, 64, 640, 64, 64},
                          {"qwen0.5b 640 ctx, chunk>=32", 14, 2, 64, 640, 32, 64},
                          {"qwen0.5b 640 ctx, chunk>=16", 14, 2, 64, 640, 16, 64},
                          {"llama1b 640 ctx, chunk>=128", 32, 8, 64, 640, 128, 64},
                          {"llama1b 640 ctx, chunk>=32", 32, 8, 64, 640, 32, 64},
                          {"gemma3-1b 640 ctx, chunk>=128", 4, 1, 256, 640, 128, 64},
                          {"gemma3-1b 640 ctx, chunk>=32", 4, 1, 256, 640, 32, 64}};
  CudaStream s;
  CudaEvent e0, e1;
  for (const Shape& sh : shapes) {
    const size_t pool_bytes = size_t(sh.Hkv) * sh.L * sh.D * 2;
    DeviceBuffer kp(pool_bytes), vp(pool_bytes), q(size_t(sh.Hq) * sh.D * 4), kv(size_t(sh.Hkv) * sh.D * 4),
        out(size_t(sh.Hq) * sh.D * 4), pos(4);
    fill(kp, 0x3c);
    fill(vp, 0x3c);
    fill(q, 0);
    fill(kv, 0);
    const int32_t last = sh.L - 1;
    pos.upload(&last, sizeof last);
    AttentionWorkspace ws(sh.Hq, sh.D, sh.max_splits ? sh.max_splits : AttentionWorkspace::choose_splits(sh.Hkv, sh.L),
                          sh.min_chunk);
    AttentionParams p;
    p.q = q.as<float>();
    p.k = p.v = kv.as<float>();
    p.k_pool = kp.data();
    p.v_pool = vp.data();
    p.k_format = p.v_format = DType::BF16;
    p.out = out.as<float>();
    p.pos = pos.as<int32_t>();
    p.rule = SlotRule{sh.L, 0};
    p.n_q_heads = sh.Hq;
    p.n_kv_heads = sh.Hkv;
    p.head_dim = sh.D;
    p.scale = 0.1f;
    for (int i = 0; i < 3; ++i) update_and_attend(p, ws, s.get());
    const int iters = 50;
    e0.record(s.get());
    for (int i = 0; i < iters; ++i) update_and_attend(p, ws, s.get());
    e1.record(s.get());
    e1.synchronize();
    const double us = 1e3 * CudaEvent::elapsed_ms(e0, e1) / iters;
    std::printf("[attention decode bf16] %-32s splits %2d  %7.1f us  %6.0f GB/s of K+V\n", sh.name, ws.max_splits(), us,
                2.0 * pool_bytes / (us * 1e-6) / 1e9);
  }
}

}  // namespace
}  // namespace kvgraph::cuda

int main(int argc, char** argv) {
  using namespace kvgraph::cuda;
  std::vector<std::string> what(argv + 1, argv + argc);
  if (what.empty()) what = {"bandwidth", "gemv", "qgemv", "attention"};
  try {
    if (device_count() == 0) {
      std::fprintf(stderr, "kvgraph_kernel_bench: error: no CUDA device\n");
      return 1;
    }
    for (const std::string& w : what) {
      if (w == "bandwidth") bandwidth_report();
      else if (w == "gemv") gemv_report();
      else if (w == "qgemv") qgemv_report();
      else if (w == "attention") attention_report();
      else {
        std::fprintf(stderr, "kvgraph_kernel_bench: error: unknown report \"%s\": expected bandwidth, gemv, qgemv or attention\n",
                     w.c_str());
        return 2;
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvgraph_kernel_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
