#pragma once
// The BPE model of tokenizers (models/bpe): a word -> ids by the ranked merges,
// with unk / byte_fallback / ignore_merges and a per-word cache.
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kvgraph::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // `model` is tokenizer.json's "model" object with "type": "BPE".
  explicit Bpe(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word (non-empty, valid UTF-8).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  Vocab vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t byte_ids_[256];  // id of "<0xNN>", -1 if absent

  // Word -> ids. Bounded: cleared when full (tokenizers keeps 10k words).
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace kvgraph::tok
