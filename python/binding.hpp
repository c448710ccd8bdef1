// Shared pieces of the `tierd` Python module: errors, the Lease type, dtype names.
//
// GIL: every call into libtier runs with the GIL released (tier::Client is thread-safe); Python
// objects are touched only with the GIL held, which also serializes the Lease bookkeeping.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "tier/client.hpp"

namespace tierpy {

namespace py = pybind11;

// Registers adamw_step, tier-train's AdamW shard update (python/optim.cpp).
void register_optim(py::module_& m);

// Registers tierd.Error and one subclass per tier::Code (tierd.NotFound, tierd.Busy, ...).
void register_errors(py::module_& m);
// Raises the tierd.Error subclass for s.code() with .code (name), .code_value and .message set.
[[noreturn]] void raise_status(const tier::Status& s);

template <class T> T unwrap(tier::Result<T>&& r) {
  if (!r) raise_status(r.error());
  return std::move(*r);
}
inline void check(const tier::Status& s) {
  if (!s.is_ok()) raise_status(s);
}

// dtype from a name ("f32", "float32", "torch.float32", numpy.float32, numpy.dtype('float32')).
tier::DType dtype_from_object(py::handle obj);

// A lease as Python sees it. Holds the Client (and so its arena mappings) alive for as long as
// this object lives, so the memory of any view made from it stays mapped even after release():
// a view that outlives its lease reads unpinned memory, it never faults. See docs/python.md.
struct PyLease {
  // Declared first so it is destroyed last: ~Lease() talks to the daemon through it.
  std::shared_ptr<tier::Client> client;
  tier::Lease lease;
  uint64_t lease_id = 0;
  uint64_t tensor_id = 0;
  tier::LeaseMode mode = tier::LeaseMode::kRead;
  std::byte* data = nullptr;
  size_t nbytes = 0;
  // Metadata of the tensor when the lease was taken from a TensorInfo.
  std::optional<tier::DType> dtype;
  std::vector<int64_t> shape;
  // Live buffer exports (memoryview, numpy arrays). torch.frombuffer keeps a reference to the
  // Lease instead of an export, so it does not show up here.
  int64_t exports = 0;
  bool released = false;

  PyLease(std::shared_ptr<tier::Client> c, tier::Lease&& l);
};

void register_lease(py::module_& m);
// Adds __dlpack__ / __dlpack_device__ to the Lease class (python/dlpack.cpp).
void register_dlpack(py::class_<PyLease>& cls);

}  // namespace tierpy
