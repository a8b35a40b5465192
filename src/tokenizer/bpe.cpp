#include "tokenizer/bpe.h"

#include <queue>

#include "tokenizer/json_util.h"
#include "tokenizer/utf8.h"

namespace kvgraph::tok {

Bpe::Bpe(const json& model) {
  const std::string_view where = "model";
  if (const json* d = opt_field(model, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0)) {
    bad_json(where, "BPE dropout is not supported (sampling tokenizations is for training)");
  }
  const json& vocab = need_field(model, "vocab", where);
  if (!vocab.is_object()) bad_json(where, "\"vocab\" must be an object of token -> id");
  vocab_.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) vocab_[token] = as_token_id(id, "model.vocab");

  if (std::string unk = opt_string(model, "unk_token", "", where); !unk.empty()) {
    auto it = vocab_.find(unk);
    if (it == vocab_.end()) bad_json(where, fmt::format("unk_token \"{}\" is not in the vocabulary", unk));
    unk_id_ = it->second;
  }
  fuse_unk_ = opt_bool(model, "fuse_unk", false, where);
  byte_fallback_ = opt_bool(model, "byte_fallback", false, where);
  ignore_merges_ = opt_bool(model, "ignore_merges", false, where);
  continuing_subword_prefix_ = opt_string(model, "continuing_subword_prefix", "", where);
  end_of_word_suffix_ = opt_string(model, "end_of_word_suffix", "", where);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  // Merges: ["a b", ...] (older files) or [["a", "b"], ...] (tokenizers >= 0.20).
  const json* merges = opt_field(model, "merges");
  if (!merges) return;
  if (!merges->is_array()) bad_json(where, "\"merges\" must be an array");
  merges_.reserve(merges->size());
  auto id_of = [&](const std::string& token, size_t rank) {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) {
      bad_json(where, fmt::format("merge #{} uses \"{}\", which is not in the vocabulary", rank, token));
    }
    return it->second;
  };
  const size_t prefix_len = continuing_subword_prefix_.size();
  int32_t rank = 0;
  for (const json& m : *merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) bad_json(where, fmt::format("merge #{} \"{}\" is not of the form \"a b\"", rank, s));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      bad_json(where, fmt::format("merge #{} must be \"a b\" or [\"a\", \"b\"], got {}", rank, m.dump()));
    }
    const int32_t a_id = id_of(a, rank), b_id = id_of(b, rank);
    std::string merged = a;
    if (prefix_len && b.compare(0, prefix_len, continuing_subword_prefix_) == 0) {
      merged.append(b, prefix_len);
    } else {
      merged += b;
    }
    merges_[pair_key(a_id, b_id)] = Merge{rank, id_of(merged, rank)};
    ++rank;
  }
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(start), out.end()));
  }
}

// tokenizers' BPE::merge_word + Word::merge_all: one symbol per character
// (unknown characters become byte-fallback tokens or unk), then repeatedly
// apply the lowest-ranked merge present, leftmost first.
void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto add = [&](int32_t id) {
    const int n = static_cast<int>(syms.size());
    syms.push_back({id, n - 1, -1, true});
    if (n > 0) syms[n - 1].next = n;
  };
  int32_t pending_unk = -1;  // a (possibly fused) unk not yet added, or -1
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    const size_t b = i, e = i + cp_len(static_cast<unsigned char>(word[i]));
    i = e;
    piece.assign(word.substr(b, e - b));
    if (b > 0 && !continuing_subword_prefix_.empty()) piece.insert(0, continuing_subword_prefix_);
    if (e == word.size() && !end_of_word_suffix_.empty()) piece += end_of_word_suffix_;
    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : piece) all = all && byte_ids_[c] >= 0;
      if (all) {
        // Like tokenizers, a pending unk is not flushed here: it lands after the bytes.
        for (unsigned char c : piece) add(byte_ids_[c]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
    // No unk token: the character is dropped, as tokenizers does.
  }
  if (pending_unk >= 0) add(pending_unk);

  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int pos) {
    const int next = syms[pos].next;
    if (next < 0) return;
    if (auto it = merges_.find(pair_key(syms[pos].id, syms[next].id)); it != merges_.end()) {
      queue.push({it->second.rank, pos, it->second.new_id});
    }
  };
  for (int p = 0; p + 1 < static_cast<int>(syms.size()); ++p) consider(p);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = syms[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = syms[left.next];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (const Symbol& s : syms) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace kvgraph::tok
