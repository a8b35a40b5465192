// StreamDecoder: decode a window of ids each step and emit what it adds.
//
// The window is the ids of the last emitted chunk (context, so decoders that
// look at neighbours -- Strip's leading space, Metaspace's first token --
// behave as in a full decode) followed by the ids not yet emitted. The
// stream-mode decode leaves out an unfinished UTF-8 character at the end, so
// only complete characters are emitted; while one is pending the window is not
// cut, so context always starts on a character boundary. The scheme is
// tokenizers' DecodeStream, which instead waits while the text ends in U+FFFD.
#include "kvgraph/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace kvgraph {

namespace {

// Length of the common prefix of a and b, backed off to a UTF-8 boundary.
size_t common_prefix(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  while (n > 0 && n < b.size() && (static_cast<unsigned char>(b[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::step(int32_t id) {
  ids_.push_back(id);
  bool held = false;
  using Mode = Tokenizer::Impl::DecodeMode;
  const std::string text = tokenizer_.impl_->decode(ids_, skip_special_, Mode::StreamStep, &held);
  if (text.size() <= prefix_.size()) return {};
  // The text only grows at the end; if a decoder rewrote the context anyway,
  // emit from where the two agree.
  const size_t from = text.compare(0, prefix_.size(), prefix_) == 0 ? prefix_.size() : common_prefix(prefix_, text);
  std::string out = text.substr(from);
  if (held) {
    // Part of a character is pending: keep the whole window, remember what was shown.
    prefix_ = text;
  } else {
    // Every id is rendered: the ids after the old context become the new context.
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<ptrdiff_t>(prefix_ids_));
    prefix_ = tokenizer_.impl_->decode(ids_, skip_special_, Mode::StreamStep);
    prefix_ids_ = ids_.size();
  }
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!ids_.empty()) {
    const std::string text = tokenizer_.impl_->decode(ids_, skip_special_, Tokenizer::Impl::DecodeMode::StreamFlush);
    if (text.size() > prefix_.size()) {
      const size_t from =
          text.compare(0, prefix_.size(), prefix_) == 0 ? prefix_.size() : common_prefix(prefix_, text);
      out = text.substr(from);
    }
  }
  reset();
  return out;
}

void StreamDecoder::reset() {
  ids_.clear();
  prefix_.clear();
  prefix_ids_ = 0;
}

}  // namespace kvgraph
