// Lease.__dlpack__ / __dlpack_device__: the lease's bytes as a DLPack tensor (torch.from_dlpack,
// numpy.from_dlpack, cupy ...), zero-copy, on the CPU device.
//
// The structs are DLPack's stable ABI (v0.8: DLManagedTensor in a capsule named "dltensor", the
// consumer renames it "used_dltensor" and calls the deleter when done). The exported tensor
// counts as a buffer export of the lease, so release() refuses while a consumer still holds it.
#include <Python.h>

#include <cstdint>
#include <vector>

#include "binding.hpp"

namespace tierpy {
namespace {

// DLPack v0.8 ABI (dlpack.h), declared here rather than depending on a header package.
enum DLDeviceType : int32_t { kDLCPU = 1 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4, "DLPack ABI");
static_assert(sizeof(DLTensor) == 48 && sizeof(DLManagedTensor) == 64, "DLPack ABI (x86-64)");

DLDataType dl_type(const std::optional<tier::DType>& d) {
  if (!d) return {kDLUInt, 8, 1};
  switch (*d) {
    case tier::DType::kBytes:
    case tier::DType::kU8: return {kDLUInt, 8, 1};
    case tier::DType::kI8: return {kDLInt, 8, 1};
    case tier::DType::kF16: return {kDLFloat, 16, 1};
    case tier::DType::kBF16: return {kDLBfloat, 16, 1};
    case tier::DType::kF32: return {kDLFloat, 32, 1};
    case tier::DType::kF64: return {kDLFloat, 64, 1};
    case tier::DType::kI32: return {kDLInt, 32, 1};
    case tier::DType::kI64: return {kDLInt, 64, 1};
  }
  return {kDLUInt, 8, 1};
}

// What a DLManagedTensor owns: its shape, and a reference to the Lease (so the mapping and the
// export count outlive every consumer).
struct Exported {
  DLManagedTensor managed{};
  std::vector<int64_t> shape;
  PyObject* lease = nullptr;  // a strong reference
};

// Called by the consumer when it drops the tensor, possibly on a thread without the GIL.
void delete_exported(DLManagedTensor* self) {
  auto* e = static_cast<Exported*>(self->manager_ctx);
  PyGILState_STATE g = PyGILState_Ensure();
  try {
    --py::handle(e->lease).cast<PyLease&>().exports;
  } catch (...) {}
  Py_XDECREF(e->lease);
  PyGILState_Release(g);
  delete e;
}

// A capsule nobody consumed still owns its tensor.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
}

py::capsule to_dlpack(py::object self, py::object stream) {
  if (!stream.is_none()) throw py::buffer_error("a lease is host memory: __dlpack__ takes no stream");
  auto& l = self.cast<PyLease&>();
  if (l.released) throw py::buffer_error("lease was released: its memory is no longer pinned");
  DLDataType t = dl_type(l.dtype);
  const size_t item = t.bits / 8;
  if (l.nbytes % item != 0) throw py::buffer_error("the lease's size is not a whole number of elements");
  auto e = std::make_unique<Exported>();
  int64_t n = static_cast<int64_t>(l.nbytes / item), known = 1;
  for (int64_t d : l.shape) known *= d;
  e->shape = (!l.shape.empty() && known == n) ? l.shape : std::vector<int64_t>{n};
  e->managed.dl_tensor = DLTensor{
      l.data, DLDevice{kDLCPU, 0}, static_cast<int32_t>(e->shape.size()), t, e->shape.data(), nullptr, 0};
  e->managed.manager_ctx = e.get();
  e->managed.deleter = delete_exported;
  e->lease = self.inc_ref().ptr();
  ++l.exports;
  DLManagedTensor* m = &e.release()->managed;
  PyObject* cap = PyCapsule_New(m, "dltensor", capsule_destructor);
  if (cap == nullptr) {
    m->deleter(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

}  // namespace

void register_dlpack(py::class_<PyLease>& cls) {
  cls.def("__dlpack__", &to_dlpack, py::kw_only(), py::arg("stream") = py::none(),
          "The lease's bytes as a DLPack capsule (CPU, the tensor's dtype and shape): "
          "torch.from_dlpack(lease) is a zero-copy tensor. It counts as a buffer view: release() "
          "refuses until the consumer drops it.")
      .def(
          "__dlpack_device__", [](const PyLease&) { return py::make_tuple(static_cast<int>(kDLCPU), 0); },
          "(kDLCPU, 0): a lease is host memory");
}

}  // namespace tierpy
