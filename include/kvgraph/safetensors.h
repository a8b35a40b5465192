#pragma once
// Hugging Face safetensors checkpoints, read in place: each file is mmap'd
// once and its header fully validated (sizes, offsets, overlaps, dtypes)
// before any tensor byte is trusted. A WeightStore resolves tensor names over
// a model directory: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json`.
//
// Errors: malformed files throw "[safetensors] <file>: ..."; lookups of
// absent tensors or of unexpected shapes throw "[weights] ...".
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvgraph/dtype.h"

namespace kvgraph {

// A whole file mapped read-only; unmapped on destruction (RAII, move-only).
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);  // throws [safetensors] when unreadable
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void release() noexcept;
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// One tensor's bytes inside a mapped file: row-major, little-endian, possibly
// unaligned. Valid while the SafetensorsFile / WeightStore that returned it lives.
struct WeightView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;  // = numel() * dtype_size(dtype)

  int64_t numel() const;
};

// "[64, 32]"
std::string shape_string(const std::vector<int64_t>& shape);

// One .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);  // maps and validates

  const std::filesystem::path& path() const { return file_.path(); }
  bool has(std::string_view name) const;
  // Throws [weights] when the tensor is absent or its dtype (e.g. F64, I8,
  // BOOL) has no kvgraph DType.
  WeightView get(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  // The dtype as the file writes it ("BF16", "F8_E4M3", ...), usable here or not.
  std::string_view stored_dtype(std::string_view name) const;
  // An F8_E4M3 tensor's codes, one byte each (dtype U8). Throws [weights]
  // naming the tensor when it is stored in another dtype (F8_E5M2 included).
  WeightView get_e4m3(std::string_view name) const;
  // String values of "__metadata__" (other values are ignored).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    std::string dtype_name;     // as written, e.g. "BF16"
    std::optional<DType> dtype;  // nullopt: valid safetensors dtype kvgraph cannot use
    std::vector<int64_t> shape;
    size_t begin = 0;  // offsets into the data section
    size_t end = 0;
  };
  MappedFile file_;
  const std::byte* data_section_ = nullptr;
  size_t data_size_ = 0;
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory, by name.
class WeightStore {
 public:
  // `model_dir` holds model.safetensors (preferred when both exist) or
  // model.safetensors.index.json + its shards; a path to a single
  // .safetensors file also works.
  explicit WeightStore(const std::filesystem::path& model_dir);

  const std::filesystem::path& dir() const { return dir_; }
  size_t num_files() const { return files_.size(); }
  bool has(std::string_view name) const;
  // Throws `[weights] missing tensor "lm_head.weight" in <dir>`.
  WeightView get(std::string_view name) const;
  // Also checks the shape: `[weights] tensor "x": expected shape [64, 64], found [64, 32]`.
  WeightView get(std::string_view name, const std::vector<int64_t>& expected_shape) const;
  std::vector<std::string> names() const;  // sorted
  std::string_view stored_dtype(std::string_view name) const;  // see SafetensorsFile
  WeightView get_e4m3(std::string_view name) const;             // see SafetensorsFile
  WeightView get_e4m3(std::string_view name, const std::vector<int64_t>& expected_shape) const;
  // The file that holds `name` (throws [weights] when absent).
  const std::filesystem::path& file_of(std::string_view name) const;

 private:
  size_t where_index(std::string_view name) const;  // throws [weights] when absent
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> index into files_
};

// The flat (row-major) index of the first NaN or infinity in a float tensor
// (F32, BF16, F16); nullopt when every element is finite or the tensor holds
// integers. Reads the bytes in place, converting nothing.
std::optional<int64_t> first_non_finite(const WeightView& view);

// Element-wise conversion to f32 (F32, BF16, F16, I32, I64, U8).
std::vector<float> to_f32(const WeightView& view);
void to_f32(const WeightView& view, float* out);  // out: view.numel() floats

// The name safetensors gives `dtype` ("F32", "BF16", "U32", ...).
std::string_view safetensors_dtype_name(DType dtype);

// One tensor of a file being written: its bytes are produced by `fill`, called
// once, in file order, with a buffer of numel * dtype_size bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<void(std::byte* out)> fill;
};

// Writes a .safetensors file: the header (tensors in the order given, the
// string `metadata` as "__metadata__"), then each tensor's bytes, one tensor
// in memory at a time. The file appears complete or not at all (written to
// a temporary file next to `path`, then renamed); `progress` is told the
// bytes written. Throws [safetensors] on a write error.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace kvgraph
