// tierd.Error and its per-code subclasses.
#include <array>
#include <string>

#include "binding.hpp"

namespace tierpy {
namespace {

// Owned references for the life of the process (the module is never unloaded).
PyObject* g_error = nullptr;
std::array<PyObject*, tier::kMaxCode + 1> g_by_code{};

// The builtin exception each code also derives from, so `except PermissionError` and friends
// catch tierd's errors too; nullptr: tierd.Error alone.
PyObject* builtin_base(tier::Code c) {
  switch (c) {
    case tier::Code::kInvalidArgument: return PyExc_ValueError;
    case tier::Code::kNotFound: return PyExc_LookupError;
    case tier::Code::kAlreadyExists: return PyExc_FileExistsError;
    case tier::Code::kPermissionDenied: return PyExc_PermissionError;
    case tier::Code::kResourceExhausted: return PyExc_MemoryError;
    case tier::Code::kTimeout: return PyExc_TimeoutError;
    case tier::Code::kIo: return PyExc_OSError;
    case tier::Code::kUnavailable: return PyExc_ConnectionError;
    case tier::Code::kUnsupported: return PyExc_NotImplementedError;
    default: return nullptr;
  }
}

// The Python class name of a code: the code's name, except where that would shadow a builtin
// (the code kIo is named "IOError", an alias of OSError in Python).
std::string class_name(tier::Code c) {
  if (c == tier::Code::kIo) return "IoError";
  return std::string(tier::code_name(c));
}

}  // namespace

void register_errors(py::module_& m) {
  g_error = PyErr_NewExceptionWithDoc(
      "tierd.Error",
      "A failed tierd request. Attributes: code (the code name, e.g. 'NotFound'), code_value "
      "(its number) and message. Each code has a subclass: tierd.NotFound, tierd.Busy, ...",
      PyExc_Exception, nullptr);
  if (g_error == nullptr) throw py::error_already_set();
  m.attr("Error") = py::reinterpret_borrow<py::object>(g_error);
  for (uint16_t c = 1; c <= tier::kMaxCode; ++c) {
    const auto code = static_cast<tier::Code>(c);
    std::string name = class_name(code);
    std::string qual = "tierd." + name;
    PyObject* builtin = builtin_base(code);
    py::object bases = builtin ? py::object(py::make_tuple(py::handle(g_error), py::handle(builtin)))
                               : py::reinterpret_borrow<py::object>(g_error);
    PyObject* sub = PyErr_NewException(qual.c_str(), bases.ptr(), nullptr);
    if (sub == nullptr) throw py::error_already_set();
    g_by_code[c] = sub;
    m.attr(name.c_str()) = py::reinterpret_borrow<py::object>(sub);
  }
}

void raise_status(const tier::Status& s) {
  auto c = static_cast<uint16_t>(s.code());
  PyObject* type = (c <= tier::kMaxCode && g_by_code[c] != nullptr) ? g_by_code[c] : g_error;
  std::string text = s.to_string();
  py::object exc = py::reinterpret_steal<py::object>(PyObject_CallFunction(type, "s", text.c_str()));
  if (!exc) throw py::error_already_set();
  exc.attr("code") = py::str(std::string(tier::code_name(s.code())));
  exc.attr("code_value") = py::int_(c);
  exc.attr("message") = py::str(s.message());
  PyErr_SetObject(type, exc.ptr());
  throw py::error_already_set();
}

}  // namespace tierpy
