// tierd._native.adamw_step: tier-train's vectorized, multi-threaded AdamW shard update
// (trainer/optimizer.hpp) for tierd.torch.OffloadAdamW, so the Python optimizer runs the same
// arithmetic as the trainer instead of a second implementation.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>
#include <string>

#include "binding.hpp"
#include "trainer/optimizer.hpp"

namespace tierpy {
namespace {

// A C-contiguous view of a buffer-protocol object (numpy array, lease memoryview) of float32
// elements, or of 16-bit ones (bf16 bits: numpy has no bfloat16, so a torch bf16 tensor comes
// as its int16/uint16 view).
struct F32 {
  py::buffer_info info;
  float* data() const { return static_cast<float*>(info.ptr); }
  uint16_t* bits16() const { return static_cast<uint16_t*>(info.ptr); }
  size_t size() const { return static_cast<size_t>(info.size); }
};

bool is_format(const std::string& f, char c) {
  return f.size() == 1 ? f[0] == c : f.size() == 2 && (f[0] == '<' || f[0] == '=') && f[1] == c;
}

F32 typed(const py::buffer& b, const char* what, bool writable, bool bf16) {
  py::buffer_info info = b.request(writable);
  if (bf16 && (info.itemsize != 2 || !(is_format(info.format, 'h') || is_format(info.format, 'H'))))
    throw py::type_error(std::string(what) + ": expected bf16 bits as 16-bit integers, got format '" +
                         info.format + "'");
  if (!bf16 && (info.itemsize != 4 || !is_format(info.format, 'f')))
    throw py::type_error(std::string(what) + ": expected float32 elements, got format '" + info.format + "'");
  py::ssize_t stride = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[static_cast<size_t>(d)] > 1 && info.strides[static_cast<size_t>(d)] != stride)
      throw py::value_error(std::string(what) + ": expected a C-contiguous buffer");
    stride *= info.shape[static_cast<size_t>(d)];
  }
  if (writable && info.readonly) throw py::value_error(std::string(what) + ": buffer is read-only");
  return F32{std::move(info)};
}

F32 f32(const py::buffer& b, const char* what, bool writable) { return typed(b, what, writable, false); }

// Every buffer holds n elements.
void check_sizes(std::initializer_list<const F32*> bufs, size_t n) {
  for (const F32* b : bufs)
    if (b->size() != n)
      throw py::value_error("adamw_step: every buffer must hold " + std::to_string(n) +
                            " elements, one holds " + std::to_string(b->size()));
}

tier::train::AdamWStep step_of(float lr, float beta1, float beta2, float eps, float weight_decay,
                               int64_t step, float grad_scale) {
  if (step < 1) throw py::value_error("step is 1-based (bias correction uses beta^step)");
  tier::train::AdamWConfig cfg{
      .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay};
  return tier::train::make_step(cfg, lr, step, grad_scale);
}

}  // namespace

void register_optim(py::module_& m) {
  m.def(
      "adamw_step",
      [](const py::buffer& p, const py::buffer& mom, const py::buffer& var, const py::buffer& g,
         const py::buffer& p_out, const py::buffer& m_out, const py::buffer& v_out, float lr, float beta1,
         float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
         const std::optional<py::buffer>& p_copy) {
        const tier::train::AdamWStep s = step_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
        F32 ip = f32(p, "p", false), im = f32(mom, "m", false), iv = f32(var, "v", false),
            ig = f32(g, "g", false);
        F32 op = f32(p_out, "p_out", true), om = f32(m_out, "m_out", true), ov = f32(v_out, "v_out", true);
        std::optional<F32> oc;
        if (p_copy) oc = f32(*p_copy, "p_copy", true);
        const size_t n = ip.size();
        check_sizes({&im, &iv, &ig, &op, &om, &ov}, n);
        if (oc) check_sizes({&*oc}, n);
        py::gil_scoped_release nogil;
        tier::train::adamw_update(ip.data(), im.data(), iv.data(), ig.data(), op.data(), om.data(), ov.data(),
                                  n, s, weight_decay != 0.0f, oc ? oc->data() : nullptr);
      },
      py::arg("p"), py::arg("m"), py::arg("v"), py::arg("g"), py::arg("p_out"), py::arg("m_out"),
      py::arg("v_out"), py::kw_only(), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
      py::arg("weight_decay"), py::arg("step"), py::arg("grad_scale") = 1.0f, py::arg("p_copy") = py::none(),
      "One AdamW step over float32 buffers (tier-train's update: decoupled weight decay, bias "
      "correction with the 1-based `step`). Reads p, m, v, g; writes p_out, m_out, v_out, which "
      "may be the inputs (in place) or other buffers, and p_copy (when given) with the new "
      "parameters too, in the same pass. Runs without the GIL, on OpenMP threads.");
  m.def(
      "adamw_step_bf16",
      [](const py::buffer& p, const py::buffer& mom, const py::buffer& var, const py::buffer& g,
         const py::buffer& p_out, const py::buffer& m_out, const py::buffer& v_out, const py::buffer& w_out,
         float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale) {
        const tier::train::AdamWStep s = step_of(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
        F32 ip = f32(p, "p", false), im = f32(mom, "m", false), iv = f32(var, "v", false);
        F32 ig = typed(g, "g", false, true), ow = typed(w_out, "w_out", true, true);
        F32 op = f32(p_out, "p_out", true), om = f32(m_out, "m_out", true), ov = f32(v_out, "v_out", true);
        const size_t n = ip.size();
        check_sizes({&im, &iv, &ig, &op, &om, &ov, &ow}, n);
        py::gil_scoped_release nogil;
        tier::train::adamw_update_bf16(ip.data(), im.data(), iv.data(), ig.bits16(), op.data(), om.data(),
                                       ov.data(), ow.bits16(), n, s, weight_decay != 0.0f);
      },
      py::arg("p"), py::arg("m"), py::arg("v"), py::arg("g"), py::arg("p_out"), py::arg("m_out"),
      py::arg("v_out"), py::arg("w_out"), py::kw_only(), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
      py::arg("eps"), py::arg("weight_decay"), py::arg("step"), py::arg("grad_scale") = 1.0f,
      "adamw_step's mixed-precision form: float32 master p and moments m, v, a bf16 gradient g "
      "(its bits as a 16-bit integer buffer, e.g. torch's bf16 tensor .view(torch.int16)); writes "
      "p_out, m_out, v_out and w_out = bf16(p_out) (bits, rounded to nearest even) in one pass.");
  m.def(
      "adamw_step_many",
      [](const py::list& jobs, int64_t step) {
        std::vector<F32> held;  // the buffers stay requested until the update is done
        held.reserve(jobs.size() * 8);
        std::vector<tier::train::AdamWJob> batch;
        for (const py::handle& h : jobs) {
          const auto job = h.cast<py::tuple>();
          if (job.size() != 13)
            throw py::value_error(
                "adamw_step_many: a job is (p, m, v, g, p_out, m_out, v_out, p_copy, lr, "
                "beta1, beta2, eps, weight_decay)");
          const size_t first = held.size();
          // A gradient of 2-byte elements is bf16 bits: the job is adamw_step_bf16's, p_copy its w_out.
          const bool bf16 = job[3].cast<py::buffer>().request().itemsize == 2;
          for (size_t i = 0; i < 7; ++i)
            held.push_back(typed(job[i].cast<py::buffer>(), "buffer", i >= 4, bf16 && i == 3));
          const bool copy = !job[7].is_none();
          if (copy) held.push_back(typed(job[7].cast<py::buffer>(), "p_copy", true, bf16));
          const size_t n = held[first].size();
          for (size_t i = first + 1; i < held.size(); ++i) check_sizes({&held[i]}, n);
          const auto wd = job[12].cast<float>();
          batch.push_back({.p = held[first].data(),
                           .m = held[first + 1].data(),
                           .v = held[first + 2].data(),
                           .g = bf16 ? nullptr : held[first + 3].data(),
                           .p_out = held[first + 4].data(),
                           .m_out = held[first + 5].data(),
                           .v_out = held[first + 6].data(),
                           .p_copy = copy && !bf16 ? held[first + 7].data() : nullptr,
                           .n = n,
                           .step = step_of(job[8].cast<float>(), job[9].cast<float>(), job[10].cast<float>(),
                                           job[11].cast<float>(), wd, step, 1.0f),
                           .decay = wd != 0.0f,
                           .g16 = bf16 ? held[first + 3].bits16() : nullptr,
                           .w_out = copy && bf16 ? held[first + 7].bits16() : nullptr});
        }
        py::gil_scoped_release nogil;
        tier::train::adamw_update_many(batch.data(), batch.size());
      },
      py::arg("jobs"), py::kw_only(), py::arg("step"),
      "adamw_step over several parameters in one pass of the threads (one fork and join, not one "
      "per parameter). Each job is (p, m, v, g, p_out, m_out, v_out, p_copy or None, lr, beta1, "
      "beta2, eps, weight_decay); `step` is common. A job whose g has 2-byte elements is "
      "adamw_step_bf16's (g bf16 bits, p_copy its bf16 w_out). Same bits as one call per job.");
  m.def(
      "stream_triad",
      [](const py::buffer& a, const py::buffer& b, const py::buffer& c, float scalar) {
        F32 ia = f32(a, "a", false), ib = f32(b, "b", false), oc = f32(c, "c", true);
        check_sizes({&ib, &oc}, ia.size());
        py::gil_scoped_release nogil;
        tier::train::stream_triad(ia.data(), ib.data(), oc.data(), scalar, ia.size());
      },
      py::arg("a"), py::arg("b"), py::arg("c"), py::arg("scalar"),
      "c = a + scalar * b over float32 buffers with streaming stores (12 bytes an element): the "
      "memory-bandwidth probe of tools/bench-offload-adamw.");
}

}  // namespace tierpy
