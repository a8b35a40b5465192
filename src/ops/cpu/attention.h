#pragma once
// CPU reference of update_and_attend for one layer.
#include "ops/attend_call.h"

namespace kvgraph::cpu {

// Writes the plan's T rows (a.plan: the step's plan for the layer's policy),
// then attends every query over the rows it may see, in logical order,
// accumulating in f32 from the stored K/V (rounded, or quantized and read
// back one row at a time: kvgraph/cache/kv_quant.h).
void update_and_attend(const ops::AttendCall& a);

}  // namespace kvgraph::cpu
