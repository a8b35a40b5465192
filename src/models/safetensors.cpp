// safetensors layout: [u64 little-endian header length N][N bytes of JSON
// header][data section]. The header maps tensor names to {"dtype", "shape",
// "data_offsets": [begin, end]} with offsets relative to the data section;
// "__metadata__" holds free-form strings. The reference implementation
// requires the tensors to tile the data section from offset 0 without gaps or
// overlaps; we check the same before handing out any pointer.
#include "kvgraph/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kvgraph/error.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace kvgraph {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference reader's limit

// nlohmann parses iteratively, but dump() (error messages) and copies recurse,
// so a header of 10^5 nested brackets overflowed the stack. Real headers nest
// 3 levels deep, index files 2.
constexpr int kMaxJsonDepth = 64;

json parse_limited(const char* begin, const char* end, const std::string& what) {
  return json::parse(begin, end, [&](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) fail("safetensors", "{}: JSON nested deeper than {} levels", what, kMaxJsonDepth);
    return true;
  });
}

struct DTypeInfo {
  std::string_view name;
  int bits;                   // element size in bits
  std::optional<DType> dtype;  // nullopt: valid in files, unusable here
};

constexpr DTypeInfo kDTypes[] = {
    {"F32", 32, DType::F32},   {"BF16", 16, DType::BF16},  {"F16", 16, DType::F16},
    {"I32", 32, DType::I32},   {"I64", 64, DType::I64},    {"U8", 8, DType::U8},
    {"F64", 64, std::nullopt}, {"I8", 8, std::nullopt},    {"I16", 16, std::nullopt},
    {"U16", 16, std::nullopt}, {"U32", 32, DType::U32},  {"U64", 64, std::nullopt},
    {"BOOL", 8, std::nullopt}, {"F8_E4M3", 8, std::nullopt}, {"F8_E5M2", 8, std::nullopt},
    {"F8_E8M0", 8, std::nullopt}, {"C64", 64, std::nullopt}, {"F4", 4, std::nullopt},
    {"F6_E2M3", 6, std::nullopt}, {"F6_E3M2", 6, std::nullopt},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A non-negative integer that fits in uint64.
std::optional<uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------- MappedFile

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("safetensors", "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("safetensors", "{}: cannot stat: {}", path.string(), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("safetensors", "{}: not a regular file", path.string());
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("safetensors", "{}: mmap of {} bytes failed: {}", path.string(), size_, std::strerror(err));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

// ---------------------------------------------------------------- WeightView

int64_t WeightView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ----------------------------------------------------------- SafetensorsFile

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : file_(path) {
  const std::string fname = path.string();
  const size_t size = file_.size();
  if (size < 8) {
    fail("safetensors", "{}: file is {} bytes, shorter than the 8-byte header length", fname, size);
  }
  uint64_t n = 0;
  std::memcpy(&n, file_.data(), 8);
  if (n > size - 8) {
    fail("safetensors", "{}: header length {} runs past the end of the file ({} bytes); truncated or not a "
         "safetensors file", fname, n, size);
  }
  if (n > kMaxHeaderBytes) {
    fail("safetensors", "{}: header length {} exceeds the {}-byte limit", fname, n, kMaxHeaderBytes);
  }
  const char* hdr = reinterpret_cast<const char*>(file_.data() + 8);
  json header;
  // A name written twice would keep only its last entry, and the first
  // one's bytes would then look like a gap: catch it while parsing.
  std::set<std::string> keys;
  std::string duplicate;
  // Nesting is limited as parse_limited does (a deep input overflowed the stack).
  auto on_key = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth) fail("safetensors", "{}: JSON nested deeper than {} levels", fname, kMaxJsonDepth);
    if (event == json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = json::parse(hdr, hdr + n, on_key);
  } catch (const json::parse_error& e) {
    fail("safetensors", "{}: header is not valid JSON (at byte {} of the header): {}", fname, e.byte, e.what());
  } catch (const json::exception& e) {  // out_of_range.406: a number beyond double's range, e.g. 1e999
    fail("safetensors", "{}: header is not valid JSON: {}", fname, e.what());
  }
  if (!header.is_object()) fail("safetensors", "{}: header is not a JSON object", fname);
  if (!duplicate.empty()) fail("safetensors", "{}: tensor \"{}\" appears twice in the header", fname, duplicate);

  data_section_ = file_.data() + 8 + n;
  data_size_ = size - 8 - static_cast<size_t>(n);

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (v.is_object()) {
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    if (!v.is_object()) fail("safetensors", "{}: tensor \"{}\": entry is not an object, found {}", fname, name, show(v));

    Entry e;
    auto dt = v.find("dtype");
    if (dt == v.end()) fail("safetensors", "{}: tensor \"{}\": missing \"dtype\"", fname, name);
    if (!dt->is_string()) fail("safetensors", "{}: tensor \"{}\": \"dtype\" must be a string, found {}", fname, name, show(*dt));
    e.dtype_name = dt->get<std::string>();
    const DTypeInfo* info = find_dtype(e.dtype_name);
    if (info == nullptr) fail("safetensors", "{}: tensor \"{}\": unknown dtype \"{}\"", fname, name, e.dtype_name);
    e.dtype = info->dtype;

    auto sh = v.find("shape");
    if (sh == v.end()) fail("safetensors", "{}: tensor \"{}\": missing \"shape\"", fname, name);
    if (!sh->is_array()) {
      fail("safetensors", "{}: tensor \"{}\": \"shape\" must be a list of non-negative integers, found {}", fname,
           name, show(*sh));
    }
    uint64_t bits = static_cast<uint64_t>(info->bits);  // numel * bits, overflow-checked
    bool overflow = false;
    for (const json& d : *sh) {
      auto dim = as_u64(d);
      if (!dim || *dim > static_cast<uint64_t>(INT64_MAX)) {
        fail("safetensors", "{}: tensor \"{}\": \"shape\" must be a list of non-negative integers, found {}", fname,
             name, show(*sh));
      }
      e.shape.push_back(static_cast<int64_t>(*dim));
      if (__builtin_mul_overflow(bits, *dim, &bits)) overflow = true;
    }
    if (overflow) fail("safetensors", "{}: tensor \"{}\": shape {} is too large", fname, name, show(*sh));

    auto off = v.find("data_offsets");
    if (off == v.end()) fail("safetensors", "{}: tensor \"{}\": missing \"data_offsets\"", fname, name);
    std::optional<uint64_t> begin, end;
    if (off->is_array() && off->size() == 2) {
      begin = as_u64((*off)[0]);
      end = as_u64((*off)[1]);
    }
    if (!begin || !end) {
      fail("safetensors", "{}: tensor \"{}\": \"data_offsets\" must be [begin, end] with non-negative integers, "
           "found {}", fname, name, show(*off));
    }
    if (*end < *begin) {
      fail("safetensors", "{}: tensor \"{}\": data_offsets [{}, {}] end before begin", fname, name, *begin, *end);
    }
    if (bits % 8 != 0) {
      fail("safetensors", "{}: tensor \"{}\": {} elements of {} do not fill whole bytes", fname, name,
           shape_string(e.shape), e.dtype_name);
    }
    const uint64_t need = bits / 8;
    if (*end - *begin != need) {
      fail("safetensors", "{}: tensor \"{}\": size mismatch: shape {} of {} needs {} bytes but data_offsets [{}, {}] "
           "hold {}", fname, name, shape_string(e.shape), e.dtype_name, need, *begin, *end, *end - *begin);
    }
    if (*end > data_size_) {
      fail("safetensors", "{}: tensor \"{}\": data_offsets [{}, {}] out of range: the data section has {} bytes "
           "(truncated file?)", fname, name, *begin, *end, data_size_);
    }
    e.begin = static_cast<size_t>(*begin);
    e.end = static_cast<size_t>(*end);
    entries_.emplace(name, std::move(e));
  }

  // The tensors must tile [0, last end) exactly: no overlap, no gap.
  std::vector<const std::pair<const std::string, Entry>*> order;
  order.reserve(entries_.size());
  for (const auto& kv : entries_) order.push_back(&kv);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->second.begin != b->second.begin ? a->second.begin < b->second.begin : a->second.end < b->second.end;
  });
  size_t cursor = 0;
  const std::pair<const std::string, Entry>* prev = nullptr;
  for (const auto* kv : order) {
    const Entry& e = kv->second;
    if (e.begin < cursor) {
      fail("safetensors", "{}: tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] overlap", fname, prev->first,
           prev->second.begin, prev->second.end, kv->first, e.begin, e.end);
    }
    if (e.begin > cursor) {
      if (prev == nullptr) {
        fail("safetensors", "{}: tensor \"{}\" starts at byte {} of the data section, expected 0 (tensors must be "
             "contiguous)", fname, kv->first, e.begin);
      }
      fail("safetensors", "{}: gap between tensor \"{}\" (ends at {}) and \"{}\" (starts at {}); tensors must be "
           "contiguous", fname, prev->first, cursor, kv->first, e.begin);
    }
    cursor = e.end;
    prev = kv;
  }
}

bool SafetensorsFile::has(std::string_view name) const { return entries_.find(name) != entries_.end(); }

WeightView SafetensorsFile::get(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("weights", "missing tensor \"{}\" in {}", name, path().string());
  const Entry& e = it->second;
  if (!e.dtype) {
    fail("weights", "tensor \"{}\" in {}: dtype {} is not supported (kvgraph reads F32, BF16, F16, I32, I64, U8, U32)",
         name, path().string(), e.dtype_name);
  }
  WeightView v;
  v.name = it->first;
  v.dtype = *e.dtype;
  v.shape = e.shape;
  v.data = data_section_ + e.begin;
  v.nbytes = e.end - e.begin;
  return v;
}

std::string_view SafetensorsFile::stored_dtype(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("weights", "missing tensor \"{}\" in {}", name, path().string());
  return it->second.dtype_name;
}

WeightView SafetensorsFile::get_e4m3(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("weights", "missing tensor \"{}\" in {}", name, path().string());
  const Entry& e = it->second;
  if (e.dtype_name != "F8_E4M3")
    fail("weights", "tensor \"{}\" in {}: dtype {} is not supported for an fp8 matrix (kvgraph reads F8_E4M3)", name,
         path().string(), e.dtype_name);
  WeightView v;
  v.name = it->first;
  v.dtype = DType::U8;  // the e4m3 codes
  v.shape = e.shape;
  v.data = data_section_ + e.begin;
  v.nbytes = e.end - e.begin;
  return v;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

// --------------------------------------------------------------- WeightStore

WeightStore::WeightStore(const std::filesystem::path& model_dir) : dir_(model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(model_dir, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(model_dir));
    for (const std::string& n : files_[0]->names()) where_.emplace(n, 0);
    return;
  }
  const fs::path single = model_dir / "model.safetensors";
  const fs::path index = model_dir / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const std::string& n : files_[0]->names()) where_.emplace(n, 0);
    return;
  }
  if (!fs::exists(index, ec)) {
    fail("weights", "no model.safetensors or model.safetensors.index.json in {}", model_dir.string());
  }

  const std::string iname = index.string();
  std::ifstream in(index, std::ios::binary);
  if (!in) fail("safetensors", "{}: cannot open", iname);
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    const std::string text = ss.str();
    j = parse_limited(text.data(), text.data() + text.size(), iname);
  } catch (const json::parse_error& e) {
    fail("safetensors", "{}: malformed JSON at byte {}: {}", iname, e.byte, e.what());
  } catch (const json::exception& e) {  // out_of_range.406: a number beyond double's range
    fail("safetensors", "{}: malformed JSON: {}", iname, e.what());
  }
  if (!j.is_object()) fail("safetensors", "{}: not a JSON object", iname);
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) fail("safetensors", "{}: missing \"weight_map\" object", iname);

  std::map<std::string, size_t> shard_index;  // shard file name -> files_ index
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string()) {
      fail("safetensors", "{}: weight_map[\"{}\"] must be a file name, found {}", iname, it.key(), show(it.value()));
    }
    const std::string shard = it.value().get<std::string>();
    const fs::path rel(shard);
    if (shard.empty() || rel.is_absolute() || rel.has_parent_path() || shard == "." || shard == "..") {
      fail("safetensors", "{}: weight_map[\"{}\"] = \"{}\" is not a file name in the model directory", iname,
           it.key(), shard);
    }
    auto found = shard_index.find(shard);
    if (found == shard_index.end()) {
      const fs::path sp = model_dir / rel;
      if (!fs::exists(sp, ec)) {
        fail("safetensors", "{}: shard \"{}\" (holding \"{}\") does not exist", iname, shard, it.key());
      }
      files_.push_back(std::make_unique<SafetensorsFile>(sp));
      found = shard_index.emplace(shard, files_.size() - 1).first;
    }
    if (!files_[found->second]->has(it.key())) {
      fail("safetensors", "{}: tensor \"{}\" is mapped to shard \"{}\", which does not contain it", iname, it.key(),
           shard);
    }
    where_.emplace(it.key(), found->second);
  }
  // A tensor stored in two shards: the index picks one, and the other copy
  // (maybe different values) would be silently ignored.
  std::map<std::string, size_t> holder;  // tensor name -> the first shard that holds it
  for (size_t f = 0; f < files_.size(); ++f) {
    for (const std::string& name : files_[f]->names()) {
      auto [at, fresh] = holder.emplace(name, f);
      if (!fresh) {
        fail("safetensors", "{}: tensor \"{}\" appears in both {} and {}", iname, name,
             files_[at->second]->path().filename().string(), files_[f]->path().filename().string());
      }
    }
  }
}

namespace {

// `v` when it has the expected shape; else [weights] naming the tensor and both shapes.
WeightView with_shape(WeightView v, std::string_view name, const std::vector<int64_t>& expected_shape) {
  if (v.shape != expected_shape) {
    fail("weights", "tensor \"{}\": expected shape {}, found {}", name, shape_string(expected_shape),
         shape_string(v.shape));
  }
  return v;
}

}  // namespace

bool WeightStore::has(std::string_view name) const { return where_.find(name) != where_.end(); }

WeightView WeightStore::get(std::string_view name) const { return files_[where_index(name)]->get(name); }

WeightView WeightStore::get(std::string_view name, const std::vector<int64_t>& expected_shape) const {
  return with_shape(get(name), name, expected_shape);
}

std::string_view WeightStore::stored_dtype(std::string_view name) const {
  return files_[where_index(name)]->stored_dtype(name);
}

WeightView WeightStore::get_e4m3(std::string_view name) const { return files_[where_index(name)]->get_e4m3(name); }

WeightView WeightStore::get_e4m3(std::string_view name, const std::vector<int64_t>& expected_shape) const {
  return with_shape(get_e4m3(name), name, expected_shape);
}

size_t WeightStore::where_index(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail("weights", "missing tensor \"{}\" in {}", name, dir_.string());
  return it->second;
}

const std::filesystem::path& WeightStore::file_of(std::string_view name) const {
  return files_[where_index(name)]->path();
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

// ------------------------------------------------------- first_non_finite

namespace {

// NaN and infinity are the values whose exponent bits are all ones. Blocks
// are tested without an early exit (so the loop vectorises), then the block
// that has one is searched.
template <class Bits>
std::optional<int64_t> first_all_ones(const std::byte* data, size_t n, Bits exponent) {
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    bool any = false;
    for (size_t i = b; i < e; ++i) {
      Bits v;
      std::memcpy(&v, data + i * sizeof(Bits), sizeof(Bits));
      any |= (v & exponent) == exponent;
    }
    if (!any) continue;
    for (size_t i = b; i < e; ++i) {
      Bits v;
      std::memcpy(&v, data + i * sizeof(Bits), sizeof(Bits));
      if ((v & exponent) == exponent) return static_cast<int64_t>(i);
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> first_non_finite(const WeightView& view) {
  const size_t n = static_cast<size_t>(view.numel());
  if (n * dtype_size(view.dtype) != view.nbytes) {
    fail("weights", "tensor \"{}\": {} bytes do not match shape {} of {}", view.name, view.nbytes,
         shape_string(view.shape), dtype_name(view.dtype));
  }
  switch (view.dtype) {
    case DType::F32: return first_all_ones<uint32_t>(view.data, n, 0x7F800000u);
    case DType::BF16: return first_all_ones<uint16_t>(view.data, n, 0x7F80u);
    case DType::F16: return first_all_ones<uint16_t>(view.data, n, 0x7C00u);
    default: return std::nullopt;
  }
}

// ------------------------------------------------------------------ to_f32

void to_f32(const WeightView& view, float* out) {
  const size_t n = static_cast<size_t>(view.numel());
  if (n * dtype_size(view.dtype) != view.nbytes) {
    fail("weights", "tensor \"{}\": {} bytes do not match shape {} of {}", view.name, view.nbytes,
         shape_string(view.shape), dtype_name(view.dtype));
  }
  widen_to_f32(view.data, view.dtype, n, out);
}

std::vector<float> to_f32(const WeightView& view) {
  std::vector<float> out(static_cast<size_t>(view.numel()));
  to_f32(view, out.data());
  return out;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const DTypeInfo& d : kDTypes)
    if (d.dtype == dtype) return d.name;
  fail("safetensors", "no safetensors name for dtype {}", dtype_name(dtype));
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(size_t, size_t)>& progress) {
  namespace fs = std::filesystem;
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  size_t offset = 0;
  std::vector<size_t> sizes;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second)
      fail("safetensors", "{}: cannot write a tensor named \"{}\" (empty, reserved or written twice)", path.string(),
           t.name);
    size_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) fail("safetensors", "{}: tensor \"{}\" has a negative dim", path.string(), t.name);
      n *= static_cast<size_t>(d);
    }
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    sizes.push_back(n);
    offset += n;
  }
  // The header keeps the order given (json::object sorts its keys: build the text by hand).
  std::string text = "{";
  bool first = true;
  auto add = [&](const std::string& key, const json& value) {
    if (!first) text += ',';
    text += json(key).dump();
    text += ':';
    text += value.dump();
    first = false;
  };
  if (!metadata.empty()) add("__metadata__", header["__metadata__"]);
  for (const TensorToWrite& t : tensors) add(t.name, header[t.name]);
  text += "}";
  while (text.size() % 8) text += ' ';  // the data section starts 8-byte aligned

  const fs::path tmp = path.string() + ".tmp";
  struct RemoveUnlessDone {  // a failed write (or a throwing fill) leaves no file behind
    const fs::path& p;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ec;
      if (!done) fs::remove(p, ec);
    }
  } guard{tmp};
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) fail("safetensors", "cannot write {}: {}", tmp.string(), std::strerror(errno));
  auto write = [&](const void* data, size_t n) {
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    if (!out) fail("safetensors", "writing {} failed: {}", tmp.string(), std::strerror(errno));
  };
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  write(len, 8);
  write(text.data(), text.size());
  std::vector<std::byte> buf;
  size_t done = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buf.assign(sizes[i], std::byte{0});
    tensors[i].fill(buf.data());
    write(buf.data(), buf.size());
    done += sizes[i];
    if (progress) progress(done, offset);
  }
  out.flush();
  if (!out) write(nullptr, 0);  // reports the error and removes the temporary file
  out.close();
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("safetensors", "cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
  guard.done = true;
}

}  // namespace kvgraph
