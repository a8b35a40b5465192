// libFuzzer target: a .safetensors file through SafetensorsFile, the path the
// loader takes (mmap, header validation), then every tensor it accepted read
// back through get() and to_f32(). The input is the whole file.
//
// Contract under test: any byte string either loads, with every view inside
// the mapping, or throws kvgraph::Error. Anything else (a crash, a sanitizer
// report, another exception escaping, a leak) is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvgraph/error.h"
#include "kvgraph/safetensors.h"

namespace {

// The input lives in an anonymous in-memory file, reopened by path through
// /proc so SafetensorsFile runs exactly as on disk, without disk traffic.
int memory_file() {
  static const int fd = [] {
    const int f = ::memfd_create("safetensors_fuzz", MFD_CLOEXEC);
    if (f < 0) std::abort();
    return f;
  }();
  return fd;
}

// Reading every byte of a view makes ASan check it lies inside the mapping.
volatile uint8_t g_sink = 0;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memory_file();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const kvgraph::SafetensorsFile file(path);
    for (const std::string& name : file.names()) {
      if (!file.has(name)) std::abort();  // names() and has() must agree
      try {
        const kvgraph::WeightView v = file.get(name);
        uint8_t x = 0;
        for (size_t i = 0; i < v.nbytes; ++i) x ^= static_cast<uint8_t>(v.data[i]);
        g_sink = x;
        if (v.numel() <= (1 << 16)) (void)kvgraph::to_f32(v);
      } catch (const kvgraph::Error&) {
        // A valid dtype kvgraph does not read (F64, BOOL, ...): refused per tensor.
      }
    }
    (void)file.metadata();
  } catch (const kvgraph::Error&) {
    // Malformed input: the expected outcome.
  }
  return 0;
}
