// config.json -> ModelConfig, with transformers' per-family defaults applied
// to absent keys, and RoPE inverse frequencies computed the way transformers
// computes them (float32, same operation order).
#include "kvgraph/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvgraph/error.h"
#include "models/family.h"

namespace kvgraph {

namespace {

using json = nlohmann::json;

// nlohmann parses iteratively, but dump() (error messages) and copies recurse,
// so a config of 10^5 nested brackets overflowed the stack. Real configs nest
// 3 levels deep ("text_config" -> "rope_parameters" -> layer type).
constexpr int kMaxJsonDepth = 64;

json parse_limited(const std::string& text, const std::string& source) {
  return json::parse(text, [&](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) fail("config", "{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
    return true;
  });
}

// Short rendering of a JSON value for error messages.
std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Reads typed fields of one JSON object. `fallback` (Gemma 3 multimodal
// configs) is the top-level object, consulted for keys that live outside
// "text_config" there (dtype, special token ids).
class Reader {
 public:
  Reader(std::string source, const json& obj, const json* fallback, std::string prefix)
      : source_(std::move(source)), obj_(obj), fallback_(fallback), prefix_(std::move(prefix)) {}

  const std::string& source() const { return source_; }
  std::string field(std::string_view key) const { return "\"" + prefix_ + std::string(key) + "\""; }

  // nullptr when absent; a pointer to a JSON null when explicitly null.
  const json* find(std::string_view key, bool use_fallback = false) const {
    auto it = obj_.find(key);
    if (it != obj_.end()) return &*it;
    if (use_fallback && fallback_ != nullptr) {
      auto f = fallback_->find(key);
      if (f != fallback_->end()) return &*f;
    }
    return nullptr;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }

  [[noreturn]] void bad(std::string_view key, std::string_view what, const json& v) const {
    fail("config", "{}: {} must be {}, found {}", source_, field(key), what, show(v));
  }

  static std::optional<int64_t> as_integer(const json& v) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
    }
    return std::nullopt;
  }

  // Absent -> def; null -> std::nullopt; otherwise an integer.
  std::optional<int> opt_int(std::string_view key, std::optional<int> def) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    if (v->is_null()) return std::nullopt;
    auto i = as_integer(*v);
    if (!i || *i < INT32_MIN || *i > INT32_MAX) bad(key, "an integer", *v);
    return static_cast<int>(*i);
  }
  int get_int(std::string_view key, int def) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    auto i = as_integer(*v);
    if (!i || *i < INT32_MIN || *i > INT32_MAX) bad(key, "an integer", *v);
    return static_cast<int>(*i);
  }
  int positive_int(std::string_view key, int def) const {
    int i = get_int(key, def);
    if (i <= 0) bad(key, "a positive integer", *find(key));
    return i;
  }
  // An integer from 1 to `max` (absent: def, which is in range).
  int bounded_int(std::string_view key, int def, int64_t max) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    auto i = as_integer(*v);
    if (!i) bad(key, "an integer", *v);
    if (*i < 1) bad(key, "a positive integer", *v);
    if (*i > max) bad(key, fmt::format("at most {} (the supported limit)", max), *v);
    return static_cast<int>(*i);
  }
  std::optional<double> opt_num(std::string_view key, std::optional<double> def) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    if (v->is_null()) return std::nullopt;
    if (!v->is_number()) bad(key, "a number", *v);
    return v->get<double>();
  }
  double get_num(std::string_view key, double def) const {
    const json* v = find(key);
    if (v == nullptr) return def;
    if (!v->is_number()) bad(key, "a number", *v);
    return v->get<double>();
  }
  bool get_bool(std::string_view key, bool def) const {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) return def;
    if (!v->is_boolean()) bad(key, "true or false", *v);
    return v->get<bool>();
  }
  std::string get_str(std::string_view key, std::string def) const {
    const json* v = find(key);
    if (v == nullptr || v->is_null()) return def;
    if (!v->is_string()) bad(key, "a string", *v);
    return v->get<std::string>();
  }

 private:
  std::string source_;
  const json& obj_;
  const json* fallback_;
  std::string prefix_;
};

bool is_object_with_layer_type_keys(const json& v) {
  if (!v.is_object() || v.empty()) return false;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "full_attention" && it.key() != "sliding_attention") return false;
  }
  return true;
}

// One RoPE parameter dict ({"rope_type": ..., "rope_theta": ..., ...}) ->
// RopeConfig. `where` names the dict for messages.
RopeConfig parse_rope_dict(const Reader& r, const json& d, const std::string& where, double default_theta,
                           int max_position_embeddings) {
  if (!d.is_object()) fail("config", "{}: {} must be an object, found {}", r.source(), where, show(d));
  auto num = [&](const char* key, std::optional<double> def) -> double {
    auto it = d.find(key);
    if (it == d.end() || it->is_null()) {
      if (!def) fail("config", "{}: {} is missing \"{}\"", r.source(), where, key);
      return *def;
    }
    if (!it->is_number()) fail("config", "{}: {}.{} must be a number, found {}", r.source(), where, key, show(*it));
    return it->get<double>();
  };

  RopeConfig rope;
  std::string type = "default";
  if (auto it = d.find("rope_type"); it != d.end() && !it->is_null()) {
    if (!it->is_string()) fail("config", "{}: {}.rope_type must be a string", r.source(), where);
    type = it->get<std::string>();
  } else if (auto t = d.find("type"); t != d.end() && !t->is_null()) {
    if (!t->is_string()) fail("config", "{}: {}.type must be a string", r.source(), where);
    type = t->get<std::string>();
  }
  rope.theta = static_cast<float>(num("rope_theta", default_theta));
  if (!(rope.theta > 0.0f)) fail("config", "{}: {}.rope_theta must be positive", r.source(), where);

  if (auto it = d.find("partial_rotary_factor"); it != d.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 1.0) {
      fail("config", "{}: {}.partial_rotary_factor {} is not supported (only 1.0)", r.source(), where, show(*it));
    }
  }

  if (type == "default") {
    rope.type = "default";
  } else if (type == "linear") {
    rope.type = "linear";
    rope.factor = static_cast<float>(num("factor", std::nullopt));
    if (!(rope.factor > 0.0f)) fail("config", "{}: {}.factor must be positive", r.source(), where);
  } else if (type == "llama3") {
    rope.type = "llama3";
    rope.factor = static_cast<float>(num("factor", std::nullopt));
    rope.low_freq_factor = static_cast<float>(num("low_freq_factor", std::nullopt));
    rope.high_freq_factor = static_cast<float>(num("high_freq_factor", std::nullopt));
    const double ocl = num("original_max_position_embeddings", max_position_embeddings);
    // A positive integer an int holds (the cast of anything else is undefined).
    if (!(ocl >= 1.0 && ocl <= double(INT32_MAX)) || ocl != std::floor(ocl))
      fail("config", "{}: {}.original_max_position_embeddings must be a positive integer, found {}", r.source(), where,
           show(json(ocl)));
    rope.original_max_position_embeddings = static_cast<int>(ocl);
    if (!(rope.factor > 0.0f) || !(rope.low_freq_factor > 0.0f) ||
        !(rope.high_freq_factor > rope.low_freq_factor) || rope.original_max_position_embeddings <= 0) {
      fail("config",
           "{}: {}: llama3 RoPE needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
           "original_max_position_embeddings > 0",
           r.source(), where);
    }
  } else {
    fail("config", "{}: unsupported RoPE type \"{}\" in {} (supported: default, linear, llama3)", r.source(), type,
         where);
  }
  return rope;
}

// Fills cfg.rope / cfg.rope_local. Mirrors transformers'
// RotaryEmbeddingConfigMixin.convert_rope_params_to_dict (and Gemma 3's
// override): the legacy spelling is top-level rope_theta + rope_scaling, the
// v5 spelling is rope_parameters (flat, or keyed by layer type).
void parse_rope(const Reader& r, const FamilySchema& fs, ModelConfig& cfg) {
  const json* scaling = r.find("rope_scaling");
  const json* params = r.find("rope_parameters");
  if (scaling != nullptr && scaling->is_null()) scaling = nullptr;
  if (params != nullptr && params->is_null()) params = nullptr;
  const std::optional<double> top_theta = r.opt_num("rope_theta", std::nullopt);
  if (auto prf = r.opt_num("partial_rotary_factor", std::nullopt); prf && *prf != 1.0) {
    fail("config", "{}: {} {} is not supported (only 1.0)", r.source(), r.field("partial_rotary_factor"), *prf);
  }

  if (fs.rope_by_layer_type) {
    // Gemma3TextConfig: per layer type; rope_scaling applies to full attention;
    // thetas default to rope_theta and rope_local_base_freq (1e4).
    json full = json::object({{"rope_type", "default"}});
    json sliding = json::object({{"rope_type", "default"}});
    if (params != nullptr) {
      if (!is_object_with_layer_type_keys(*params)) {
        fail("config",
             "{}: {} for gemma3 must be keyed by layer type (\"full_attention\", \"sliding_attention\"), found {}",
             r.source(), r.field("rope_parameters"), show(*params));
      }
      if (params->contains("full_attention")) full = (*params)["full_attention"];
      if (params->contains("sliding_attention")) sliding = (*params)["sliding_attention"];
    }
    if (scaling != nullptr) {
      if (!scaling->is_object()) fail("config", "{}: {} must be an object", r.source(), r.field("rope_scaling"));
      if (!full.is_object()) full = json::object();
      full.update(*scaling);
    }
    const double local_theta = r.opt_num("rope_local_base_freq", std::nullopt).value_or(10000.0);
    cfg.rope = parse_rope_dict(r, full, r.field("rope_parameters") + "[\"full_attention\"]",
                               top_theta.value_or(fs.defaults.rope_theta), cfg.max_position_embeddings);
    cfg.rope_local = parse_rope_dict(r, sliding, r.field("rope_parameters") + "[\"sliding_attention\"]",
                                     local_theta, cfg.max_position_embeddings);
    return;
  }

  // Other families: `rope_scaling or rope_parameters`, rope_theta as fallback.
  const double default_theta = top_theta.value_or(fs.defaults.rope_theta);
  const json* chosen = nullptr;
  std::string where;
  if (scaling != nullptr && !(scaling->is_object() && scaling->empty())) {
    chosen = scaling;
    where = r.field("rope_scaling");
  } else if (params != nullptr) {
    chosen = params;
    where = r.field("rope_parameters");
  }
  if (chosen == nullptr) {
    cfg.rope = parse_rope_dict(r, json::object(), r.field("rope_parameters"), default_theta,
                               cfg.max_position_embeddings);
    cfg.rope_local = cfg.rope;
    return;
  }
  if (is_object_with_layer_type_keys(*chosen)) {
    const json empty = json::object();
    const json& full = chosen->contains("full_attention") ? (*chosen)["full_attention"] : empty;
    cfg.rope = parse_rope_dict(r, full, where + "[\"full_attention\"]", default_theta, cfg.max_position_embeddings);
    if (chosen->contains("sliding_attention")) {
      cfg.rope_local = parse_rope_dict(r, (*chosen)["sliding_attention"], where + "[\"sliding_attention\"]",
                                       default_theta, cfg.max_position_embeddings);
    } else {
      cfg.rope_local = cfg.rope;
    }
    return;
  }
  cfg.rope = parse_rope_dict(r, *chosen, where, default_theta, cfg.max_position_embeddings);
  cfg.rope_local = cfg.rope;
}

// "layer_types" as a vector of is-sliding flags; nullopt when absent or null.
std::optional<std::vector<bool>> parse_layer_types(const Reader& r, int num_layers) {
  const json* v = r.find("layer_types");
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_array()) r.bad("layer_types", "a list of strings", *v);
  if (static_cast<int>(v->size()) != num_layers) {
    fail("config", "{}: {} has {} entries but \"num_hidden_layers\" is {}", r.source(), r.field("layer_types"),
         v->size(), num_layers);
  }
  std::vector<bool> sliding;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& t = (*v)[i];
    if (t == "sliding_attention") {
      sliding.push_back(true);
    } else if (t == "full_attention") {
      sliding.push_back(false);
    } else {
      fail("config", "{}: {}[{}] is {}; supported layer types are \"full_attention\" and \"sliding_attention\"",
           r.source(), r.field("layer_types"), i, show(t));
    }
  }
  return sliding;
}

Activation parse_activation(const Reader& r, std::string_view key, const std::string& def) {
  std::string a = r.get_str(key, def);
  if (a == "silu" || a == "swish") return Activation::SiLU;
  if (a == "gelu_pytorch_tanh" || a == "gelu_new") return Activation::GeluTanh;
  fail("config", "{}: {} \"{}\" is not supported (supported: silu, gelu_pytorch_tanh)", r.source(), r.field(key), a);
}

DType parse_dtype(const Reader& r) {
  // "dtype" (transformers >= 4.56) wins over the older "torch_dtype".
  for (const char* key : {"dtype", "torch_dtype"}) {
    const json* v = r.find(key, /*use_fallback=*/true);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_string()) r.bad(key, "a string", *v);
    const std::string s = v->get<std::string>();
    if (s == "float32") return DType::F32;
    if (s == "bfloat16") return DType::BF16;
    if (s == "float16") return DType::F16;
    fail("config", "{}: \"{}\" \"{}\" is not supported (supported: float32, bfloat16, float16)", r.source(), key, s);
  }
  return DType::F32;
}

std::vector<int> parse_eos(const Reader& r, std::optional<int> def) {
  const json* v = r.find("eos_token_id", /*use_fallback=*/true);
  if (v == nullptr) return def ? std::vector<int>{*def} : std::vector<int>{};
  if (v->is_null()) return {};
  std::vector<int> ids;
  auto one = [&](const json& e) {
    auto i = Reader::as_integer(e);
    if (!i || *i < 0 || *i > INT32_MAX) r.bad("eos_token_id", "a token id or a list of token ids", *v);
    ids.push_back(static_cast<int>(*i));
  };
  if (v->is_array()) {
    for (const json& e : *v) one(e);
  } else {
    one(*v);
  }
  return ids;
}

bool read_switch(const Reader& r, const Switch& s) {
  switch (s.kind) {
    case Switch::Kind::off: return false;
    case Switch::Kind::on: return true;
    case Switch::Kind::key: return r.get_bool(s.key, false);
  }
  return false;
}

// Per layer: the window W for sliding layers, 0 for full ones (see SlidingRule).
// As transformers: Llama never reads "sliding_window"; Qwen2/3 drop it unless
// "use_sliding_window" (and then slide no layer when it is null); Mistral with
// a null window is full attention. A window that some layer would slide with
// must be positive: transformers' mask `k > q - W` hides every key, the
// query's own included, when W <= 0, and refuses a null window for sliding
// layers (Gemma); we never read it as "no window".
void parse_windows(const Reader& r, const FamilySchema& fs, ModelConfig& cfg) {
  const SlidingRule& rule = fs.sliding;
  const int n_layers = cfg.num_layers;
  cfg.layer_window.assign(n_layers, 0);
  cfg.sliding_window = 0;
  // Validated even when unused, as before.
  const std::optional<std::vector<bool>> types =
      rule.layers == SlidingRule::Layers::layer_types ? parse_layer_types(r, n_layers) : std::nullopt;
  if (rule.layers == SlidingRule::Layers::none) return;
  if (!rule.gate_key.empty() && !r.get_bool(rule.gate_key, false)) return;
  const std::optional<int> window = r.opt_int("sliding_window", fs.defaults.sliding_window);  // nullopt: null

  std::vector<bool> sliding(n_layers, false);
  if (rule.layers == SlidingRule::Layers::all) {
    if (window) sliding.assign(n_layers, true);
  } else if (types) {
    sliding = *types;
  } else if (rule.fallback == SlidingRule::Fallback::from_layer) {
    const int n = rule.n_key.empty() ? rule.n : r.get_int(rule.n_key, rule.n);
    if (window)
      for (int i = 0; i < n_layers; ++i) sliding[i] = i >= n;
  } else if (rule.fallback == SlidingRule::Fallback::every_nth_full) {
    const int n = rule.n_key.empty() ? rule.n : r.get_int(rule.n_key, rule.n);
    if (n <= 0) r.bad(rule.n_key, "a positive integer", *r.find(rule.n_key));
    for (int i = 0; i < n_layers; ++i) sliding[i] = (i + 1) % n != 0;
  }
  const auto first = std::find(sliding.begin(), sliding.end(), true);
  if (first == sliding.end()) return;
  if (!window || *window <= 0) {
    const json* v = r.find("sliding_window");
    r.bad("sliding_window", fmt::format("a positive integer (layer {} slides)", first - sliding.begin()),
          v != nullptr ? *v : json(nullptr));
  }
  cfg.sliding_window = *window;
  for (int i = 0; i < n_layers; ++i) cfg.layer_window[i] = sliding[i] ? *window : 0;
}

float round_through(float x, DType dt) {
  switch (dt) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(x));
    case DType::F16: return f16_to_f32(f32_to_f16(x));
    default: return x;
  }
}

// config.json "quantization" (mlx-lm), or "quantization_config" when it is
// MLX's (no "quant_method": GPTQ, AWQ, bitsandbytes ... are other formats).
// "quantization_config" of an FP8 checkpoint (see Fp8Format): transformers'
// fine-grained FP8 ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size":
// [bn, bk]}) or compressed-tensors ({"quant_method": "compressed-tensors",
// "format": "float-quantized", "config_groups": {"group_0": {"weights":
// {"num_bits": 8, "type": "float", "strategy": "channel" | "tensor"}}}}).
// Activation settings ("activation_scheme", "input_activations") are ignored:
// kvgraph keeps activations in f32.
Fp8Format parse_fp8(const json& q, const std::string& method, const std::string& source) {
  const std::string key = "quantization_config";
  Fp8Format f;
  if (method == "fp8") {
    if (auto fmt = q.find("fmt"); fmt != q.end() && !fmt->is_null() && !(fmt->is_string() && *fmt == "e4m3"))
      fail("config", "{}: \"{}.fmt\" {} is not supported (supported: \"e4m3\")", source, key, show(*fmt));
    auto bs = q.find("weight_block_size");
    if (bs == q.end() || bs->is_null())
      fail("config", "{}: \"{}\" (quant_method \"fp8\") has no \"weight_block_size\" (supported: block-wise "
           "scales, e.g. [128, 128])", source, key);
    std::optional<int64_t> n, k;
    if (bs->is_array() && bs->size() == 2) {
      n = Reader::as_integer((*bs)[0]);
      k = Reader::as_integer((*bs)[1]);
    }
    if (!n || !k || *n <= 0 || *k <= 0 || *n > (1 << 20) || *k > (1 << 20))
      fail("config", "{}: \"{}.weight_block_size\" must be two positive integers, found {}", source, key, show(*bs));
    f.scale = Fp8Format::Scale::block;
    f.block_n = static_cast<int>(*n);
    f.block_k = static_cast<int>(*k);
    return f;
  }
  // compressed-tensors
  auto fmt = q.find("format");
  if (fmt == q.end() || !fmt->is_string() || (*fmt != "float-quantized" && *fmt != "naive-quantized"))
    fail("config", "{}: \"{}.format\" {} is not supported (supported: \"float-quantized\", \"naive-quantized\" "
         "with 8-bit float weights)", source, key, fmt == q.end() ? std::string("(missing)") : show(*fmt));
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty())
    fail("config", "{}: \"{}.config_groups\" must be a non-empty object", source, key);
  for (auto g = groups->begin(); g != groups->end(); ++g) {
    const std::string where = fmt::format("{}.config_groups.{}.weights", key, g.key());
    const json* w = g->is_object() && g->contains("weights") ? &(*g)["weights"] : nullptr;
    if (w == nullptr || !w->is_object()) fail("config", "{}: \"{}\" is missing", source, where);
    auto get = [&](const char* name) { return w->contains(name) ? (*w)[name] : json(nullptr); };
    const json bits = get("num_bits"), type = get("type"), strategy = get("strategy"), sym = get("symmetric");
    if (Reader::as_integer(bits) != std::optional<int64_t>(8) || type != "float")
      fail("config", "{}: \"{}\": {}-bit {} weights are not supported (supported: 8-bit \"float\", FP8 e4m3)",
           source, where, show(bits), show(type));
    if (!sym.is_null() && sym != true)
      fail("config", "{}: \"{}.symmetric\" {} is not supported (FP8 weights are symmetric)", source, where, show(sym));
    Fp8Format::Scale s;
    if (strategy == "channel") s = Fp8Format::Scale::channel;
    else if (strategy == "tensor") s = Fp8Format::Scale::tensor;
    else
      fail("config", "{}: \"{}.strategy\" {} is not supported (supported: \"channel\", \"tensor\")", source,
           where, show(strategy));
    if (f.quantized() && f.scale != s)
      fail("config", "{}: \"{}.config_groups\": groups with different strategies are not supported", source, key);
    f.scale = s;
  }
  return f;
}

QuantFormat parse_quantization(const json& root, const std::string& source, Fp8Format* fp8) {
  const char* key = "quantization";
  auto it = root.find(key);
  if (it == root.end() || it->is_null()) {
    key = "quantization_config";
    it = root.find(key);
    if (it == root.end() || it->is_null()) return {};
  }
  const json& q = *it;
  if (!q.is_object()) fail("config", "{}: \"{}\" must be an object, found {}", source, key, show(q));
  if (auto m = q.find("quant_method"); m != q.end()) {
    if (m->is_string() && (m->get<std::string>() == "fp8" || m->get<std::string>() == "compressed-tensors") &&
        std::string_view(key) == "quantization_config") {
      *fp8 = parse_fp8(q, m->get<std::string>(), source);
      return {};
    }
    fail("config", "{}: \"{}\": quantization method {} is not supported (supported: MLX affine, "
         "\"quantization\": {{\"group_size\": G, \"bits\": B}}; FP8 e4m3, \"quant_method\": \"fp8\" or "
         "\"compressed-tensors\")", source, key, show(*m));
  }
  if (auto m = q.find("mode"); m != q.end() && !(m->is_string() && m->get<std::string>() == "affine"))
    fail("config", "{}: \"{}.mode\" {} is not supported (supported: \"affine\")", source, key, show(*m));
  QuantFormat f;
  for (auto [name, field] : {std::pair{"bits", &QuantFormat::bits}, std::pair{"group_size", &QuantFormat::group}}) {
    auto v = q.find(name);
    if (v == q.end()) fail("config", "{}: \"{}\" has no \"{}\"", source, key, name);
    auto i = Reader::as_integer(*v);
    if (!i || *i < 0 || *i > 1024) fail("config", "{}: \"{}.{}\" must be an integer, found {}", source, key, name, show(*v));
    f.*field = static_cast<int>(*i);
  }
  if (!supported(f))
    fail("config", "{}: \"{}\": {} bits in groups of {} is not supported (supported: 4 or 8 bits, groups of 32, 64 "
         "or 128)", source, key, f.bits, f.group);
  for (auto e = q.begin(); e != q.end(); ++e)
    if (e.value().is_object() || e.value().is_boolean())
      fail("config", "{}: \"{}\": per-layer settings (\"{}\") are not supported; every quantized matrix must use "
           "{} bits in groups of {}", source, key, e.key(), f.bits, f.group);
  return f;
}

ModelConfig parse_root(const json& root, const std::string& source) {
  if (!root.is_object()) fail("config", "{}: expected a JSON object at the top level", source);
  auto mt = root.find("model_type");
  if (mt == root.end()) {
    fail("config", "{}: missing \"model_type\" (supported: {})", source, supported_model_types());
  }
  if (!mt->is_string()) fail("config", "{}: \"model_type\" must be a string, found {}", source, show(*mt));

  ModelConfig cfg;
  cfg.model_type = mt->get<std::string>();
  cfg.source = source;
  const FamilySchema* family = find_family(cfg.model_type);
  if (family == nullptr) {
    fail("config", "{}: unknown model_type \"{}\" (supported: {})", source, cfg.model_type, supported_model_types());
  }
  const FamilySchema& fs = *family;
  cfg.family = fs.family;

  // Multimodal wrappers (Gemma 3) keep the decoder under "text_config".
  static const json kEmpty = json::object();
  const json* text = &root;
  const json* fallback = nullptr;
  std::string prefix;
  if (cfg.model_type == fs.multimodal_model_type) {
    auto tc = root.find("text_config");
    if (tc != root.end() && !tc->is_null()) {
      if (!tc->is_object()) fail("config", "{}: \"text_config\" must be an object, found {}", source, show(*tc));
      text = &*tc;
    } else {
      text = &kEmpty;
    }
    fallback = &root;
    prefix = "text_config.";
    cfg.nested_text_config = true;
  }
  const Reader r(source, *text, fallback, prefix);
  const FamilyDefaults& d = fs.defaults;

  // Every size is range-checked here, before anything is allocated or read
  // (a typo such as "num_hidden_layers": 1e9 once allocated gigabytes of
  // tensor plans before failing). See the limits in model_config.h.
  cfg.vocab_size = r.bounded_int("vocab_size", d.vocab_size, kMaxVocabSize);
  cfg.hidden_size = r.bounded_int("hidden_size", d.hidden_size, kMaxHiddenSize);
  cfg.intermediate_size = r.bounded_int("intermediate_size", d.intermediate_size, kMaxIntermediateSize);
  cfg.num_layers = r.bounded_int("num_hidden_layers", d.num_layers, kMaxLayers);
  cfg.num_heads = r.bounded_int("num_attention_heads", d.num_heads, kMaxHeads);
  // Absent: the family default; null (or no default): num_attention_heads.
  const json* kv = r.find("num_key_value_heads");
  cfg.num_kv_heads = kv != nullptr && !kv->is_null() ? r.bounded_int("num_key_value_heads", 0, kMaxHeads)
                     : kv == nullptr                 ? d.num_kv_heads.value_or(cfg.num_heads)
                                                     : cfg.num_heads;
  if (cfg.num_heads % cfg.num_kv_heads != 0) {
    fail("config", "{}: {} ({}) is not divisible by {} ({})", source, r.field("num_attention_heads"), cfg.num_heads,
         r.field("num_key_value_heads"), cfg.num_kv_heads);
  }
  // Absent: the family default; null (or no default): hidden_size / num_attention_heads.
  const json* hd = r.find("head_dim");
  if (hd != nullptr && !hd->is_null()) {
    cfg.head_dim = r.bounded_int("head_dim", 0, kMaxHeadDim);
  } else if (hd == nullptr && d.head_dim) {
    cfg.head_dim = *d.head_dim;
  } else {
    if (cfg.hidden_size % cfg.num_heads != 0) {
      fail("config", "{}: {} ({}) is not divisible by {} ({}) and no \"head_dim\" is given", source,
           r.field("hidden_size"), cfg.hidden_size, r.field("num_attention_heads"), cfg.num_heads);
    }
    cfg.head_dim = cfg.hidden_size / cfg.num_heads;
    if (cfg.head_dim > kMaxHeadDim) {
      fail("config", "{}: head_dim {} ({} / {}) is above the limit {}", source, cfg.head_dim, r.field("hidden_size"),
           r.field("num_attention_heads"), kMaxHeadDim);
    }
  }
  if (cfg.head_dim % 2 != 0) fail("config", "{}: head_dim {} must be even for RoPE", source, cfg.head_dim);
  cfg.max_position_embeddings = r.positive_int("max_position_embeddings", d.max_position_embeddings);
  const double eps = r.get_num("rms_norm_eps", 1e-6);
  if (!(eps > 0.0)) r.bad("rms_norm_eps", "a positive number", *r.find("rms_norm_eps"));
  cfg.rms_norm_eps = static_cast<float>(eps);
  cfg.tie_word_embeddings = r.get_bool("tie_word_embeddings", d.tie_word_embeddings);

  cfg.attention_bias = read_switch(r, fs.qkv_bias);
  cfg.attention_out_bias = read_switch(r, fs.o_bias);
  cfg.mlp_bias = read_switch(r, fs.mlp_bias);
  cfg.qk_norm = fs.qk_norm;
  cfg.activation = parse_activation(r, fs.activation_key, std::string(fs.activation_default));

  parse_rope(r, fs, cfg);
  parse_windows(r, fs, cfg);

  cfg.weight_dtype = parse_dtype(r);
  if (fs.refuses_bidirectional && r.get_bool("use_bidirectional_attention", false)) {
    fail("config", "{}: {} is not supported", source, r.field("use_bidirectional_attention"));
  }
  if (fs.query_pre_attn_scalar) {
    cfg.query_pre_attn_scalar = static_cast<float>(r.get_num("query_pre_attn_scalar", *fs.query_pre_attn_scalar));
    if (!(cfg.query_pre_attn_scalar > 0.0f)) {
      r.bad("query_pre_attn_scalar", "a positive number", *r.find("query_pre_attn_scalar"));
    }
  }
  if (fs.logit_softcaps) {
    cfg.attn_logit_softcap = static_cast<float>(r.opt_num("attn_logit_softcapping", d.attn_softcap).value_or(0.0));
    cfg.final_logit_softcap =
        static_cast<float>(r.opt_num("final_logit_softcapping", d.final_softcap).value_or(0.0));
    if (cfg.attn_logit_softcap < 0.0f) r.bad("attn_logit_softcapping", "positive or null", *r.find("attn_logit_softcapping"));
    if (cfg.final_logit_softcap < 0.0f) {
      r.bad("final_logit_softcapping", "positive or null", *r.find("final_logit_softcapping"));
    }
  }
  cfg.norm_weight_plus_one = fs.norm_weight_plus_one;
  cfg.sandwich_norms = fs.sandwich_norms;
  if (fs.embed_scale) {
    // transformers: embeddings * tensor(hidden_size ** 0.5) cast to the weight dtype.
    cfg.embed_scale = round_through(static_cast<float>(std::sqrt(static_cast<double>(cfg.hidden_size))),
                                    cfg.weight_dtype);
  }

  cfg.quantization = parse_quantization(root, source, &cfg.fp8);
  cfg.eos_token_ids = parse_eos(r, d.eos);
  {
    const json* b = r.find("bos_token_id", /*use_fallback=*/true);
    if (b == nullptr) {
      cfg.bos_token_id = d.bos.value_or(-1);
    } else if (b->is_null()) {
      cfg.bos_token_id = -1;
    } else {
      auto i = Reader::as_integer(*b);
      if (!i || *i < 0 || *i > INT32_MAX) r.bad("bos_token_id", "a token id or null", *b);
      cfg.bos_token_id = static_cast<int>(*i);
    }
  }
  return cfg;
}

}  // namespace

// Float32 step by step, in torch's order of operations:
//   inv = 1 / (base ** (arange(0, dim, 2).float() / dim))      (1/x is reciprocal)
//   linear: inv / factor
//   llama3: wavelen = (2*pi) / inv   -> torch evaluates scalar/tensor as reciprocal(inv) * scalar
//           smooth = (ocl / wavelen - low) / (high - low)      (ocl / wavelen likewise)
//           smoothed = (1 - smooth) * inv / factor + smooth * inv  (medium band only)
std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    fail("config", "rope_inv_freq: head_dim {} must be a positive even number", head_dim);
  }
  const int half = head_dim / 2;
  const float base = rope.theta;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  if (rope.type == "default") return inv;
  if (rope.type == "linear") {
    for (float& x : inv) x = x / rope.factor;
    return inv;
  }
  if (rope.type == "llama3") {
    const double ocl = static_cast<double>(rope.original_max_position_embeddings);
    const float low_freq_wavelen = static_cast<float>(ocl / static_cast<double>(rope.low_freq_factor));
    const float high_freq_wavelen = static_cast<float>(ocl / static_cast<double>(rope.high_freq_factor));
    const float two_pi = static_cast<float>(2.0 * M_PI);
    const float ocl_f = static_cast<float>(ocl);
    const float band = static_cast<float>(static_cast<double>(rope.high_freq_factor) -
                                          static_cast<double>(rope.low_freq_factor));
    for (float& x : inv) {
      const float wavelen = (1.0f / x) * two_pi;
      const float scaled = wavelen > low_freq_wavelen ? x / rope.factor : x;
      const float smooth = ((1.0f / wavelen) * ocl_f - rope.low_freq_factor) / band;
      const float smoothed = (1.0f - smooth) * scaled / rope.factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      x = medium ? smoothed : scaled;
    }
    return inv;
  }
  fail("config", "rope_inv_freq: unsupported RoPE type \"{}\" (supported: default, linear, llama3)", rope.type);
}

float ModelConfig::attention_scale() const {
  const double s = query_pre_attn_scalar > 0.0f ? static_cast<double>(query_pre_attn_scalar)
                                                 : static_cast<double>(head_dim);
  return static_cast<float>(std::pow(s, -0.5));
}

ModelConfig parse_model_config(const std::string& json_text) {
  json root;
  try {
    root = parse_limited(json_text, "config.json");
  } catch (const json::parse_error& e) {
    fail("config", "config.json: malformed JSON at byte {}: {}", e.byte, e.what());
  } catch (const json::exception& e) {  // out_of_range.406: a number beyond double's range, e.g. 1e999
    fail("config", "config.json: malformed JSON: {}", e.what());
  }
  return parse_root(root, "config.json");
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::path file =
      std::filesystem::is_regular_file(dir, ec) ? dir : dir / "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("config", "cannot open {}: no such file or not readable", file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json root;
  try {
    root = parse_limited(ss.str(), file.string());
  } catch (const json::parse_error& e) {
    fail("config", "{}: malformed JSON at byte {}: {}", file.string(), e.byte, e.what());
  } catch (const json::exception& e) {  // out_of_range.406: a number beyond double's range
    fail("config", "{}: malformed JSON: {}", file.string(), e.what());
  }
  return parse_root(root, file.string());
}

std::string fp8_format_name(const Fp8Format& f) {
  switch (f.scale) {
    case Fp8Format::Scale::block: return fmt::format("fp8 e4m3 block {}x{}", f.block_n, f.block_k);
    case Fp8Format::Scale::channel: return "fp8 e4m3 per-channel";
    case Fp8Format::Scale::tensor: return "fp8 e4m3 per-tensor";
    case Fp8Format::Scale::none: break;
  }
  return "";
}

}  // namespace kvgraph
