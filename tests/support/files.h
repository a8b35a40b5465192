#pragma once
// Whole-file reads and writes, and the safetensors container
// ([u64 header length][JSON header][data]), for tests that build checkpoints.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

namespace kvgraph::testing {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a header text (not checked: tests write malformed ones) and its data.
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s + header + data;
}

// A well-formed safetensors file split into its parsed header and its data.
struct SafetensorsParts {
  nlohmann::json header;
  std::string data;
};

inline SafetensorsParts read_safetensors(const std::filesystem::path& p) {
  const std::string bytes = read_file(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

}  // namespace kvgraph::testing
