// kvgraph score / perplexity: negative log-likelihood of token sequences.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "kvgraph/error.h"

namespace kvgraph::cli {

namespace {

struct Scored {
  std::vector<double> nll;     // nll[i] = -log p(ids[i] | ids[<i]) for i >= 1; nll[0] = 0
  std::vector<int32_t> argmax;  // arg-max token after each position
};

// Scores `ids` from an empty cache, chunked prefill with every row's logits.
Scored score_ids(Session& s, const std::vector<int32_t>& ids) {
  s.reset();
  Scored r;
  r.nll.assign(ids.size(), 0.0);
  r.argmax.assign(ids.size(), 0);
  s.prefill(ids, [&](int32_t position, int32_t n, const std::vector<float>& logits) {
    const size_t V = logits.size() / n;
    for (int32_t t = 0; t < n; ++t) {
      const float* row = logits.data() + t * V;
      size_t best = 0;
      double mx = row[0];
      for (size_t j = 1; j < V; ++j)
        if (row[j] > row[best]) best = j;
      mx = row[best];
      double sum = 0;
      for (size_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
      const size_t i = position + t;
      r.argmax[i] = static_cast<int32_t>(best);
      if (i + 1 < ids.size()) r.nll[i + 1] = -(double(row[ids[i + 1]]) - mx - std::log(sum));
    }
  });
  return r;
}

// `component` names the command in errors ("score", "perplexity").
Session make_scoring_session(std::shared_ptr<Model> model, const ModelFlags& f, int32_t len, const char* component) {
  SessionOptions so;
  so.capacity = f.capacity > 0 ? f.capacity : len;
  so.max_write = f.prefill_chunk();
  so.kv_storage = f.kv_storage(model->device());
  so.all_logits = true;
  so.eager = true;
  so.tuning = f.tuning();
  if (len > so.capacity) fail(component, "{} tokens do not fit the cache capacity {}", len, so.capacity);
  return Session(std::move(model), so);
}

// The whole of a file the user named (`what`: "--ids FILE", "FILE"), with
// errors under `component`.
std::string read_input(const std::string& path, const std::string& what, const char* component) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(component, "{}: is a directory, not a file", what);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(component, "{}: cannot open", what);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(component, "{}: cannot read", what);
  return ss.str();
}

// A token id of an --ids file and where it stands, for messages.
struct IdAt {
  int64_t id;      // -1: not a number, or negative
  int line, position;  // 1-based; position counts ids within the line
  std::string text;    // as written (printable ASCII; cut when long)
};

// Parses an --ids file: ids separated by whitespace or commas. Anything but
// printable ASCII is refused before any of it is echoed in a message.
std::vector<IdAt> parse_ids_file(const std::string& text, const std::string& path) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
    if (c >= 0x80)
      fail("score", "--ids {}: byte 0x{:02x} at offset {} is not ASCII: expected token ids separated by spaces, commas "
           "or newlines", path, c, i);
    if ((c < 0x20 && !space) || c == 0x7f)
      fail("score", "--ids {}: not a text file (byte 0x{:02x} at offset {})", path, c, i);
  }
  std::vector<IdAt> ids;
  int line = 1, position = 0;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
      position = 0;
    }
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    size_t e = i;
    while (e < text.size() && text[e] != ',' && !std::isspace(static_cast<unsigned char>(text[e]))) ++e;
    const std::string_view t(text.data() + i, e - i);
    IdAt at{-1, line, ++position, std::string(t.substr(0, 40)) + (t.size() > 40 ? "..." : "")};
    if (t.front() != '-' && t.front() != '+') {
      int64_t v = 0;
      auto [end, err] = std::from_chars(t.data(), t.data() + t.size(), v);
      if (end == t.data() + t.size()) at.id = err == std::errc::result_out_of_range ? INT64_MAX : v;
    }
    if (at.id < 0)
      fail("score", "{} line {}, position {}: \"{}\" is not a token id{}", path, at.line, at.position, at.text,
           t.front() == '-' ? " (negative)" : "");
    ids.push_back(std::move(at));
    i = e;
  }
  return ids;
}

struct ScoreFlags {
  ModelFlags m;
  std::string ids_file;
};

void run_score(const ScoreFlags& f) {
  f.m.check();
  const auto parsed = parse_ids_file(read_input(f.ids_file, "--ids " + f.ids_file, "score"), f.ids_file);
  if (parsed.empty()) fail("score", "--ids {}: no token ids", f.ids_file);
  auto model = load_model(f.m);
  const int64_t vocab = model->config().vocab_size;
  std::vector<int32_t> ids;
  for (const IdAt& at : parsed) {
    if (at.id >= vocab)
      fail("score", "{} line {}, position {}: token id {} is out of range: the model's vocabulary has {} ids (0..{})",
           f.ids_file, at.line, at.position, at.text, vocab, vocab - 1);
    ids.push_back(static_cast<int32_t>(at.id));
  }
  Session s = make_scoring_session(model, f.m, static_cast<int32_t>(ids.size()), "score");
  Scored r = score_ids(s, ids);
  double total = 0;
  for (size_t i = 1; i < r.nll.size(); ++i) total += r.nll[i];
  nlohmann::json j;
  j["nll"] = std::vector<double>(r.nll.begin() + 1, r.nll.end());
  j["total_nll"] = total;
  j["argmax"] = r.argmax;
  j["n"] = ids.size();
  fmt::print("{}\n", j.dump());
}

struct PerplexityFlags {
  ModelFlags m;
  std::string file;
  int ctx = 256;
  std::string separator;
  bool json = false;
};

void run_perplexity(const PerplexityFlags& f) {
  f.m.check();
  check_at_least("--ctx", f.ctx, 2);
  if (f.m.capacity > 0 && f.ctx > f.m.capacity)
    usage_fail("--ctx {}: a window does not fit --capacity {} (raise --capacity, or leave it out)", f.ctx, f.m.capacity);
  std::string text = read_input(f.file, f.file, "perplexity");
  auto model = load_model(f.m);
  auto tok = load_tokenizer(*model, false);
  if (!tok)
    fail("perplexity", "no tokenizer.json in {}: the text cannot be tokenized (score --ids takes token ids)",
         model->dir().empty() ? std::string("this model") : model->dir().string());
  // Token stream: each entry encoded with its special prefix (BOS), then EOS.
  std::vector<std::string> entries;
  if (f.separator.empty()) {
    entries.push_back(text);
  } else {
    std::string cur;
    size_t i = 0;
    while (i <= text.size()) {
      size_t e = text.find('\n', i);
      if (e == std::string::npos) e = text.size();
      std::string line = text.substr(i, e - i);
      if (line == f.separator) {
        entries.push_back(cur);
        cur.clear();
      } else {
        cur += line;
        cur += '\n';
      }
      i = e + 1;
    }
    entries.push_back(cur);
  }
  std::vector<int32_t> stream;
  for (auto& e : entries) {
    while (!e.empty() && (e.back() == '\n')) e.pop_back();
    if (e.empty()) continue;
    auto ids = tok->encode(e, true);
    stream.insert(stream.end(), ids.begin(), ids.end());
    if (tok->eos_id()) stream.push_back(*tok->eos_id());
  }
  const size_t n_chunks = stream.size() / f.ctx;
  if (n_chunks == 0) fail("perplexity", "{}: {} tokens, fewer than one --ctx window of {}", f.file, stream.size(), f.ctx);
  Session s = make_scoring_session(model, f.m, f.ctx, "perplexity");
  double total = 0;
  size_t count = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> chunk(stream.begin() + c * f.ctx, stream.begin() + (c + 1) * f.ctx);
    Scored r = score_ids(s, chunk);
    for (size_t i = 1; i < r.nll.size(); ++i) total += r.nll[i];
    count += chunk.size() - 1;
    if (!f.m.quiet && !f.json)
      fmt::print(stderr, "\r[{}/{}] ppl {:.4f}", c + 1, n_chunks, std::exp(total / count));
  }
  if (!f.m.quiet && !f.json) fmt::print(stderr, "\n");
  const double mean = total / count;
  if (f.json) {
    nlohmann::json j{{"perplexity", std::exp(mean)}, {"mean_nll", mean}, {"chunks", n_chunks},
                     {"ctx", f.ctx}, {"tokens_scored", count}, {"tokens_dropped", stream.size() - n_chunks * f.ctx},
                     {"seconds", seconds_since(t0)}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("perplexity {:.4f} (mean nll {:.5f} over {} tokens in {} chunks of {})\n", std::exp(mean), mean, count,
               n_chunks, f.ctx);
  }
}

}  // namespace

void add_score(CLI::App& app) {
  auto f = std::make_shared<ScoreFlags>();
  CLI::App* c = app.add_subcommand("score", "Per-position NLL and arg-max of a token-id sequence (JSON)");
  c->footer("Example:\n  kvgraph score --model DIR --ids ids.txt --chunk 3");
  f->m.add(*c);
  c->add_option("--ids", f->ids_file, "File of whitespace-separated token ids")->required();
  c->callback([f] { run_score(*f); });
}

void add_perplexity(CLI::App& app) {
  auto f = std::make_shared<PerplexityFlags>();
  CLI::App* c = app.add_subcommand("perplexity", "Perplexity of a text file");
  c->footer(
      "The file is tokenized (each entry with BOS, followed by EOS), cut into --ctx windows, and each window\n"
      "is scored from an empty cache, predicting its tokens 1..ctx-1; a short tail is dropped.\n"
      "Example:\n  kvgraph perplexity data/corpus/heldout.txt --separator %");
  f->m.add(*c);
  c->add_option("file", f->file, "Text file")->required();
  c->add_option("--ctx", f->ctx, "Window length in tokens")->capture_default_str();
  c->add_option("--separator", f->separator, "A line equal to this separates entries");
  c->add_flag("--json", f->json, "Print JSON");
  c->callback([f] { run_perplexity(*f); });
}

}  // namespace kvgraph::cli
