#pragma once
// The CUDA side of the op set: the same ops as include/kvgraph/ops.h, on
// tensors, forwarding to the raw-pointer kernels of ops/cuda/kernels.h with
// the per-stream scratch (cuBLAS, split-KV partials, selection) they need.
#include "kvgraph/cache/slots.h"
#include "kvgraph/ops.h"

namespace kvgraph::cuda_ops {

void embedding(Stream& s, const Tensor& table, const Tensor& ids, Tensor& out, float scale);
void rms_norm(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one);
void linear(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, const ops::LinearOptions& o);
void rms_norm_add(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one);
void rope(Stream& s, Tensor& x, const Tensor& pos, const Tensor& inv_freq);
void act_mul(Stream& s, const Tensor& gate, const Tensor& up, Tensor& out, Activation act);
void add(Stream& s, const Tensor& a, const Tensor& b, Tensor& out);
void softcap(Stream& s, Tensor& x, float cap);
void sample(Stream& s, const Tensor& logits, const Tensor& config, const Tensor& banned, int n_banned, Tensor& seen,
            const Tensor& pos, Tensor& token);
void mark_seen(Stream& s, const Tensor& ids, Tensor& seen);
void advance(Stream& s, Tensor& pos, int n);
void copy(Stream& s, const Tensor& src, Tensor& dst);
void fill_random(Stream& s, Tensor& t, uint64_t seed, float scale);
double measure_copy_bandwidth_gbs();

// One layer's update_and_attend on the device (see SequenceCache).
struct CacheAttendArgs {
  const int32_t* pos;  // i32 [1] device
  int32_t T;
  SlotRule rule;
  DType storage;
  void* k_pool;
  void* v_pool;
  const float* q;
  const float* k;
  const float* v;
  int64_t q_stride, k_stride, v_stride;  // elements between tokens
  float* out;
  int n_heads, n_kv_heads, head_dim;
  float scale, softcap;
  int32_t max_visible;  // most keys a query can see (pool size): sizes the split grid
  const float* q_norm;  // prologue (see AttendParams), each may be null
  const float* k_norm;
  float norm_eps;
  bool norm_plus_one;
  const float* rope_inv_freq;
};
void update_and_attend(Stream& s, const CacheAttendArgs& a);

// Frees the scratch kept for a stream (called when the Stream dies).
void release(void* cuda_stream);

}  // namespace kvgraph::cuda_ops
