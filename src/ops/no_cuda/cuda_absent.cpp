// Linked instead of src/ops/cuda/ in a build without CUDA (CMake chooses):
// every CUDA entry point of the seam says so in one error line.
#include "kvgraph/error.h"
#include "ops/backend.h"

namespace kvgraph::cuda_device {

namespace {
[[noreturn]] void absent(const char* what) {
  fail("device", "{}: this kvgraph was built without CUDA (use the `cuda` preset)", what);
}
}  // namespace

bool compiled() { return false; }
int device_count() { return 0; }
void* alloc(size_t) { absent("CUDA memory"); }
void free(void*) noexcept {}
void copy(void*, const void*, size_t) { absent("CUDA copy"); }
void zero(void*, size_t) { absent("CUDA memset"); }
std::unique_ptr<StreamBackend> make_stream_backend(const Tuning&) { absent("CUDA stream"); }
double copy_bandwidth_gbs() { absent("CUDA bandwidth"); }

}  // namespace kvgraph::cuda_device
