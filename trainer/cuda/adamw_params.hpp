// The fused AdamW kernel's parameters (kernels.hpp) for a step of the CPU AdamW (optimizer.hpp),
// so that the GPU optimizer and the tests that compare the two derive them one way. Host only.
#pragma once

#include <cstdint>

#include "trainer/cuda/kernels.hpp"
#include "trainer/optimizer.hpp"

namespace tier::train::cuda {

// The same update as adamw_update(..., s, decay) at step number `step` (1-based, the t that
// make_step got): weight decay only where `decay`.
inline AdamW kernel_adamw(const AdamWStep& s, int64_t step, bool decay) {
  return {.lr = s.lr,
          .beta1 = s.beta1,
          .beta2 = s.beta2,
          .eps = s.eps,
          .weight_decay = decay ? s.weight_decay : 0.0f,
          .step = static_cast<int>(step),
          .grad_scale = s.grad_scale};
}

}  // namespace tier::train::cuda
