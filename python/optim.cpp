// tierd._native.adamw_step: tier-train's vectorized, multi-threaded AdamW shard update
// (trainer/optimizer.hpp) for tierd.torch.OffloadAdamW, so the Python optimizer runs the same
// arithmetic as the trainer instead of a second implementation.
#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>

#include "binding.hpp"
#include "trainer/optimizer.hpp"

namespace tierpy {
namespace {

// A float32, C-contiguous view of a buffer-protocol object (numpy array, lease memoryview).
struct F32 {
  py::buffer_info info;
  float* data() const { return static_cast<float*>(info.ptr); }
  size_t size() const { return static_cast<size_t>(info.size); }
};

F32 f32(py::buffer b, const char* what, bool writable) {
  py::buffer_info info = b.request(writable);
  if (info.itemsize != 4 || (info.format != "f" && info.format != "<f" && info.format != "=f"))
    throw py::type_error(std::string(what) + ": expected float32 elements, got format '" + info.format + "'");
  py::ssize_t stride = 4;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[static_cast<size_t>(d)] > 1 && info.strides[static_cast<size_t>(d)] != stride)
      throw py::value_error(std::string(what) + ": expected a C-contiguous buffer");
    stride *= info.shape[static_cast<size_t>(d)];
  }
  if (writable && info.readonly) throw py::value_error(std::string(what) + ": buffer is read-only");
  return F32{std::move(info)};
}

}  // namespace

void register_optim(py::module_& m) {
  m.def(
      "adamw_step",
      [](py::buffer p, py::buffer mom, py::buffer var, py::buffer g, py::buffer p_out, py::buffer m_out,
         py::buffer v_out, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
         float grad_scale) {
        if (step < 1) throw py::value_error("step is 1-based (bias correction uses beta^step)");
        F32 ip = f32(p, "p", false), im = f32(mom, "m", false), iv = f32(var, "v", false),
            ig = f32(g, "g", false);
        F32 op = f32(p_out, "p_out", true), om = f32(m_out, "m_out", true), ov = f32(v_out, "v_out", true);
        const size_t n = ip.size();
        for (const F32* b : {&im, &iv, &ig, &op, &om, &ov})
          if (b->size() != n)
            throw py::value_error("adamw_step: every buffer must hold " + std::to_string(n) +
                                  " elements, one holds " + std::to_string(b->size()));
        tier::train::AdamWConfig cfg{
            .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay};
        tier::train::AdamWStep s = tier::train::make_step(cfg, lr, step, grad_scale);
        py::gil_scoped_release nogil;
        tier::train::adamw_update(ip.data(), im.data(), iv.data(), ig.data(), op.data(), om.data(), ov.data(),
                                  n, s, weight_decay != 0.0f);
      },
      py::arg("p"), py::arg("m"), py::arg("v"), py::arg("g"), py::arg("p_out"), py::arg("m_out"),
      py::arg("v_out"), py::kw_only(), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
      py::arg("weight_decay"), py::arg("step"), py::arg("grad_scale") = 1.0f,
      "One AdamW step over float32 buffers (tier-train's update: decoupled weight decay, bias "
      "correction with the 1-based `step`). Reads p, m, v, g; writes p_out, m_out, v_out, which "
      "may be the inputs (in place) or other buffers. Runs without the GIL, on OpenMP threads.");
}

}  // namespace tierpy
