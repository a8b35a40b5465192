#pragma once
// The CUDA side of the op set: the same ops as include/kvgraph/ops.h, on
// tensors, forwarding to the raw-pointer kernels of ops/cuda/kernels.h with
// the per-stream scratch and tuning of the stream's CudaContext.
#include "kvgraph/op_types.h"
#include "kvgraph/stream.h"
#include "kvgraph/weight.h"
#include "ops/attend_call.h"

namespace kvgraph::cuda_ops {

void embedding(Stream& s, const Tensor& table, const Tensor& ids, Tensor& out, float scale);
void rms_norm(Stream& s, const Tensor& x, const Tensor& w, Tensor& out, float eps, bool plus_one);
// Quantized tables: rows dequantised as gathered (cuda::embedding_affine).
void embedding_affine(Stream& s, const Weight& table, const Tensor& ids, Tensor& out, float scale);
// Plain or quantized weights (checked by the op front).
void linear(Stream& s, const Tensor& x, const Weight& w, Tensor& out, const ops::LinearOptions& o);
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

// One layer's update_and_attend, resolved by the op front.
void update_and_attend(Stream& s, const ops::AttendCall& a);

}  // namespace kvgraph::cuda_ops
