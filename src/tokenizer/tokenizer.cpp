#include "kvgraph/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "kvgraph/error.h"
#include "kvgraph/model_config.h"
#include "tokenizer/json_util.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace kvgraph {

using tok::json;

namespace {

// nlohmann parses iteratively, but dump(), copies and the component readers
// (Sequence of Sequence ...) recurse, so 10^4 nested levels overflowed the
// stack. Real tokenizer.json files nest about 6 levels deep.
constexpr int kMaxJsonDepth = 64;

json parse_json(std::string_view text, std::string_view name) {
  try {
    return json::parse(text.begin(), text.end(), [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) fail("tokenizer", "{}: JSON nested deeper than {} levels", name, kMaxJsonDepth);
      return true;
    });
  } catch (const json::parse_error& e) {
    // e.what() reads "[json.exception.parse_error.101] parse error at line 1, column 2: <why>".
    std::string why = e.what();
    if (auto colon = why.find(": "); colon != std::string::npos) why = why.substr(colon + 2);
    fail("tokenizer", "{}: parse error at byte {}: {}", name, e.byte, why);
  } catch (const json::exception& e) {
    // out_of_range.406, "[json.exception.out_of_range.406] number overflow parsing '1e999'": a number
    // beyond double's range, which nlohmann reports as out_of_range, not parse_error.
    std::string why = e.what();
    if (auto close = why.find("] "); close != std::string::npos) why = why.substr(close + 2);
    fail("tokenizer", "{}: {}", name, why);
  }
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("tokenizer", "{}: cannot open file", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("tokenizer", "{}: read error", path.string());
  return ss.str();
}

// TemplateProcessing "single", Roberta/Bert cls+sep, ByteLevel (nothing) and
// Sequence, reduced to the ids placed before and after the text's tokens.
void parse_post_processor(const json& j, const std::string& where, std::vector<int32_t>& prefix,
                          std::vector<int32_t>& suffix) {
  const std::string type = tok::type_of(j, where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = tok::need_array(j, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_null()) continue;
      std::vector<int32_t> p, s;
      parse_post_processor(list[i], fmt::format("{}.processors[{}]", where, i), p, s);
      prefix.insert(prefix.begin(), p.begin(), p.end());  // each processor wraps the previous result
      suffix.insert(suffix.end(), s.begin(), s.end());
    }
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = tok::need_array(j, "single", where);
    const json* specials = tok::opt_field(j, "special_tokens");
    bool seen_sequence = false;
    for (const json& item : single) {
      if (tok::opt_field(item, "Sequence")) {
        if (seen_sequence) tok::bad_json(where, "\"single\" holds more than one sequence");
        seen_sequence = true;
        continue;
      }
      const json* st = tok::opt_field(item, "SpecialToken");
      if (!st) tok::bad_json(where, fmt::format("unknown template piece {}", item.dump()));
      const std::string name = tok::need_string(*st, "id", where);
      const json* entry = specials ? tok::opt_field(*specials, name.c_str()) : nullptr;
      if (!entry) tok::bad_json(where, fmt::format("special token \"{}\" is missing from \"special_tokens\"", name));
      for (const json& id : tok::need_array(*entry, "ids", where)) {
        (seen_sequence ? suffix : prefix).push_back(tok::as_token_id(id, where));
      }
    }
    if (!seen_sequence) tok::bad_json(where, "\"single\" has no $A sequence");
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) {
      const json& v = tok::need_field(j, key, where);
      if (!v.is_array() || v.size() != 2) tok::bad_json(where, fmt::format("\"{}\" must be [token, id]", key));
      return tok::as_token_id(v[1], where);
    };
    prefix.push_back(id_of("cls"));
    suffix.push_back(id_of("sep"));
    return;
  }
  tok::unsupported_type(where, type, "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence");
}

// "eos_token": "<|im_end|>" or {"content": "<|im_end|>", ...} or null.
std::optional<std::string> config_token(const json& config, const char* key) {
  const json* v = tok::opt_field(config, key);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object()) {
    if (const json* c = tok::opt_field(*v, "content"); c && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

std::shared_ptr<Tokenizer::Impl> load(std::string_view tokenizer_json, std::string_view config_json) {
  const json root = parse_json(tokenizer_json, "tokenizer.json");
  if (!root.is_object()) fail("tokenizer", "tokenizer.json: the top level must be an object");
  auto impl = std::make_shared<Tokenizer::Impl>();

  try {
    // Model.
    const json* model = tok::opt_field(root, "model");
    if (!model || !model->is_object()) fail("tokenizer", "tokenizer.json: missing \"model\"");
    std::string type = tok::opt_string(*model, "type", "", "model");
    if (type.empty()) {
      // Files from before "type" was written: tokenizers tells models apart by their fields.
      const json* vocab = tok::opt_field(*model, "vocab");
      type = tok::opt_field(*model, "merges") ? "BPE" : (vocab && vocab->is_array()) ? "Unigram" : "WordLevel";
    }
    if (type != "BPE") fail("tokenizer", "model type \"{}\" is not supported (supported: BPE)", type);
    impl->model = std::make_unique<tok::Bpe>(*model);

    if (const json* n = tok::opt_field(root, "normalizer")) impl->normalizer = tok::parse_normalizer(*n, "normalizer");
    if (const json* p = tok::opt_field(root, "pre_tokenizer")) {
      impl->pre_tokenizer = tok::parse_pre_tokenizer(*p, "pre_tokenizer");
    }
    if (const json* d = tok::opt_field(root, "decoder")) impl->decoder = tok::parse_decoder(*d, "decoder");
    if (const json* p = tok::opt_field(root, "post_processor")) {
      parse_post_processor(*p, "post_processor", impl->prefix_ids, impl->suffix_ids);
    }

    // Added tokens.
    if (const json* list = tok::opt_field(root, "added_tokens")) {
      if (!list->is_array()) tok::bad_json("added_tokens", "must be an array");
      for (size_t i = 0; i < list->size(); ++i) {
        const json& a = (*list)[i];
        const std::string where = fmt::format("added_tokens[{}]", i);
        tok::AddedToken t;
        t.id = tok::as_token_id(tok::need_field(a, "id", where), where);
        t.content = tok::need_string(a, "content", where);
        t.special = tok::opt_bool(a, "special", false, where);
        t.single_word = tok::opt_bool(a, "single_word", false, where);
        t.lstrip = tok::opt_bool(a, "lstrip", false, where);
        t.rstrip = tok::opt_bool(a, "rstrip", false, where);
        t.normalized = tok::opt_bool(a, "normalized", !t.special, where);
        if (t.content.empty()) continue;
        if (!tok::is_valid_utf8(t.content)) tok::bad_json(where, "content is not valid UTF-8");
        impl->added_ids[t.content] = t.id;
        impl->added.push_back(std::move(t));
      }
    }
  } catch (const json::exception& e) {
    fail("tokenizer", "tokenizer.json: unexpected structure: {}", e.what());
  }

  // Token table.
  int32_t size = 0;
  for (const auto& [token, id] : impl->model->vocab()) size = std::max(size, id + 1);
  for (const tok::AddedToken& t : impl->added) size = std::max(size, t.id + 1);
  impl->tokens.resize(static_cast<size_t>(size));
  impl->flags.assign(static_cast<size_t>(size), 0);
  for (const auto& [token, id] : impl->model->vocab()) {
    impl->tokens[id] = token;
    impl->flags[id] = Tokenizer::Impl::kExists;
  }
  for (const tok::AddedToken& t : impl->added) {
    impl->tokens[t.id] = t.content;
    impl->flags[t.id] = Tokenizer::Impl::kExists | (t.special ? Tokenizer::Impl::kSpecial : 0);
    if (t.normalized) {
      // Normalized tokens are looked for in the normalized text, in their normalized form.
      std::string pattern = t.content;
      if (impl->normalizer) impl->normalizer->apply(pattern);
      if (pattern != t.content) {
        impl->normalized_forms.resize(impl->tokens.size());
        impl->normalized_forms[t.id] = pattern;
        impl->flags[t.id] |= Tokenizer::Impl::kNormalizedForm;
      }
      impl->normalized_matcher.add(t, std::move(pattern));
    } else {
      impl->raw_matcher.add(t, t.content);
    }
  }
  // The post-processor's ids are emitted as they are: each must name a token, or
  // encode would hand out an id past vocab_size() (an embedding row that may not exist).
  for (const std::vector<int32_t>* ids : {&impl->prefix_ids, &impl->suffix_ids}) {
    for (int32_t id : *ids) {
      if (id >= size || !(impl->flags[static_cast<size_t>(id)] & Tokenizer::Impl::kExists)) {
        fail("tokenizer", "tokenizer.json: post_processor: token id {} is in neither the vocabulary nor "
             "added_tokens", id);
      }
    }
  }

  // tokenizer_config.json: bos/eos and add_bos_token / add_eos_token.
  auto id_of = [&](const std::string& token) -> std::optional<int32_t> {
    if (auto it = impl->added_ids.find(token); it != impl->added_ids.end()) return it->second;
    if (auto it = impl->model->vocab().find(token); it != impl->model->vocab().end()) return it->second;
    return std::nullopt;
  };
  if (!config_json.empty()) {
    const json config = parse_json(config_json, "tokenizer_config.json");
    if (!config.is_object()) fail("tokenizer", "tokenizer_config.json: the top level must be an object");
    if (auto t = config_token(config, "bos_token")) impl->bos = id_of(*t);
    if (auto t = config_token(config, "eos_token")) impl->eos = id_of(*t);
    auto flag = [&](const char* key) -> std::optional<bool> {
      const json* v = tok::opt_field(config, key);
      if (v && v->is_boolean()) return v->get<bool>();
      return std::nullopt;
    };
    // Explicit flags win over the post-processor, as transformers' Llama-style tokenizers do.
    if (auto add = flag("add_bos_token"); add && impl->bos) {
      auto& p = impl->prefix_ids;
      const bool has = !p.empty() && p.front() == *impl->bos;
      if (*add && !has) p.insert(p.begin(), *impl->bos);
      if (!*add && has) p.erase(p.begin());
    }
    if (auto add = flag("add_eos_token"); add && impl->eos) {
      auto& s = impl->suffix_ids;
      const bool has = !s.empty() && s.back() == *impl->eos;
      if (*add && !has) s.push_back(*impl->eos);
      if (!*add && has) s.pop_back();
    }
  } else {
    for (const char* name : {"<s>", "<|begin_of_text|>", "<bos>"}) {
      if ((impl->bos = id_of(name))) break;
    }
    for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"}) {
      if ((impl->eos = id_of(name))) break;
    }
  }
  return impl;
}

}  // namespace

std::vector<int32_t> Tokenizer::Impl::encode(std::string_view input, bool add_special_tokens) const {
  std::string repaired;
  if (!tok::is_valid_utf8(input)) {
    repaired = tok::utf8_lossy(input);
    input = repaired;
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = prefix_ids;

  std::vector<tok::Piece> pieces;
  auto encode_text = [&](std::string_view text, bool at_origin) {
    std::string normalized(text);
    if (normalizer) normalizer->apply(normalized);
    const std::vector<tok::TextSplit> splits =
        normalized_matcher.empty() ? std::vector<tok::TextSplit>{{0, normalized.size(), -1}}
                                   : normalized_matcher.split(normalized);
    for (const tok::TextSplit& s : splits) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        continue;
      }
      if (s.end == s.begin) continue;
      pieces.clear();
      pieces.push_back({normalized.substr(s.begin, s.end - s.begin), at_origin && s.begin == 0});
      if (pre_tokenizer) pre_tokenizer->apply(pieces);
      for (const tok::Piece& p : pieces) model->tokenize(p.text, ids);
    }
  };

  if (raw_matcher.empty()) {
    if (!input.empty()) encode_text(input, true);
  } else {
    for (const tok::TextSplit& s : raw_matcher.split(input)) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        encode_text(input.substr(s.begin, s.end - s.begin), s.begin == 0);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
  return ids;
}

std::string Tokenizer::Impl::decode(std::span<const int32_t> ids, bool skip_special_tokens, DecodeMode mode,
                                    bool* held) const {
  std::vector<std::string> parts;
  parts.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= tokens.size() || !(flags[id] & kExists)) continue;
    if (skip_special_tokens && (flags[id] & kSpecial)) continue;
    parts.push_back((flags[id] & kNormalizedForm) ? normalized_forms[id] : tokens[id]);
  }
  std::string joined;
  tok::DecodeState state;
  state.stream = mode != DecodeMode::Full;
  state.hold_tail = mode == DecodeMode::StreamStep;
  if (decoder) {
    decoder->apply(parts, state);
    for (const std::string& p : parts) joined += p;
  } else {
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i) joined += ' ';
      joined += parts[i];
    }
  }
  size_t held_bytes = 0;
  std::string text = tok::utf8_lossy(joined, state.hold_tail, &held_bytes);
  if (held) *held = state.held || held_bytes > 0;
  return text;
}

// ---- Tokenizer ----------------------------------------------------------------

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= "tokenizer.json";
  if (!std::filesystem::exists(file, ec)) fail("tokenizer", "{}: file not found", file.string());
  const std::string text = read_file(file);
  std::string config;
  const std::filesystem::path config_path = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, ec)) config = read_file(config_path);
  try {
    Tokenizer t(load(text, config));
    t.source_ = file;
    return t;
  } catch (const Error& e) {
    // Name the file the message is about.
    std::string msg = e.what();
    const std::string tag = "[tokenizer] ";
    if (msg.rfind(tag, 0) == 0) msg = msg.substr(tag.size());
    throw Error(fmt::format("[tokenizer] {}: {}", file.parent_path().string(), msg));
  }
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  return Tokenizer(load(tokenizer_json, config_json));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens, Impl::DecodeMode::Full);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  if (auto it = impl_->model->vocab().find(token); it != impl_->model->vocab().end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size() || !(impl_->flags[id] & Impl::kExists)) {
    return std::nullopt;
  }
  return impl_->tokens[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->flags.size() && (impl_->flags[id] & Impl::kSpecial);
}

std::span<const int32_t> Tokenizer::prefix_special_ids() const { return impl_->prefix_ids; }
std::span<const int32_t> Tokenizer::suffix_special_ids() const { return impl_->suffix_ids; }

Tokenizer check_vocab(Tokenizer tokenizer, const ModelConfig& config) {
  const int32_t n = tokenizer.vocab_size();  // one past its largest id
  if (n <= config.vocab_size) return tokenizer;
  const std::string tok = tokenizer.source().empty() ? std::string("the tokenizer") : tokenizer.source().string();
  const std::string cfg = config.source.empty() ? std::string("the model config") : config.source;
  fail("tokenizer",
       "{} has token ids up to {} but {} has vocab_size {} (ids 0 to {}): the tokenizer does not belong to this "
       "model",
       tok, n - 1, cfg, config.vocab_size, config.vocab_size - 1);
}

}  // namespace kvgraph
