#include "cli/common.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "kvgraph/error.h"

namespace kvgraph::cli {

void ModelFlags::add(CLI::App& app) {
  app.add_option("-m,--model", model,
                 "Model directory (Hugging Face layout) or synthetic:NAME; default: the embedded model");
  app.add_option("--device", device, "cpu or cuda")->capture_default_str();
  app.add_option("--capacity", capacity, "KV cache capacity in tokens (default: fits the request)");
  app.add_option("--chunk", chunk, "Prefill step size in tokens (max_write); default 512 on cuda, 64 on cpu")
      ->each([this](const std::string&) { chunk_given = true; });
  app.add_option("--kv-dtype", kv_dtype,
                 "KV cache storage of K and V: f32, bf16, f16, int8 / int4 (affine groups of --kv-group along "
                 "head_dim) or fp8 (e4m3, a scale per token and head); default f32 on cpu, bf16 on cuda");
  app.add_option("--k-dtype", k_dtype, "K storage only (overrides --kv-dtype for K)");
  app.add_option("--v-dtype", v_dtype, "V storage only (overrides --kv-dtype for V)");
  app.add_option("--kv-group", kv_group, "Values per scale and bias of int8 / int4 KV: 32 or 64")
      ->capture_default_str();
  app.add_option("--cpu-weights", cpu_weights,
                 "CPU storage of a bf16 checkpoint: auto (bf16 above 1 GiB as f32), f32 or bf16 (half the memory)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  app.add_option("--weights", weights,
                 "Matrix format: bf16 (as stored: float, or the checkpoint's own quantization), or int8 / int4 "
                 "to quantize a float checkpoint on load (MLX affine, groups of --group-size), or fp8 to round its "
                 "linear layers to fp8 e4m3 in 128x128 blocks (as an FP8 checkpoint; computed as floats for now)")
      ->check(CLI::IsMember({"bf16", "int8", "int4", "fp8"}));
  app.add_option("--group-size", group_size, "Quantization group of --weights int8|int4: 32, 64 or 128")
      ->capture_default_str();
  app.add_flag("--eager", eager, "Decode without recording the step (debugging, parity)");
  app.add_option("--tune", tune,
                 "CUDA kernel choices for experiments, e.g. gemv=warp4,attn-heads=2 (keys: gemv "
                 "auto|block2|warp2|warp4|mma|mma8|mma16|mmax, attn auto|fast|staged|mma|legacy, "
                 "attn-heads, verify-heads, attn-chunk, attn-merge cluster|global, attn-prefetch on|off, pdl on|off, "
                 "qx f32|int8, qgemv stream|regs|blocks, qring auto|CxS|CxSxB, mt auto|r4u2|r8u2|r8u1|r4u4|p4u2|p2u4|p8u1|"
                 "h8u1|h4u2|h4u1|s8x3|s4x4|s4x6, prefill-attn legacy|flash, qmma auto|N)");
  app.add_flag("-q,--quiet", quiet, "No progress or timings on stderr");
}

void ModelFlags::check() const {
  check_at_least("--capacity", capacity, 0, " (0: fits the request)");
  if (chunk_given) check_at_least("--chunk", chunk, 1);
  for (const auto& [flag, value] : {std::pair{"--kv-dtype", &kv_dtype}, std::pair{"--k-dtype", &k_dtype},
                                    std::pair{"--v-dtype", &v_dtype}})
    if (!value->empty() && parse_kv_format(*value, kv_group).type == KvType::Invalid)
      usage_fail("{} {}: expected f32, bf16, f16, int8, int4 or fp8", flag, *value);
  if (kv_group != 32 && kv_group != 64) usage_fail("--kv-group {}: expected 32 or 64", kv_group);
  if (!weights.empty() && weights != "bf16" && weights != "int8" && weights != "int4" && weights != "fp8")
    usage_fail("--weights {}: expected bf16, int8, int4 or fp8", weights);
  if (group_size != 32 && group_size != 64 && group_size != 128)
    usage_fail("--group-size {}: expected 32, 64 or 128", group_size);
}

int ModelFlags::prefill_chunk() const {
  if (chunk_given) return chunk;
  return device == "cuda" ? 512 : 64;
}

QuantFormat ModelFlags::quantize() const {
  if (weights == "int8") return {8, group_size};
  if (weights == "int4") return {4, group_size};
  if (weights == "fp8") return {.fp8 = true};
  return {};
}

void check_at_least(const char* flag, int64_t value, int64_t min, const char* note) {
  if (value < min) usage_fail("{} {}: expected an integer >= {}{}", flag, value, min, note);
}

void check_sampling_flags(const ops::SamplingParams& p) {
  auto issue = ops::check(p);
  if (!issue) return;
  const std::string flag = issue->field == "temperature"   ? "--temperature"
                           : issue->field == "top_k"       ? "--top-k"
                           : issue->field == "top_p"       ? "--top-p"
                           : issue->field == "repetition_penalty" ? "--repeat-penalty"
                                                                  : issue->field;
  usage_fail("{} {}: expected {}", flag, issue->value, issue->expected);
}

KvStorage ModelFlags::kv_storage(Device d) const {
  check();
  const KvFormat both = kv_dtype.empty() ? KvFormat(d == Device::CUDA ? DType::BF16 : DType::F32)
                                         : parse_kv_format(kv_dtype, kv_group);
  return KvStorage{k_dtype.empty() ? both : parse_kv_format(k_dtype, kv_group),
                   v_dtype.empty() ? both : parse_kv_format(v_dtype, kv_group)};
}

void ModelFlags::check_kv_storage(const ModelConfig& c, Device d) const {
  const KvStorage st = kv_storage(d);
  for (const auto& [flag, f] : {std::pair{k_dtype.empty() ? "--kv-dtype" : "--k-dtype", st.k},
                                std::pair{v_dtype.empty() ? "--kv-dtype" : "--v-dtype", st.v}}) {
    const std::string why = kv_format_problem(f, c.head_dim);
    if (!why.empty())
      usage_fail("{} {} does not fit this model: {}", flag, kv_format_name(f), why);
  }
}

std::filesystem::path default_model_dir() {
  // Found from the executable, so a build tree or an install can be moved:
  // build/<preset>/kvgraph -> models/default of the source tree;
  // <prefix>/bin/kvgraph -> <prefix>/share/kvgraph/models/default.
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) fail("cli", "cannot locate the kvgraph executable to find the default model: pass --model DIR");
  const std::filesystem::path bin = exe.parent_path();
  const std::filesystem::path candidates[] = {bin / ".." / ".." / "models" / "default",
                                              bin / ".." / "share" / "kvgraph" / "models" / "default"};
  for (const auto& p : candidates)
    if (std::filesystem::exists(p / "config.json")) return p.lexically_normal();
  fail("cli", "no default model next to {} (looked in {} and {}): pass --model DIR", exe.string(),
       candidates[0].lexically_normal().string(), candidates[1].lexically_normal().string());
}

std::shared_ptr<Model> load_model(const ModelFlags& f, double* seconds) {
  const Device dev = parse_device(f.device);
  auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<Model> m;
  if (f.model.rfind("synthetic:", 0) == 0) {
    f.check_kv_storage(Model::describe_synthetic(f.model.substr(10), dev, f.quantize()).config, dev);
    m = Model::synthetic(f.model.substr(10), dev, 1, f.quantize());
  } else {
    std::filesystem::path dir = f.model.empty() ? default_model_dir() : std::filesystem::path(f.model);
    if (!std::filesystem::exists(dir)) fail("cli", "model directory {} does not exist", dir.string());
    // The KV formats against the config, before any weight is read.
    if (std::filesystem::exists(dir / "config.json")) f.check_kv_storage(load_model_config(dir), dev);
    const bool bar = !f.quiet && isatty(STDERR_FILENO);
    int last = -1;
    const Model::CpuWeights cw = f.cpu_weights == "f32"    ? Model::CpuWeights::f32
                                 : f.cpu_weights == "bf16" ? Model::CpuWeights::bf16
                                                           : Model::CpuWeights::automatic;
    m = Model::load(dir, dev, [&](size_t done, size_t total) {
      if (!bar || total < (64u << 20)) return;
      int pct = static_cast<int>(100.0 * done / total);
      if (pct == last) return;
      last = pct;
      int w = pct / 4;
      fmt::print(stderr, "\rloading {} [{}{}] {:3d}% of {:.1f} GB", dir.filename().string(), std::string(w, '#'),
                 std::string(25 - w, ' '), pct, total / 1e9);
      if (done >= total) fmt::print(stderr, "\n");
    }, cw, f.quantize());
  }
  if (seconds) *seconds = seconds_since(t0);
  const int trained = m->config().max_position_embeddings;
  if (trained > 0 && f.capacity > trained)
    fmt::print(stderr,
               "[kvgraph] warning: --capacity {} is beyond the {} positions the model was trained on "
               "(max_position_embeddings); output past position {} may degrade\n",
               f.capacity, trained, trained);
  return m;
}

std::optional<Tokenizer> load_tokenizer(const Model& m, bool required) {
  auto p = m.dir() / "tokenizer.json";
  if (m.dir().empty() || !std::filesystem::exists(p)) {
    if (required)
      fail("cli", "no tokenizer.json in {}: pass token ids instead (--prompt-ids)",
           m.dir().empty() ? std::string("this model") : m.dir().string());
    return std::nullopt;
  }
  return check_vocab(Tokenizer::from_file(p), m.config());
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  std::string tok;
  auto flush = [&] {
    if (tok.empty()) return;
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(tok, &used);
    } catch (...) {
      used = 0;
    }
    if (used != tok.size() || v < 0 || v > INT32_MAX) fail("cli", "{}: \"{}\" is not a token id", what, tok);
    ids.push_back(static_cast<int32_t>(v));
    tok.clear();
  };
  for (char c : text) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c)))
      flush();
    else
      tok += c;
  }
  flush();
  return ids;
}

namespace {

// Reads `f` to its end; `where` names it in errors.
std::string read_all(std::FILE* f, const std::string& what, const std::string& where) {
  std::string text;
  char buf[1 << 16];
  size_t n = 0;
  errno = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  if (std::ferror(f)) fail("cli", "{}: cannot read {}: {}", what, where, std::strerror(errno ? errno : EIO));
  return text;
}

}  // namespace

std::string read_file(const std::filesystem::path& p, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) fail("cli", "{}: cannot open {}: it is a directory", what, p.string());
  std::FILE* f = std::fopen(p.c_str(), "rb");
  if (!f) fail("cli", "{}: cannot open {}: {}", what, p.string(), std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, &std::fclose);
  return read_all(f, what, p.string());
}

std::string read_stdin(const std::string& what) { return read_all(stdin, what, "stdin"); }

Output::Output(std::FILE* borrowed, std::string name, std::string component)
    : f_(borrowed), owned_(false), name_(std::move(name)), component_(std::move(component)) {}

Output::Output(const std::filesystem::path& p, std::string name, std::string component)
    : owned_(true), name_(std::move(name)), component_(std::move(component)) {
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) fail_write(EISDIR);
  f_ = std::fopen(p.c_str(), "wb");
  if (!f_) fail_write(errno);
}

Output::~Output() {
  if (owned_ && f_) std::fclose(f_);
}

void Output::fail_write(int err) const {
  fail(component_, "cannot write {}: {}", name_, std::strerror(err ? err : EIO));
}

void Output::write(std::string_view bytes) {
  if (bytes.empty()) return;
  errno = 0;
  if (std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) fail_write(errno);
}

void Output::flush() {
  errno = 0;
  if (std::fflush(f_) != 0 || std::ferror(f_)) fail_write(errno);
}

void Output::finish() {
  flush();
  if (!owned_) return;
  std::FILE* f = f_;
  f_ = nullptr;
  errno = 0;
  if (std::fclose(f) != 0) fail_write(errno);
}

}  // namespace kvgraph::cli
