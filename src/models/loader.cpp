// Model::load: config.json + safetensors -> device tensors, named and
// shape-checked as the family schema (family.h) lists them, all of them
// before the first weight is read.

#include <set>
#include <string>
#include <vector>

#include "kvgraph/error.h"
#include "kvgraph/model.h"
#include "kvgraph/safetensors.h"
#include "models/family.h"

namespace kvgraph {

namespace {

// Converts host f32 values to a device tensor of `dtype` (f32 or bf16).
Tensor upload(const std::vector<float>& host, std::vector<int64_t> shape, DType dtype, Device device) {
  if (dtype == DType::F32) return Tensor::from_host(host.data(), std::move(shape), DType::F32, device);
  std::vector<uint16_t> h(host.size());
  for (size_t i = 0; i < host.size(); ++i) h[i] = f32_to_bf16(host[i]);
  return Tensor::from_host(h.data(), std::move(shape), DType::BF16, device);
}

struct Loader {
  const WeightStore& store;
  Device device;
  DType matrix_dtype;
  size_t total_bytes = 0;
  size_t done_bytes = 0;
  const ProgressFn& progress;
  size_t* weight_bytes;

  // One checkpoint tensor as f32 values on the host (shape-checked).
  std::vector<float> host(const std::string& name, const std::vector<int64_t>& shape) {
    WeightView w = store.get(name, shape);  // name, shape and dtype checked by check_tensors
    std::vector<float> v = to_f32(w);
    done_bytes += w.nbytes;
    if (progress) progress(done_bytes, total_bytes);
    return v;
  }
  // The parts of one Model tensor, read and laid out as the plan says:
  // stacked (all rows of each part in turn) or interleaved (row r of each part in turn).
  Tensor make(const TensorPlan& plan) {
    std::vector<std::vector<float>> parts;
    for (const TensorPlan::Part& p : plan.parts) parts.push_back(host(p.name, p.shape));
    const std::vector<int64_t> shape = plan.shape();
    std::vector<float> all;
    if (parts.size() == 1) {
      all = std::move(parts.front());
    } else if (plan.fuse == Fuse::interleave) {
      const std::vector<int64_t>& part_shape = plan.parts.front().shape;
      const int64_t rows = part_shape[0], row = part_shape.size() > 1 ? part_shape[1] : 1;
      for (int64_t r = 0; r < rows; ++r)
        for (const std::vector<float>& v : parts) all.insert(all.end(), v.begin() + r * row, v.begin() + (r + 1) * row);
    } else {
      for (const std::vector<float>& v : parts) all.insert(all.end(), v.begin(), v.end());
    }
    Tensor t = upload(all, shape, plan.role == Role::norm ? DType::F32 : matrix_dtype, device);
    *weight_bytes += t.nbytes();
    return t;
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
                  const std::vector<TensorPlan>& plans) {
  std::set<std::string> used;
  for (const TensorPlan& plan : plans)
    for (const TensorPlan::Part& p : plan.parts) used.insert(p.name);
  const std::string head = names.top + "lm_head.weight";
  std::vector<std::string> unused;
  for (const std::string& n : store.names()) {
    if (used.count(n) || n.find("rotary_emb.inv_freq") != std::string::npos) continue;
    if (n == head && c.tie_word_embeddings) continue;
    if (c.nested_text_config && n.rfind(names.decoder, 0) != 0 && n != head) continue;
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

// Every checkpoint tensor the plans name is present, at its shape, in a float
// type: checked over the whole list before any weight is read or allocated,
// so a checkpoint that does not match fails at once, not after minutes of
// loading.
void check_tensors(const WeightStore& store, const std::vector<TensorPlan>& plans) {
  std::vector<std::string> missing;
  for (const TensorPlan& plan : plans)
    for (const TensorPlan::Part& p : plan.parts)
      if (!store.has(p.name)) missing.push_back(p.name);
  if (!missing.empty()) {
    std::string more;
    for (size_t i = 1; i < missing.size() && i < 4; ++i) more += (i > 1 ? ", \"" : " (also \"") + missing[i] + "\"";
    if (missing.size() > 4) more += fmt::format(" and {} more", missing.size() - 4);
    if (!more.empty()) more += ")";
    fail("weights", "missing tensor \"{}\" in {}{}", missing.front(), store.dir().string(), more);
  }
  for (const TensorPlan& plan : plans) {
    for (const TensorPlan::Part& p : plan.parts) {
      const WeightView w = store.get(p.name, p.shape);  // throws on a shape or an unusable dtype
      if (w.dtype != DType::F32 && w.dtype != DType::BF16 && w.dtype != DType::F16)
        fail("weights", "tensor \"{}\": dtype {} is not a float type", p.name, dtype_name(w.dtype));
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
  size_t stored_bytes = 0;  // what is read (no vision tower, no tied lm_head): progress counts it
  DType matrix_dtype = DType::F32;
};

LoadPlan plan_load(const WeightStore& store, const ModelConfig& c, Device device, Model::CpuWeights cpu_weights) {
  LoadPlan lp;
  lp.names = checkpoint_names(store, c);
  lp.plans = plan_weights(c, lp.names);
  check_unused(store, c, lp.names, lp.plans);
  check_tensors(store, lp.plans);
  for (const TensorPlan& plan : lp.plans)
    for (const TensorPlan::Part& p : plan.parts) lp.stored_bytes += store.get(p.name).nbytes;

  // Matrices: CUDA keeps 16-bit checkpoints in bf16. The CPU keeps a
  // checkpoint in bf16 only when it is stored in bf16 (lossless) and
  // cpu_weights allows it (see CpuWeights); otherwise it widens to f32.
  const std::string embed_name = lp.names.decoder + "embed_tokens.weight";
  const bool stored_bf16 = c.weight_dtype == DType::BF16 && store.get(embed_name).dtype == DType::BF16;
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

ModelInfo Model::describe(const std::filesystem::path& dir, Device device, CpuWeights cpu_weights) {
  check_model_dir(dir);
  ModelInfo info;
  info.config = load_model_config(dir);
  info.dir = dir;
  info.device = device;
  WeightStore store(dir);
  const LoadPlan lp = plan_load(store, info.config, device, cpu_weights);
  info.matrix_dtype = lp.matrix_dtype;
  info.weight_bytes = planned_bytes(lp.plans, lp.matrix_dtype);
  info.checkpoint_bytes = lp.stored_bytes;
  return info;
}

std::shared_ptr<Model> Model::load(const std::filesystem::path& dir, Device device, const ProgressFn& progress,
                                   CpuWeights cpu_weights) {
  check_model_dir(dir);
  std::shared_ptr<Model> m(new Model());
  m->cfg_ = load_model_config(dir);
  m->device_ = device;
  m->dir_ = dir;
  const ModelConfig& c = m->cfg_;
  WeightStore store(dir);
  const LoadPlan lp = plan_load(store, c, device, cpu_weights);
  m->matrix_dtype_ = lp.matrix_dtype;
  Loader ld{store, device, m->matrix_dtype_, lp.stored_bytes, 0, progress, &m->weight_bytes_};

  Weights w = build_weights(c, lp.names, [&](const TensorPlan& plan) { return ld.make(plan); });
  m->embed_ = std::move(w.embed);
  m->final_norm_ = std::move(w.final_norm);
  m->lm_head_ = std::move(w.lm_head);
  m->layers_ = std::move(w.layers);
  m->upload_rope();
  return m;
}

}  // namespace kvgraph
