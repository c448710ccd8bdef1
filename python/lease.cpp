// tierd.Lease: a pin on one tensor that exports its arena bytes through the buffer protocol.
//
// The buffer is the tensor's bytes, 1-D, format 'B', writable only for write leases, so
// numpy.frombuffer(lease, dtype) and torch.frombuffer(lease, dtype=...) are zero-copy views of
// the daemon's arena. The export count is kept here (not by pybind11) so release() can refuse
// while a memoryview or numpy array still uses the memory.
#include <string>

#include "binding.hpp"

namespace tierpy {
namespace {

// The mode as Python spells it ("r", "w", "o"; see mode_of in module.cpp).
const char* mode_name(tier::LeaseMode m) {
  switch (m) {
    case tier::LeaseMode::kRead: return "r";
    case tier::LeaseMode::kWrite: return "w";
    case tier::LeaseMode::kOverwrite: return "o";
  }
  return "?";
}

const char* numpy_name(tier::DType d) {
  switch (d) {
    case tier::DType::kBytes: return "uint8";
    case tier::DType::kF32: return "float32";
    case tier::DType::kF16: return "float16";
    case tier::DType::kF64: return "float64";
    case tier::DType::kI32: return "int32";
    case tier::DType::kI64: return "int64";
    case tier::DType::kU8: return "uint8";
    case tier::DType::kI8: return "int8";
    case tier::DType::kBF16: return nullptr;  // numpy has no bfloat16
  }
  return nullptr;
}

const char* torch_name(tier::DType d) {
  switch (d) {
    case tier::DType::kBytes: return "uint8";
    case tier::DType::kF32: return "float32";
    case tier::DType::kF16: return "float16";
    case tier::DType::kBF16: return "bfloat16";
    case tier::DType::kF64: return "float64";
    case tier::DType::kI32: return "int32";
    case tier::DType::kI64: return "int64";
    case tier::DType::kU8: return "uint8";
    case tier::DType::kI8: return "int8";
  }
  return nullptr;
}

int lease_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  PyLease* l = nullptr;
  try {
    l = &py::handle(self).cast<PyLease&>();
  } catch (...) {
    PyErr_SetString(PyExc_BufferError, "not a tierd.Lease");
    view->obj = nullptr;
    return -1;
  }
  if (l->released) {
    PyErr_SetString(PyExc_BufferError, "lease was released: its memory is no longer pinned");
    view->obj = nullptr;
    return -1;
  }
  const int readonly = tier::is_write(l->mode) ? 0 : 1;
  if (PyBuffer_FillInfo(view, self, l->data, static_cast<Py_ssize_t>(l->nbytes), readonly, flags) != 0)
    return -1;
  ++l->exports;
  return 0;
}

void lease_releasebuffer(PyObject* self, Py_buffer*) {
  try {
    --py::handle(self).cast<PyLease&>().exports;
  } catch (...) {}
}

void do_release(PyLease& l) {
  if (l.released) return;
  if (l.exports > 0)
    throw py::buffer_error("cannot release lease " + std::to_string(l.lease_id) + ": " +
                           std::to_string(l.exports) +
                           " buffer view(s) (memoryview, numpy array) still use its memory; "
                           "delete them first");
  // Moved out first so a second thread calling release() while the GIL is dropped sees it done.
  tier::Lease lease = std::move(l.lease);
  l.released = true;
  tier::Status st;
  {
    py::gil_scoped_release nogil;
    st = lease.release();
  }
  check(st);
}

py::object reshape_if_known(const PyLease& l, py::object arr) {
  if (l.shape.empty()) return arr;
  int64_t n = 1;
  for (int64_t d : l.shape) n *= d;
  if (n < 0 || static_cast<size_t>(n) != py::len(arr)) return arr;
  py::tuple shape(l.shape.size());
  for (size_t i = 0; i < l.shape.size(); ++i) shape[i] = py::int_(l.shape[i]);
  return arr.attr("reshape")(shape);
}

}  // namespace

PyLease::PyLease(std::shared_ptr<tier::Client> c, tier::Lease&& l)
    : client(std::move(c)), lease(std::move(l)) {
  lease_id = lease.id();
  tensor_id = lease.tensor_id();
  mode = lease.mode();
  data = lease.bytes().data();
  nbytes = lease.bytes().size();
}

void register_lease(py::module_& m) {
  auto cls = py::class_<PyLease>(m, "Lease", py::buffer_protocol(), R"doc(
A pin on one tensor: while held, its bytes stay in RAM at a fixed address of the daemon's arena.

Modes (Client.lease(tensor, mode)): 'r' read (shared with other readers), 'w' write (exclusive;
the tensor's bytes are read back from NVMe first if they were spilled), 'o' overwrite
(exclusive, writable, without reading a spilled copy back: for a caller that writes every byte).

Exposes the buffer protocol (1-D bytes; writable for write leases, read-only for read leases):
numpy.frombuffer(lease, dtype) and torch.frombuffer(lease, dtype=...) are zero-copy views.
Use as a context manager, or call release(). Lifetime rule: a view must not outlive the lease.
release() raises BufferError while a memoryview or numpy view is alive; torch views cannot be
seen, and after release they read memory that is still mapped (no crash) but no longer pinned.
)doc");
  cls.def_property_readonly("id", [](const PyLease& l) { return l.lease_id; })
      .def_property_readonly("tensor_id", [](const PyLease& l) { return l.tensor_id; })
      .def_property_readonly("mode", [](const PyLease& l) { return mode_name(l.mode); })
      .def_property_readonly("writable", [](const PyLease& l) { return tier::is_write(l.mode); })
      .def_property_readonly("nbytes", [](const PyLease& l) { return l.nbytes; })
      .def_property_readonly(
          "address", [](const PyLease& l) { return reinterpret_cast<uintptr_t>(l.data); },
          "address of the first byte in this process (for checks and DMA)")
      .def_property_readonly("released", [](const PyLease& l) { return l.released; })
      .def_property_readonly(
          "exports", [](const PyLease& l) { return l.exports; }, "buffer views (memoryview, numpy) alive now")
      .def_property_readonly("dtype",
                             [](const PyLease& l) -> py::object {
                               if (!l.dtype) return py::none();
                               return py::str(std::string(tier::dtype_name(*l.dtype)));
                             })
      .def_property_readonly("shape",
                             [](const PyLease& l) {
                               py::tuple t(l.shape.size());
                               for (size_t i = 0; i < l.shape.size(); ++i) t[i] = py::int_(l.shape[i]);
                               return t;
                             })
      .def("__len__", [](const PyLease& l) { return l.nbytes; })
      .def("release", &do_release,
           "Releases the lease now (a no-op when already released). Raises BufferError while "
           "buffer views are alive.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyLease& l, py::object type, py::object, py::object) {
             // With an exception in flight and views still alive, the lease stays held until the
             // Lease object is collected rather than masking the original exception.
             if (l.exports > 0 && !type.is_none()) return false;
             do_release(l);
             return false;
           })
      .def(
          "memoryview",
          [](py::object self) {
            return py::reinterpret_steal<py::object>(PyMemoryView_FromObject(self.ptr()));
          },
          "memoryview(lease)")
      .def(
          "numpy",
          [](py::object self, py::object dtype) {
            auto& l = self.cast<PyLease&>();
            if (dtype.is_none()) {
              const char* n = l.dtype ? numpy_name(*l.dtype) : "uint8";
              if (n == nullptr) throw py::type_error("numpy has no bfloat16; use torch() or pass dtype");
              dtype = py::str(n);
            }
            py::object arr = py::module_::import("numpy").attr("frombuffer")(self, py::arg("dtype") = dtype);
            return reshape_if_known(l, arr);
          },
          py::arg("dtype") = py::none(),
          "numpy.frombuffer(self, dtype) shaped like the tensor (dtype defaults to the tensor's)")
      .def(
          "torch",
          [](py::object self, py::object dtype) {
            auto& l = self.cast<PyLease&>();
            py::module_ torch = py::module_::import("torch");
            if (dtype.is_none()) dtype = torch.attr(l.dtype ? torch_name(*l.dtype) : "uint8");
            else if (py::isinstance<py::str>(dtype)) dtype = torch.attr(dtype);
            py::object t = torch.attr("frombuffer")(self, py::arg("dtype") = dtype);
            return reshape_if_known(l, t);
          },
          py::arg("dtype") = py::none(),
          "torch.frombuffer(self, dtype=...) shaped like the tensor (dtype defaults to the tensor's)")
      .def("__repr__", [](const PyLease& l) {
        return "<tierd.Lease id=" + std::to_string(l.lease_id) + " tensor=" + std::to_string(l.tensor_id) +
               " mode=" + std::string(mode_name(l.mode)) + " nbytes=" + std::to_string(l.nbytes) +
               (l.released ? " released" : "") + ">";
      });
  register_dlpack(cls);
  // pybind11 installed its own buffer slots; replace them with ours, which count exports.
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_as_buffer->bf_getbuffer = lease_getbuffer;
  type->tp_as_buffer->bf_releasebuffer = lease_releasebuffer;
}

}  // namespace tierpy
