// Session save/restore: a versioned, checksummed file written atomically.
//
// Layout (little-endian):
//   "KVGSESS\0"  u32 version (2; version 1 files, plain storage, are still read)
//   sections, in this order, each  u32 tag | u64 size | payload[size] | u64 FNV-1a-64(payload):
//     HEAD  model fingerprint u64, vocab i32, storage (u32 length + name:
//           kv_storage_name of layer 0, informative), max_write i32,
//           n_layers u32, per layer: ring u8, window i32, max_write i32,
//           pool i32, capacity i32, n_kv_heads i32, head_dim i32, then
//           (version 2) the K and V formats: type u8 (KvType), group i32 each
//     TOKS  length i32, written i32, has_pending u8, pending i32, n u32, ids i32[n]
//     LOGT  has_logits u8, then f32[vocab] (the last step's logits) when set
//     KVRW  per layer: u64 bytes, then the layer's rows as stored
//           (SequenceCache::export_layer: flat = positions [0, length) of
//           each KV head, ring = the whole pool; K codes, K scales, V codes,
//           V scales, the scales only for quantized formats)
//     END.  empty
// A reader verifies the whole file (every section's size and checksum, the
// model, the layout) before it changes anything.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "kvgraph/error.h"
#include "kvgraph/safetensors.h"
#include "kvgraph/session.h"

namespace kvgraph {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'G', 'S', 'E', 'S', 'S', '\0'};
constexpr uint32_t kVersion = 2;
constexpr uint32_t kVersionPlainStorage = 1;  // one storage dtype for the whole cache, no per-layer formats

constexpr uint32_t tag(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}
constexpr uint32_t kHead = tag("HEAD"), kToks = tag("TOKS"), kLogt = tag("LOGT"), kKvrw = tag("KVRW"),
                   kEnd = tag("END.");
const char* section_name(uint32_t t) {
  return t == kHead ? "header" : t == kToks ? "tokens" : t == kLogt ? "logits" : t == kKvrw ? "kv rows" : "end";
}

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Appends plain values (the host is little-endian: x86-64, aarch64).
struct Writer {
  std::string buf;
  template <typename T>
  void put(T v) {
    buf.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void put_bytes(const void* p, size_t n) { buf.append(static_cast<const char*>(p), n); }
  void put_str(std::string_view s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf.append(s);
  }
};

// Reads plain values from one section's payload; running past its end is
// a corrupt file (the checksum matched, so a writer bug or a hostile file).
struct Reader {
  const char* p;
  size_t n;
  std::string file;
  const char* section;
  size_t at = 0;
  void need(size_t k) const {
    if (k > n - at)
      fail("session_file", "{}: the {} section is shorter than its contents (corrupted file)", file, section);
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  const char* bytes(size_t k) {
    need(k);
    const char* q = p + at;
    at += k;
    return q;
  }
  std::string str() {
    const uint32_t k = get<uint32_t>();
    return std::string(bytes(k), k);
  }
  void done() const {
    if (at != n) fail("session_file", "{}: the {} section has {} unexpected bytes (corrupted file)", file, section, n - at);
  }
};

struct LayerLayout {
  bool ring = false;
  int32_t window = 0, max_write = 0, pool = 0, capacity = 0, n_kv_heads = 0, head_dim = 0;
  KvStorage storage;
  std::string describe() const {
    return ring ? fmt::format("ring(window={}, max_write={}, pool={})", window, max_write, pool)
                : fmt::format("flat(capacity={})", capacity);
  }
};

// One pass over the config and the checkpoint's tensor metadata (name,
// dtype, shape), plus the first and last 64 bytes of every tensor, so a
// fine-tune of the same architecture has another fingerprint too.
uint64_t compute_fingerprint(const Model& m) {
  const ModelConfig& c = m.config();
  std::string s = fmt::format("{}|{}|v{} d{} i{} l{} h{} kv{} hd{} mp{} eps{}", family_name(c.family), c.model_type,
                              c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
                              c.num_kv_heads, c.head_dim, c.max_position_embeddings, c.rms_norm_eps);
  s += fmt::format("|tie{} b{}{}{} qk{} act{}", c.tie_word_embeddings, c.attention_bias, c.attention_out_bias,
                   c.mlp_bias, c.qk_norm, static_cast<int>(c.activation));
  for (const RopeConfig* r : {&c.rope, &c.rope_local})
    s += fmt::format("|rope {} {} {} {} {} {}", r->theta, r->type, r->factor, r->low_freq_factor, r->high_freq_factor,
                     r->original_max_position_embeddings);
  s += fmt::format("|sw{} qs{} sc{} {} n1{} sn{} es{} wd{} nest{}", c.sliding_window, c.query_pre_attn_scalar,
                   c.attn_logit_softcap, c.final_logit_softcap, c.norm_weight_plus_one, c.sandwich_norms,
                   c.embed_scale, dtype_name(c.weight_dtype), c.nested_text_config);
  for (int w : c.layer_window) s += fmt::format(",{}", w);
  uint64_t h = fnv1a(s.data(), s.size());
  const auto& dir = m.dir();
  if (dir.empty() || !std::filesystem::exists(dir)) {
    const std::string w = fmt::format("|synthetic {}", m.weight_bytes());
    return fnv1a(w.data(), w.size(), h);
  }
  WeightStore store(dir);
  for (const std::string& name : store.names()) {
    std::string meta = "|" + name;
    try {
      const WeightView v = store.get(name);
      meta += fmt::format(" {} {} {}", dtype_name(v.dtype), shape_string(v.shape), v.nbytes);
      h = fnv1a(meta.data(), meta.size(), h);
      const size_t k = std::min<size_t>(64, v.nbytes);
      h = fnv1a(v.data, k, h);
      h = fnv1a(v.data + (v.nbytes - k), k, h);
    } catch (const Error&) {  // a dtype kvgraph does not read: the name still counts
      h = fnv1a(meta.data(), meta.size(), h);
    }
  }
  return h;
}

LayerLayout layout_of(const SequenceCache& cache, int l) {
  const LayerSpec& spec = cache.config().layers[l];
  const CachePolicy& p = spec.policy;
  return {p.is_ring(), p.window(), p.is_ring() ? p.max_write() : 0, p.is_ring() ? p.pool() : 0,
          p.is_ring() ? 0 : p.capacity(), spec.n_kv_heads, spec.head_dim, cache.storage(l)};
}

}  // namespace

uint64_t Session::model_fingerprint() const {
  if (!fingerprint_) fingerprint_ = compute_fingerprint(*model_);
  return *fingerprint_;
}

void Session::save(const std::filesystem::path& path) {
  if (stream_.recording()) fail("session_file", "save() while a step is being recorded");
  stream_.synchronize();
  const int32_t V = model_->config().vocab_size;
  std::string file;
  file.append(kMagic, sizeof kMagic);
  file.append(reinterpret_cast<const char*>(&kVersion), sizeof kVersion);
  auto section = [&](uint32_t t, const std::string& payload) {
    Writer w;
    w.put<uint32_t>(t);
    w.put<uint64_t>(payload.size());
    file += w.buf;
    file += payload;
    const uint64_t sum = fnv1a(payload.data(), payload.size());
    file.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  };

  Writer head;
  head.put<uint64_t>(model_fingerprint());
  head.put<int32_t>(V);
  head.put_str(kv_storage_name(cache_.storage(0)));
  head.put<int32_t>(opt_.max_write);
  head.put<uint32_t>(static_cast<uint32_t>(cache_.n_layers()));
  for (int l = 0; l < cache_.n_layers(); ++l) {
    const LayerLayout x = layout_of(cache_, l);
    head.put<uint8_t>(x.ring);
    for (int32_t v : {x.window, x.max_write, x.pool, x.capacity, x.n_kv_heads, x.head_dim}) head.put<int32_t>(v);
    for (KvFormat f : {x.storage.k, x.storage.v}) {
      head.put<uint8_t>(static_cast<uint8_t>(f.type));
      head.put<int32_t>(f.group);
    }
  }
  section(kHead, head.buf);

  Writer toks;
  toks.put<int32_t>(cache_.length());
  toks.put<int32_t>(cache_.written());
  toks.put<uint8_t>(have_pending_);
  toks.put<int32_t>(have_pending_ ? pending_ : -1);
  toks.put<uint32_t>(static_cast<uint32_t>(tokens_.size()));
  toks.put_bytes(tokens_.data(), tokens_.size() * sizeof(int32_t));
  section(kToks, toks.buf);

  Writer logits;
  const bool keep_logits = have_logits_ && !opt_.all_logits;
  logits.put<uint8_t>(keep_logits);
  if (keep_logits) {
    const std::vector<float> row = last_logits();
    logits.put_bytes(row.data(), row.size() * sizeof(float));
  }
  section(kLogt, logits.buf);

  Writer kv;
  for (int l = 0; l < cache_.n_layers(); ++l) {
    const size_t n = cache_.layer_state_bytes(l);
    kv.put<uint64_t>(n);
    const size_t at = kv.buf.size();
    kv.buf.resize(at + n);
    cache_.export_layer(l, reinterpret_cast<std::byte*>(kv.buf.data() + at));
  }
  section(kKvrw, kv.buf);
  section(kEnd, "");

  // Atomic: a reader sees the old file or the whole new one, never a part.
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp{}", getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("session_file", "cannot write {}: {}", tmp.string(), std::strerror(errno));
  const bool ok = std::fwrite(file.data(), 1, file.size(), f) == file.size() && std::fflush(f) == 0 &&
                  fsync(fileno(f)) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) {
    std::filesystem::remove(tmp);
    fail("session_file", "cannot write {}: {}", tmp.string(), std::strerror(ok ? errno : err));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    fail("session_file", "cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
  }
}

void Session::restore(const std::filesystem::path& path) {
  const std::string name = path.string();
  if (stream_.recording()) fail("session_file", "restore() while a step is being recorded");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("session_file", "cannot open {}: {}", name, std::strerror(errno));
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("session_file", "cannot read {}", name);

  if (file.size() < sizeof kMagic || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
    fail("session_file", "{} is not a kvgraph session file (bad magic)", name);
  if (file.size() < sizeof kMagic + 4) fail("session_file", "{}: truncated in the file header", name);
  uint32_t version = 0;
  std::memcpy(&version, file.data() + sizeof kMagic, 4);
  if (version != kVersion && version != kVersionPlainStorage)
    fail("session_file", "{}: format version {} is not supported (this build reads versions {} and {})", name,
         version, kVersionPlainStorage, kVersion);

  // Every section: framing, size and checksum, in the expected order.
  size_t at = sizeof kMagic + 4;
  std::string_view payload[5];
  const uint32_t order[5] = {kHead, kToks, kLogt, kKvrw, kEnd};
  for (int i = 0; i < 5; ++i) {
    const char* what = section_name(order[i]);
    if (file.size() - at < 12) fail("session_file", "{}: truncated before the {} section", name, what);
    uint32_t t = 0;
    uint64_t size = 0;
    std::memcpy(&t, file.data() + at, 4);
    std::memcpy(&size, file.data() + at + 4, 8);
    at += 12;
    if (t != order[i]) fail("session_file", "{}: expected the {} section, found tag {:#010x} (corrupted file)", name, what, t);
    if (size > file.size() - at || file.size() - at - size < 8)
      fail("session_file", "{}: truncated in the {} section ({} bytes declared, {} left)", name, what, size,
           file.size() - at);
    payload[i] = std::string_view(file.data() + at, size);
    uint64_t sum = 0;
    std::memcpy(&sum, file.data() + at + size, 8);
    if (sum != fnv1a(payload[i].data(), payload[i].size()))
      fail("session_file", "{}: checksum mismatch in the {} section (corrupted file)", name, what);
    at += size + 8;
  }
  if (at != file.size()) fail("session_file", "{}: {} bytes after the end section (corrupted file)", name, file.size() - at);

  // The model and the cache layout.
  Reader head{payload[0].data(), payload[0].size(), name, "header"};
  const uint64_t fp = head.get<uint64_t>();
  if (fp != model_fingerprint())
    fail("session_file", "{} was saved with another model (fingerprint {:016x}, this model {:016x})", name, fp,
         model_fingerprint());
  const int32_t V = head.get<int32_t>();
  if (V != model_->config().vocab_size) fail("session_file", "{}: vocabulary {} differs from the model's", name, V);
  const std::string storage = head.str();
  // Version 1: the whole cache in one plain dtype, named here.
  KvStorage v1_storage = KvFormat(KvType::Invalid);
  if (version == kVersionPlainStorage)
    for (DType d : {DType::F32, DType::BF16, DType::F16})
      if (storage == dtype_name(d)) v1_storage = d;
  if (version == kVersionPlainStorage && v1_storage.k.type == KvType::Invalid)
    fail("session_file", "{}: unknown KV storage \"{}\" (corrupted file)", name, storage);
  head.get<int32_t>();  // max_write: rings below carry theirs; flat layers do not depend on it
  const uint32_t n_layers = head.get<uint32_t>();
  std::vector<bool> from_flat(cache_.n_layers(), false);
  if (n_layers != static_cast<uint32_t>(cache_.n_layers()))
    fail("session_file", "{} has {} layers; this model has {}", name, n_layers, cache_.n_layers());
  for (int l = 0; l < cache_.n_layers(); ++l) {
    LayerLayout x;
    x.ring = head.get<uint8_t>() != 0;
    for (int32_t* v : {&x.window, &x.max_write, &x.pool, &x.capacity, &x.n_kv_heads, &x.head_dim}) *v = head.get<int32_t>();
    x.storage = v1_storage;
    if (version != kVersionPlainStorage)
      for (KvFormat* f : {&x.storage.k, &x.storage.v}) {
        const uint8_t t = head.get<uint8_t>();
        const int32_t group = head.get<int32_t>();
        *f = t < static_cast<uint8_t>(KvType::Invalid) ? KvFormat(static_cast<KvType>(t), group) : KvType::Invalid;
      }
    const LayerLayout here = layout_of(cache_, l);
    if (x.storage != here.storage)
      fail("session_file", "{} holds a {} cache{}; this session stores {} (use the same --kv-dtype, --k-dtype, "
           "--v-dtype and --kv-group)", name, kv_storage_name(x.storage),
           l > 0 ? fmt::format(" in layer {}", l) : std::string(), kv_storage_name(here.storage));
    // A sliding layer that was flat (its window reached the capacity then)
    // restores into a ring: the ring takes the last pool rows of the history.
    const bool flat_to_ring = !x.ring && here.ring && x.n_kv_heads == here.n_kv_heads && x.head_dim == here.head_dim;
    if (flat_to_ring) {
      from_flat[l] = true;
      continue;
    }
    const bool same = x.ring == here.ring && x.window == here.window && x.max_write == here.max_write &&
                      x.pool == here.pool && x.n_kv_heads == here.n_kv_heads && x.head_dim == here.head_dim;
    if (!same)
      fail("session_file", "{}: layer {} was saved as {}, this session has {} (use the same --chunk and a "
           "capacity that keeps the sliding layers as they were)",
           name, l, x.describe(), here.describe());
  }
  head.done();

  Reader toks{payload[1].data(), payload[1].size(), name, "tokens"};
  const int32_t length = toks.get<int32_t>();
  const int32_t written = toks.get<int32_t>();
  const bool has_pending = toks.get<uint8_t>() != 0;
  const int32_t pending = toks.get<int32_t>();
  const uint32_t n = toks.get<uint32_t>();
  if (length < 0 || written < length || n != static_cast<uint32_t>(length))
    fail("session_file", "{}: inconsistent lengths in the tokens section (corrupted file)", name);
  std::vector<int32_t> ids(n);
  std::memcpy(ids.data(), toks.bytes(size_t(n) * 4), size_t(n) * 4);
  toks.done();
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("session_file", "{}: token id {} out of range (corrupted file)", name, id);
  if (has_pending && (pending < 0 || pending >= V))
    fail("session_file", "{}: pending token {} out of range (corrupted file)", name, pending);
  if (length > cache_.capacity())
    fail("session_file", "{} holds {} tokens; this session's capacity is {} (raise --capacity)", name, length,
         cache_.capacity());

  Reader logit{payload[2].data(), payload[2].size(), name, "logits"};
  const bool has_logits = logit.get<uint8_t>() != 0;
  std::vector<float> row;
  if (has_logits) {
    row.resize(V);
    std::memcpy(row.data(), logit.bytes(size_t(V) * 4), size_t(V) * 4);
  }
  logit.done();

  // Sizes of the rows, against this session's layout at that length.
  Reader kv{payload[3].data(), payload[3].size(), name, "kv rows"};
  std::vector<const char*> rows(cache_.n_layers());
  for (int l = 0; l < cache_.n_layers(); ++l) {
    const uint64_t bytes = kv.get<uint64_t>();
    const CachePolicy& p = cache_.policy(l);
    const uint64_t expect = uint64_t(p.is_ring() && !from_flat[l] ? p.pool() : length) * cache_.bytes_per_token(l);
    if (bytes != expect)
      fail("session_file", "{}: layer {} holds {} bytes of rows, expected {} (corrupted file)", name, l, bytes, expect);
    rows[l] = kv.bytes(bytes);
  }
  kv.done();

  // Verified: replace the state.
  stream_.synchronize();
  for (int l = 0; l < cache_.n_layers(); ++l)
    cache_.import_layer(l, reinterpret_cast<const std::byte*>(rows[l]), length, from_flat[l]);
  cache_.set_extent(length, written);
  tokens_ = std::move(ids);
  if (has_logits) ws_.logits.slice_rows(0, 1).copy_from_host(row.data());
  have_logits_ = has_logits;
  set_step_state(length, has_pending ? std::optional<int32_t>(pending) : std::nullopt);
}

}  // namespace kvgraph
