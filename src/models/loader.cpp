// Model::load: config.json + safetensors -> device tensors, named and
// shape-checked as the family schema (family.h) lists them, all of them
// before the first weight is read.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "kvgraph/error.h"
#include "kvgraph/fp8.h"
#include "kvgraph/model.h"
#include "kvgraph/quant.h"
#include "kvgraph/safetensors.h"
#include "models/family.h"

#include <nlohmann/json.hpp>

namespace kvgraph {

namespace {

// Converts host f32 values to a device tensor of `dtype` (f32 or bf16).
Tensor upload(const std::vector<float>& host, std::vector<int64_t> shape, DType dtype, Device device) {
  if (dtype == DType::F32) return Tensor::from_host(host.data(), std::move(shape), DType::F32, device);
  std::vector<uint16_t> h(host.size());
  for (size_t i = 0; i < host.size(); ++i) h[i] = f32_to_bf16(host[i]);
  return Tensor::from_host(h.data(), std::move(shape), DType::BF16, device);
}

// The checkpoint names of a quantized matrix part "X.weight": "X.scales", "X.biases".
std::string companion(const std::string& weight_name, const char* what) {
  const std::string suffix = ".weight";
  const bool has = weight_name.size() > suffix.size() &&
                   weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return (has ? weight_name.substr(0, weight_name.size() - suffix.size()) : weight_name) + "." + what;
}

// Parts of one Model tensor, each `rows[i]` rows of `row` elements, laid out
// as the plan says: stacked (all rows of each part in turn) or interleaved
// (row r of each part in turn). Row-wise, so it serves values, packed words,
// scales and biases alike.
template <typename T>
std::vector<T> fuse_rows(std::vector<std::vector<T>>&& parts, int64_t row, Fuse fuse) {
  if (parts.size() == 1) return std::move(parts.front());
  std::vector<T> all;
  if (fuse == Fuse::interleave) {
    const int64_t rows = static_cast<int64_t>(parts.front().size()) / row;
    for (int64_t r = 0; r < rows; ++r)
      for (const std::vector<T>& v : parts) all.insert(all.end(), v.begin() + r * row, v.begin() + (r + 1) * row);
  } else {
    for (const std::vector<T>& v : parts) all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// How one Model tensor is made: as stored (plain, or quantized in the
// checkpoint) or quantized on load.
struct TensorLoad {
  QuantFormat format;             // of the Model tensor (bits 0: plain)
  bool stored_quantized = false;  // the checkpoint holds words, scales and biases
  Fp8Format fp8;                  // stored fp8 with scales (dequantized at load), when quantized()
  bool fp8_on_load = false;       // a float linear layer rounded to fp8 blocks at load (--weights fp8)
};

// A float matrix part [rows, K] rounded as an fp8 checkpoint made from it
// holds it: e4m3 codes with a scale per 128 x 128 block (absmax / 448, 1
// where all zero; transformers' fine-grained FP8), dequantized as
// Loader::fp8_host reads such a checkpoint back.
void round_to_fp8_blocks(std::vector<float>& v, int64_t rows, int64_t K) {
  constexpr int64_t kB = 128;
  const int64_t cols = (K + kB - 1) / kB;
  std::vector<float> absmax(static_cast<size_t>((rows + kB - 1) / kB * cols), 0.0f);
  std::vector<char> finite(absmax.size(), 1);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t b = static_cast<size_t>((n / kB) * cols + k / kB);
      const float x = v[static_cast<size_t>(n * K + k)];
      absmax[b] = std::max(absmax[b], std::fabs(x));
      if (!std::isfinite(x)) finite[b] = 0;
    }
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t b = static_cast<size_t>((n / kB) * cols + k / kB);
      const float s = kv_fp8_scale(absmax[b], finite[b]);
      float& x = v[static_cast<size_t>(n * K + k)];
      x = kv_fp8_value(kv_fp8_code(x, s), s);
    }
}

// An fp8 matrix's scale tensor: "X.weight_scale_inv" (block) or "X.weight_scale".
std::string fp8_scale_name(const std::string& weight_name, const Fp8Format& f) {
  return companion(weight_name, f.scale_suffix());
}

// The shape the scale of an fp8 matrix [rows, K] must have. A per-tensor
// scale may also be a scalar (checked by the caller).
std::vector<int64_t> fp8_scale_shape(const Fp8Format& f, int64_t rows, int64_t K) {
  switch (f.scale) {
    case Fp8Format::Scale::block: return {(rows + f.block_n - 1) / f.block_n, (K + f.block_k - 1) / f.block_k};
    case Fp8Format::Scale::channel: return {rows, 1};
    default: return {1};
  }
}

bool stored_fp8(const WeightStore& store, const std::string& name) {
  return store.has(name) && store.stored_dtype(name).substr(0, 3) == "F8_";
}

struct Loader {
  const WeightStore& store;
  Device device;
  DType matrix_dtype;
  size_t total_bytes = 0;
  size_t done_bytes = 0;
  const ProgressFn& progress;
  size_t* weight_bytes;

  void count(size_t bytes) {
    done_bytes += bytes;
    if (progress) progress(done_bytes, total_bytes);
  }
  // One checkpoint tensor as f32 values on the host (shape-checked).
  std::vector<float> host(const std::string& name, const std::vector<int64_t>& shape) {
    WeightView w = store.get(name, shape);  // name, shape and dtype checked by check_tensors
    std::vector<float> v = to_f32(w);
    count(w.nbytes);
    return v;
  }
  // An fp8 matrix part [rows, K] dequantized exactly: e4m3 -> f32, times its
  // scale in f32. A NaN code is an error naming the element.
  std::vector<float> fp8_host(const std::string& name, const std::vector<int64_t>& shape, const Fp8Format& f) {
    const WeightView w = store.get_e4m3(name, shape);  // checked by check_tensors
    const WeightView sv = store.get(fp8_scale_name(name, f));
    const std::vector<float> scale = to_f32(sv);
    const int64_t rows = shape[0], K = shape[1];
    const int64_t scale_cols = f.scale == Fp8Format::Scale::block ? (K + f.block_k - 1) / f.block_k : 1;
    const auto* codes = reinterpret_cast<const uint8_t*>(w.data);
    std::vector<float> v(static_cast<size_t>(rows * K));
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t c = codes[n * K + k];
        if (e4m3_is_nan(c))
          fail("weights", "tensor \"{}\": element [{}, {}] is an fp8 NaN code (0x{:02X})", name, n, k, c);
        size_t si = 0;
        if (f.scale == Fp8Format::Scale::block) si = static_cast<size_t>((n / f.block_n) * scale_cols + k / f.block_k);
        else if (f.scale == Fp8Format::Scale::channel) si = static_cast<size_t>(n);
        v[static_cast<size_t>(n * K + k)] = e4m3_to_f32(c) * scale[si];
      }
    }
    count(w.nbytes + sv.nbytes);
    return v;
  }
  std::vector<uint32_t> words(const std::string& name, const std::vector<int64_t>& shape) {
    WeightView w = store.get(name, shape);
    std::vector<uint32_t> v(static_cast<size_t>(w.numel()));
    std::memcpy(v.data(), w.data, w.nbytes);  // little-endian, as safetensors stores it
    count(w.nbytes);
    return v;
  }
  Weight quantized(std::vector<uint32_t>&& w, std::vector<float>&& scales, std::vector<float>&& biases,
                   int64_t N, int64_t K, QuantFormat f) {
    Weight q;
    q.format = f;
    q.w = Tensor::from_host(w.data(), {N, K * f.bits / 32}, DType::U32, device);
    q.scales = upload(scales, {N, K / f.group}, matrix_dtype, device);
    q.biases = upload(biases, {N, K / f.group}, matrix_dtype, device);
    *weight_bytes += q.nbytes();
    return q;
  }
  Weight make(const TensorPlan& plan, const TensorLoad& how) {
    const std::vector<int64_t> shape = plan.shape();
    const int64_t N = shape[0], K = shape.size() > 1 ? shape[1] : 1;
    if (how.stored_quantized) {
      const QuantFormat f = how.format;
      std::vector<std::vector<uint32_t>> w;
      std::vector<std::vector<float>> sc, bi;
      for (const TensorPlan::Part& p : plan.parts) {
        const int64_t rows = p.shape[0];
        w.push_back(words(p.name, {rows, K * f.bits / 32}));
        sc.push_back(host(companion(p.name, "scales"), {rows, K / f.group}));
        bi.push_back(host(companion(p.name, "biases"), {rows, K / f.group}));
      }
      return quantized(fuse_rows(std::move(w), K * f.bits / 32, plan.fuse),
                       fuse_rows(std::move(sc), K / f.group, plan.fuse),
                       fuse_rows(std::move(bi), K / f.group, plan.fuse), N, K, f);
    }
    std::vector<std::vector<float>> parts;
    for (const TensorPlan::Part& p : plan.parts) {
      if (how.fp8.quantized()) {
        parts.push_back(fp8_host(p.name, p.shape, how.fp8));
      } else {
        parts.push_back(host(p.name, p.shape));
        if (how.fp8_on_load) round_to_fp8_blocks(parts.back(), p.shape[0], p.shape[1]);
      }
    }
    std::vector<float> all = fuse_rows(std::move(parts), shape.size() > 1 ? K : 1, plan.fuse);
    if (how.format.quantized()) {
      const QuantFormat f = how.format;
      std::vector<uint32_t> w(static_cast<size_t>(N * K * f.bits / 32));
      std::vector<float> sc(static_cast<size_t>(N * (K / f.group))), bi(sc.size());
      affine_quantize(all.data(), N, K, f.bits, f.group, w.data(), sc.data(), bi.data());
      return quantized(std::move(w), std::move(sc), std::move(bi), N, K, f);
    }
    Tensor t = upload(all, shape, plan.role == Role::norm ? DType::F32 : matrix_dtype, device);
    *weight_bytes += t.nbytes();
    return Weight(t);
  }
};

// See CheckpointNames; a multimodal checkpoint's layout is told by where its embedding is.
CheckpointNames checkpoint_names(const WeightStore& store, const ModelConfig& c) {
  if (!c.nested_text_config) return {};
  if (store.has("language_model.model.embed_tokens.weight")) return {"language_model.model.", "language_model."};
  if (store.has("model.language_model.embed_tokens.weight")) return {"model.language_model.", ""};
  return {};  // the usual missing-tensor error names "model.embed_tokens.weight"
}

// A checkpoint whose tensors the config does not account for is a checkpoint
// the config does not describe (num_hidden_layers too small, the wrong
// model_type, ...): running it would silently ignore weights, so it is an
// error listing them, as transformers lists unused weights. Harmless extras
// are skipped: RoPE tables some exporters save, the lm_head of a tied
// checkpoint, and everything outside the text decoder of a multimodal one
// (vision tower, projector).
void check_unused(const WeightStore& store, const ModelConfig& c, const CheckpointNames& names,
                  const std::vector<TensorPlan>& plans, const std::vector<TensorLoad>& loads) {
  std::set<std::string> used;
  for (size_t i = 0; i < plans.size(); ++i)
    for (const TensorPlan::Part& p : plans[i].parts) {
      used.insert(p.name);
      if (loads[i].stored_quantized) {
        used.insert(companion(p.name, "scales"));
        used.insert(companion(p.name, "biases"));
      }
      if (loads[i].fp8.quantized()) {
        used.insert(fp8_scale_name(p.name, loads[i].fp8));
        used.insert(companion(p.name, "input_scale"));  // static activation scale: unused (activations stay f32)
      }
    }
  const std::string head = names.top + "lm_head.weight";
  const std::set<std::string> heads = {head, companion(head, "scales"), companion(head, "biases"),
                                       companion(head, "weight_scale_inv"), companion(head, "weight_scale")};
  std::vector<std::string> unused;
  for (const std::string& n : store.names()) {
    if (used.count(n) || n.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (heads.count(n) && c.tie_word_embeddings) continue;
    if (c.nested_text_config && n.rfind(names.decoder, 0) != 0 && !heads.count(n)) continue;
    unused.push_back(n);
  }
  if (unused.empty()) return;
  std::string list;
  for (size_t i = 0; i < unused.size() && i < 4; ++i) list += (i ? ", \"" : "\"") + unused[i] + "\"";
  if (unused.size() > 4) list += fmt::format(" and {} more", unused.size() - 4);
  fail("weights", "{} tensor(s) in the checkpoint are not used by the model config.json describes (model_type "
       "\"{}\", {} layers): {}; the config does not match the checkpoint",
       unused.size(), c.model_type, c.num_layers, list);
}

// How each plan is stored and made. A matrix part is stored quantized when the
// checkpoint has its ".scales" (MLX layout); the config must then say how
// ("quantization"), and every part of a fused matrix must be stored alike.
// Plain float matrices are quantized on load when `quantize` asks and their
// input dim is a multiple of the group.
std::vector<TensorLoad> plan_formats(const WeightStore& store, const ModelConfig& c,
                                     const std::vector<TensorPlan>& plans, QuantFormat quantize) {
  if (quantize.quantized() && !supported(quantize))
    fail("weights", "cannot quantize to {} bits in groups of {} (supported: 4 or 8 bits, groups of 32, 64 or 128)",
         quantize.bits, quantize.group);
  if (quantize.fp8 && quantize.quantized()) fail("weights", "fp8 and int{} requested together", quantize.bits);
  std::vector<TensorLoad> loads(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    const TensorPlan& plan = plans[i];
    if (plan.role != Role::matrix) {
      for (const TensorPlan::Part& p : plan.parts)
        if (store.has(companion(p.name, "scales")))
          fail("weights", "tensor \"{}\" has scales (\"{}\") but kvgraph quantizes only matrices", p.name,
               companion(p.name, "scales"));
      continue;
    }
    for (const TensorPlan::Part& p : plan.parts)
      if (store.has(p.name) && !stored_fp8(store, p.name) && store.get(p.name).dtype == DType::U32 && !store.has(companion(p.name, "scales")))
        fail("weights", "tensor \"{}\" is packed (u32) but \"{}\" is missing", p.name, companion(p.name, "scales"));
    const std::string& first = plan.parts.front().name;
    const bool f0 = stored_fp8(store, first);
    for (const TensorPlan::Part& p : plan.parts)
      if (stored_fp8(store, p.name) != f0)
        fail("weights", "tensors \"{}\" and \"{}\" are fused into one matrix, but only one of them is fp8", first,
             p.name);
    if (f0) {
      if (!c.fp8.quantized())
        fail("weights", "tensor \"{}\" is stored in {} but {} has no FP8 \"quantization_config\" saying how it is "
             "scaled (quant_method \"fp8\" or \"compressed-tensors\")", first, store.stored_dtype(first), c.source);
      loads[i].fp8 = c.fp8;
      if (quantize.fp8)
        fail("weights", "the checkpoint is already {}; it cannot be rounded to fp8 again (drop --weights fp8)",
             fp8_format_name(c.fp8));
      if (quantize.quantized() && plan.shape()[1] % quantize.group == 0) loads[i].format = quantize;
      continue;
    }
    const bool q0 = store.has(companion(first, "scales"));
    for (const TensorPlan::Part& p : plan.parts)
      if (store.has(companion(p.name, "scales")) != q0)
        fail("weights", "tensors \"{}\" and \"{}\" are fused into one matrix, but only one of them is quantized",
             first, p.name);
    if (q0) {
      if (!c.quantization.quantized())
        fail("weights", "tensor \"{}\" is quantized (\"{}\" is present) but {} has no \"quantization\" saying "
             "how (bits, group_size)", first, companion(first, "scales"), c.source);
      if (quantize.quantized() && quantize != c.quantization)
        fail("weights", "the checkpoint is already quantized (int{}, group {}); it cannot be loaded as int{}, group {}",
             c.quantization.bits, c.quantization.group, quantize.bits, quantize.group);
      if (quantize.fp8)
        fail("weights", "the checkpoint is already quantized (int{}, group {}); it cannot be loaded as fp8",
             c.quantization.bits, c.quantization.group);
      loads[i] = {c.quantization, true, {}};
    } else if (quantize.quantized() && plan.shape().size() == 2 && plan.shape()[1] % quantize.group == 0) {
      loads[i] = {quantize, false, {}};
    } else if (quantize.fp8 && plan.shape().size() == 2 && first.ends_with("_proj.weight")) {
      loads[i].fp8_on_load = true;  // linear layers only, as transformers' modules_to_not_convert
    }
  }
  return loads;
}

// Every checkpoint tensor the plans name is present, at its shape, in a float
// type (quantized matrices: u32 words, float scales and biases at the shapes
// their format implies): checked over the whole list before any weight is
// read or allocated, so a checkpoint that does not match fails at once, not
// after minutes of loading.
void check_tensors(const WeightStore& store, const std::vector<TensorPlan>& plans,
                   const std::vector<TensorLoad>& loads) {
  std::vector<std::string> missing;
  for (size_t i = 0; i < plans.size(); ++i)
    for (const TensorPlan::Part& p : plans[i].parts) {
      if (!store.has(p.name)) missing.push_back(p.name);
      if (loads[i].stored_quantized && !store.has(companion(p.name, "biases")))
        missing.push_back(companion(p.name, "biases"));
      if (loads[i].fp8.quantized() && !store.has(fp8_scale_name(p.name, loads[i].fp8)))
        missing.push_back(fp8_scale_name(p.name, loads[i].fp8));
    }
  if (!missing.empty()) {
    std::string more;
    for (size_t i = 1; i < missing.size() && i < 4; ++i) more += (i > 1 ? ", \"" : " (also \"") + missing[i] + "\"";
    if (missing.size() > 4) more += fmt::format(" and {} more", missing.size() - 4);
    if (!more.empty()) more += ")";
    fail("weights", "missing tensor \"{}\" in {}{}", missing.front(), store.dir().string(), more);
  }
  auto need_float = [](const WeightView& w) {
    if (w.dtype != DType::F32 && w.dtype != DType::BF16 && w.dtype != DType::F16)
      fail("weights", "tensor \"{}\": dtype {} is not a float type", w.name, dtype_name(w.dtype));
  };
  for (size_t i = 0; i < plans.size(); ++i) {
    for (const TensorPlan::Part& p : plans[i].parts) {
      if (loads[i].fp8.quantized()) {
        const Fp8Format& f = loads[i].fp8;
        store.get_e4m3(p.name, p.shape);  // throws on another dtype (F8_E5M2 ...) or shape
        const std::string sn = fp8_scale_name(p.name, f);
        const WeightView sv = store.get(sn);
        need_float(sv);
        const std::vector<int64_t> want = fp8_scale_shape(f, p.shape[0], p.shape[1]);
        if (sv.shape != want && !(f.scale == Fp8Format::Scale::tensor && sv.shape.empty()))
          fail("weights", "tensor \"{}\": the {} scale of \"{}\" {} must have shape {}, found {}", sn,
               fp8_format_name(f), p.name, shape_string(p.shape), shape_string(want), shape_string(sv.shape));
        continue;
      }
      if (!loads[i].stored_quantized) {
        need_float(store.get(p.name, p.shape));  // throws on a shape or an unusable dtype
        continue;
      }
      const QuantFormat f = loads[i].format;
      const int64_t rows = p.shape[0], K = p.shape[1];
      if (K % f.group)
        fail("weights", "tensor \"{}\": its input dim {} is not a multiple of the quantization group size {} "
             "(config.json \"quantization\")", p.name, K, f.group);
      const WeightView w = store.get(p.name, {rows, K * f.bits / 32});
      if (w.dtype != DType::U32)
        fail("weights", "tensor \"{}\": a quantized matrix must be packed in U32 words, found {}", p.name,
             dtype_name(w.dtype));
      for (const char* what : {"scales", "biases"}) need_float(store.get(companion(p.name, what), {rows, K / f.group}));
    }
  }
}

// A model is a directory; a file given instead (config.json, a .safetensors)
// used to be read as whichever the loader wanted first, with a message about
// JSON or safetensors headers that did not say what was wrong.
void check_model_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("model", "model directory {} does not exist", dir.string());
  if (fs::is_directory(dir, ec)) return;
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  fail("model", "expected a model directory (config.json and *.safetensors), got the file {}; pass its directory {}",
       dir.string(), parent.string());
}

// Everything Model::load decides from config.json and the safetensors
// headers, before it reads a weight.
struct LoadPlan {
  CheckpointNames names;
  std::vector<TensorPlan> plans;
  std::vector<TensorLoad> loads;  // per plan
  size_t stored_bytes = 0;  // what is read (no vision tower, no tied lm_head): progress counts it
  DType matrix_dtype = DType::F32;
  QuantFormat quantization;       // of the quantized matrices (bits 0: none)
  bool stored_quantized = false;  // some matrix is quantized in the checkpoint
  Fp8Format fp8;                  // some matrix is stored in fp8 (dequantized at load)

  std::vector<QuantFormat> formats() const {
    std::vector<QuantFormat> f;
    for (const TensorLoad& l : loads) f.push_back(l.format);
    return f;
  }
};

// The checkpoint bytes one part is read from (with its scales and biases).
size_t stored_part_bytes(const WeightStore& store, const TensorPlan::Part& p, const TensorLoad& load) {
  if (load.fp8.quantized()) return store.get_e4m3(p.name).nbytes + store.get(fp8_scale_name(p.name, load.fp8)).nbytes;
  size_t n = store.get(p.name).nbytes;
  if (load.stored_quantized)
    n += store.get(companion(p.name, "scales")).nbytes + store.get(companion(p.name, "biases")).nbytes;
  return n;
}

// How a plan's tensor is stored: "bf16", "int4/g64", "fp8 e4m3 block 128x128".
std::string stored_format(const WeightStore& store, const TensorPlan& plan, const TensorLoad& load) {
  if (load.fp8.quantized()) return fp8_format_name(load.fp8);
  const WeightView w = store.get(plan.parts.front().name);
  if (load.stored_quantized) return fmt::format("int{}/g{}", load.format.bits, load.format.group);
  return std::string(dtype_name(w.dtype));
}

LoadPlan plan_load(const WeightStore& store, const ModelConfig& c, Device device, Model::CpuWeights cpu_weights,
                   QuantFormat quantize) {
  LoadPlan lp;
  lp.names = checkpoint_names(store, c);
  lp.plans = plan_weights(c, lp.names);
  lp.loads = plan_formats(store, c, lp.plans, quantize);
  check_unused(store, c, lp.names, lp.plans, lp.loads);
  check_tensors(store, lp.plans, lp.loads);
  for (size_t i = 0; i < lp.plans.size(); ++i) {
    for (const TensorPlan::Part& p : lp.plans[i].parts) lp.stored_bytes += stored_part_bytes(store, p, lp.loads[i]);
    if (lp.loads[i].format.quantized()) lp.quantization = lp.loads[i].format;
    if (lp.loads[i].fp8.quantized()) lp.fp8 = lp.loads[i].fp8;
    lp.stored_quantized = lp.stored_quantized || lp.loads[i].stored_quantized;
  }

  // Matrices: CUDA keeps 16-bit checkpoints in bf16. The CPU keeps a
  // checkpoint in bf16 only when it is stored in bf16 (lossless) and
  // cpu_weights allows it (see CpuWeights); otherwise it widens to f32.
  // Scales and biases of quantized matrices follow the same rule.
  const std::string embed_name = lp.names.decoder + "embed_tokens.weight";
  const std::string embed_float =
      lp.loads.front().stored_quantized ? companion(embed_name, "scales") : embed_name;
  const bool stored_bf16 = c.weight_dtype == DType::BF16 && store.get(embed_float).dtype == DType::BF16;
  bool bf16 = c.weight_dtype != DType::F32;
  if (device == Device::CPU) {
    constexpr size_t kAutoBf16 = size_t(1) << 30;  // f32 bytes above which automatic keeps bf16
    bf16 = stored_bf16 && (cpu_weights == Model::CpuWeights::bf16 ||
                           (cpu_weights == Model::CpuWeights::automatic && 2 * lp.stored_bytes > kAutoBf16));
  }
  lp.matrix_dtype = bf16 ? DType::BF16 : DType::F32;
  return lp;
}

}  // namespace

ModelInfo Model::describe(const std::filesystem::path& dir, Device device, CpuWeights cpu_weights,
                          QuantFormat quantize) {
  check_model_dir(dir);
  ModelInfo info;
  info.config = load_model_config(dir);
  info.dir = dir;
  info.device = device;
  WeightStore store(dir);
  const LoadPlan lp = plan_load(store, info.config, device, cpu_weights, quantize);
  info.matrix_dtype = lp.matrix_dtype;
  info.weight_bytes = planned_bytes(lp.plans, lp.matrix_dtype, lp.formats());
  info.tensors = planned_tensors(lp.plans, lp.matrix_dtype, lp.formats());
  info.quantization = lp.quantization;
  info.quantized_checkpoint = lp.stored_quantized;
  info.fp8 = lp.fp8;
  info.checkpoint_bytes = lp.stored_bytes;
  for (size_t i = 0; i < lp.plans.size() && i < info.tensors.size(); ++i) {
    info.tensors[i].stored = stored_format(store, lp.plans[i], lp.loads[i]);
    for (const TensorPlan::Part& p : lp.plans[i].parts) info.tensors[i].stored_bytes += stored_part_bytes(store, p, lp.loads[i]);
  }
  return info;
}

std::shared_ptr<Model> Model::load(const std::filesystem::path& dir, Device device, const ProgressFn& progress,
                                   CpuWeights cpu_weights, QuantFormat quantize) {
  check_model_dir(dir);
  std::shared_ptr<Model> m(new Model());
  m->cfg_ = load_model_config(dir);
  m->device_ = device;
  m->dir_ = dir;
  const ModelConfig& c = m->cfg_;
  WeightStore store(dir);
  const LoadPlan lp = plan_load(store, c, device, cpu_weights, quantize);
  m->matrix_dtype_ = lp.matrix_dtype;
  m->quantization_ = lp.quantization;
  m->fp8_ = lp.fp8;
  Loader ld{store, device, m->matrix_dtype_, lp.stored_bytes, 0, progress, &m->weight_bytes_};

  size_t next = 0;  // build_weights hands the plans over in plan_weights' order
  Weights w = build_weights(c, lp.names, [&](const TensorPlan& plan) { return ld.make(plan, lp.loads.at(next++)); });
  m->embed_ = std::move(w.embed);
  m->final_norm_ = std::move(w.final_norm);
  m->lm_head_ = std::move(w.lm_head);
  m->layers_ = std::move(w.layers);
  m->upload_rope();
  return m;
}

QuantizeSummary quantize_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& out,
                                    QuantFormat format, const ProgressFn& progress) {
  namespace fs = std::filesystem;
  check_model_dir(dir);
  if (!supported(format))
    fail("quantize", "cannot quantize to {} bits in groups of {} (supported: 4 or 8 bits, groups of 32, 64 or 128)",
         format.bits, format.group);
  const ModelConfig c = load_model_config(dir);
  if (c.fp8.quantized())
    fail("quantize", "{} is an FP8 checkpoint ({}); quantize the float checkpoint it was made from", dir.string(),
         fp8_format_name(c.fp8));
  if (c.quantization.quantized())
    fail("quantize", "{} is already quantized (int{}, group {}); quantize the float checkpoint it was made from",
         dir.string(), c.quantization.bits, c.quantization.group);
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    fail("quantize", "{} already exists and is not an empty directory (choose another output)", out.string());
  if (fs::equivalent(dir, out, ec)) fail("quantize", "the output is the input directory {}", dir.string());

  WeightStore store(dir);
  const LoadPlan lp = plan_load(store, c, Device::CPU, Model::CpuWeights::automatic, format);  // all checks of load
  std::set<std::string> quantize;
  for (size_t i = 0; i < lp.plans.size(); ++i)
    if (lp.loads[i].format.quantized())
      for (const TensorPlan::Part& p : lp.plans[i].parts) quantize.insert(p.name);

  QuantizeSummary sum;
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : store.names()) {
    const WeightView v = store.get(name);  // throws for a dtype kvgraph cannot carry
    sum.bytes_in += v.nbytes;
    if (!quantize.count(name)) {
      ++sum.copied;
      tensors.push_back({name, v.dtype, v.shape, [&store, name](std::byte* o) {
                           const WeightView w = store.get(name);
                           std::memcpy(o, w.data, w.nbytes);
                         }});
      continue;
    }
    ++sum.quantized;
    const int64_t N = v.shape[0], K = v.shape[1];
    const DType sd = v.dtype == DType::BF16 ? DType::BF16 : DType::F32;
    // The codes' fill computes scales and biases too; their fills (next in
    // the file) write them in the storage type and free them.
    struct Groups {
      std::vector<float> scales, biases;
    };
    auto g = std::make_shared<Groups>();
    tensors.push_back({name, DType::U32, {N, K * format.bits / 32}, [&store, name, N, K, format, g](std::byte* o) {
                         const std::vector<float> w = to_f32(store.get(name));
                         g->scales.resize(static_cast<size_t>(N * (K / format.group)));
                         g->biases.resize(g->scales.size());
                         affine_quantize(w.data(), N, K, format.bits, format.group, reinterpret_cast<uint32_t*>(o),
                                         g->scales.data(), g->biases.data());
                       }});
    for (const char* what : {"scales", "biases"}) {
      const bool scales = std::string_view(what) == "scales";
      tensors.push_back({companion(name, what), sd, {N, K / format.group}, [g, sd, scales](std::byte* o) {
                           std::vector<float>& v = scales ? g->scales : g->biases;
                           if (sd == DType::F32) {
                             std::memcpy(o, v.data(), v.size() * sizeof(float));
                           } else {
                             for (size_t i = 0; i < v.size(); ++i) {
                               const uint16_t h = f32_to_bf16(v[i]);
                               std::memcpy(o + 2 * i, &h, 2);
                             }
                           }
                           std::vector<float>().swap(v);
                         }});
    }
  }

  const fs::path tmp = out.string() + ".partial";
  struct RemoveUnlessDone {
    const fs::path& p;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code e;
      if (!done) fs::remove_all(p, e);
    }
  } guard{tmp};
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    fail("quantize", "cannot create {}: {}", tmp.string(), ec ? ec.message() : "it exists");
  write_safetensors(tmp / "model.safetensors", tensors, {{"format", "mlx"}}, [&](size_t done, size_t) {
    if (progress) progress(done, sum.bytes_in);
  });
  sum.bytes_out = fs::file_size(tmp / "model.safetensors");

  nlohmann::ordered_json config;
  {
    std::ifstream in(dir / "config.json");
    config = nlohmann::ordered_json::parse(in);  // parsed once already by load_model_config
  }
  config["quantization"] = {{"group_size", format.group}, {"bits", format.bits}};
  config["quantization_config"] = config["quantization"];
  {
    std::ofstream o(tmp / "config.json");
    o << config.dump(2) << '\n';
    if (!o) fail("quantize", "writing {} failed", (tmp / "config.json").string());
  }
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string fname = e.path().filename().string();
    if (!e.is_regular_file() || fname == "config.json" || fname == "model.safetensors.index.json" ||
        e.path().extension() == ".safetensors")
      continue;
    fs::copy_file(e.path(), tmp / fname, ec);
    if (ec) fail("quantize", "cannot copy {} to {}: {}", e.path().string(), tmp.string(), ec.message());
  }
  if (fs::exists(out, ec)) fs::remove(out, ec);  // an empty directory (checked above)
  fs::rename(tmp, out, ec);
  if (ec) fail("quantize", "cannot rename {} to {}: {}", tmp.string(), out.string(), ec.message());
  guard.done = true;
  return sum;
}

}  // namespace kvgraph
