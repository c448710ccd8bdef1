// The `tierd` Python module: libtier's Client, pools, tensors, leases, plans and node status.
//
//   import tierd, torch
//   c = tierd.connect()                                  # $TIERD_SOCKET or /run/tierd/tierd.sock
//   c.create_pool("job1", exist_ok=True)
//   t = c.create_tensor("job1", "w0", shape=(1024,), dtype="float32", exist_ok=True)
//   with c.lease(t, "w") as l:
//       torch.frombuffer(l, dtype=torch.float32).copy_(src)   # zero-copy into the arena
//
// Errors are tierd.Error subclasses named by code (tierd.NotFound, tierd.Unavailable, ...).
#include <pybind11/stl.h>

#include <cmath>
#include <string>

#include "binding.hpp"

#ifndef TIER_VERSION
#define TIER_VERSION "unknown"
#endif

namespace tierpy {
namespace {

// One Python-side Client. Leases share ownership of the tier::Client, so close() ends this
// handle but the connection (and every arena mapping a view may point into) lives until the
// last Lease made from it is gone.
class PyClient {
 public:
  explicit PyClient(std::shared_ptr<tier::Client> c) : c_(std::move(c)) {}

  tier::Client& get() const {
    if (!c_) raise_status(tier::Status(tier::Code::kUnavailable, "client is closed"));
    return *c_;
  }
  const std::shared_ptr<tier::Client>& shared() const {
    get();
    return c_;
  }
  void close() { c_.reset(); }
  bool closed() const { return c_ == nullptr; }

 private:
  std::shared_ptr<tier::Client> c_;
};

uint64_t tensor_id_of(py::handle t) {
  if (py::isinstance<tier::TensorInfo>(t)) return t.cast<const tier::TensorInfo&>().id;
  if (py::isinstance<py::int_>(t)) return t.cast<uint64_t>();
  throw py::type_error("expected a tierd.TensorInfo or a tensor id (int)");
}

std::vector<uint64_t> tensor_ids_of(py::handle seq) {
  std::vector<uint64_t> ids;
  for (py::handle t : seq) ids.push_back(tensor_id_of(t));
  return ids;
}

tier::LeaseMode mode_of(const std::string& m) {
  if (m == "r" || m == "read") return tier::LeaseMode::kRead;
  if (m == "w" || m == "write") return tier::LeaseMode::kWrite;
  if (m == "o" || m == "overwrite") return tier::LeaseMode::kOverwrite;
  throw py::value_error("lease mode must be 'r', 'w' or 'o', not '" + m + "'");
}

tier::LeaseWait wait_of(py::object timeout) {
  tier::LeaseWait w;
  if (timeout.is_none()) {
    w.timeout_ms = tier::LeaseWait::kForever;
    return w;
  }
  double s = timeout.cast<double>();
  if (!(s >= 0) || !std::isfinite(s)) throw py::value_error("timeout must be >= 0 seconds or None");
  double ms = std::ceil(s * 1000.0);
  w.timeout_ms = ms > 2147483647.0 ? tier::LeaseWait::kForever : static_cast<int32_t>(ms);
  return w;
}

py::tuple shape_tuple(const std::vector<int64_t>& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = py::int_(s[i]);
  return t;
}

template <class F> auto nogil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

// Runs f(client) without the GIL; the closed check (which may raise) runs before, with it.
template <class F> auto on(const PyClient& c, F&& f) {
  tier::Client& client = c.get();
  py::gil_scoped_release release;
  return f(client);
}

py::dict status_dict(const tier::NodeStatus& s) {
  py::dict d;
  d["daemon_version"] = s.daemon_version;
  d["uptime_ms"] = s.uptime_ms;
  d["clients"] = s.clients;
  d["pools"] = s.pools;
  d["leases"] = s.leases;
  py::list ram, nvme;
  for (const auto& r : s.ram) {
    py::dict x;
    x["node"] = r.node;
    x["capacity"] = r.capacity;
    x["used"] = r.used;
    x["dirty"] = r.dirty;
    x["tensors"] = r.tensors;
    ram.append(x);
  }
  for (const auto& n : s.nvme) {
    py::dict x;
    x["path"] = n.path;
    x["numa_node"] = n.numa_node;
    x["backend"] = n.backend;
    x["capacity"] = n.capacity;
    x["used"] = n.used;
    nvme.append(x);
  }
  d["ram"] = ram;
  d["nvme"] = nvme;
  d["bytes_read"] = s.bytes_read;
  d["bytes_written"] = s.bytes_written;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["stalls"] = s.stalls;
  d["evictions"] = s.evictions;
  d["prefetches"] = s.prefetches;
  d["requests"] = s.requests;
  d["errors"] = s.errors;
  return d;
}

py::dict topology_dict(const tier::Topology& t) {
  auto devices = [](const std::vector<tier::TopoDevice>& v) {
    py::list l;
    for (const auto& g : v) {
      py::dict x;
      x["index"] = g.index;
      x["name"] = g.name;
      x["pci"] = g.pci;
      x["numa_node"] = g.numa_node;
      l.append(x);
    }
    return l;
  };
  py::dict d;
  d["source"] = t.source;
  py::list nodes;
  for (const auto& n : t.nodes) {
    py::dict x;
    x["id"] = n.id;
    x["memory"] = n.memory;
    x["cpus"] = n.cpus;
    nodes.append(x);
  }
  d["nodes"] = nodes;
  d["gpus"] = devices(t.gpus);
  d["nvme"] = devices(t.nvme);
  return d;
}

}  // namespace

tier::DType dtype_from_object(py::handle obj) {
  std::string s;
  if (py::isinstance<py::str>(obj)) s = obj.cast<std::string>();
  else if (PyType_Check(obj.ptr()) && py::hasattr(obj, "__name__"))
    s = obj.attr("__name__").cast<std::string>();
  else s = py::str(obj).cast<std::string>();
  if (s.starts_with("torch.")) s = s.substr(6);
  if (auto d = tier::dtype_from_name(s)) return *d;
  static const std::pair<const char*, tier::DType> kAliases[] = {
      {"float32", tier::DType::kF32}, {"float", tier::DType::kF32},     {"float16", tier::DType::kF16},
      {"half", tier::DType::kF16},    {"bfloat16", tier::DType::kBF16}, {"float64", tier::DType::kF64},
      {"double", tier::DType::kF64},  {"int32", tier::DType::kI32},     {"int", tier::DType::kI32},
      {"int64", tier::DType::kI64},   {"long", tier::DType::kI64},      {"uint8", tier::DType::kU8},
      {"int8", tier::DType::kI8},
  };
  for (const auto& [name, d] : kAliases)
    if (s == name) return d;
  throw py::value_error("unknown dtype '" + s +
                        "' (use bytes, f32, f16, bf16, f64, i32, i64, u8, i8 "
                        "or the numpy/torch names)");
}

}  // namespace tierpy

// The extension is tierd._native; the package python/tierd/__init__.py re-exports it as `tierd`
// and adds the pure-Python parts (tierd.torch).
PYBIND11_MODULE(_native, m) {
  using namespace tierpy;
  m.doc() =
      "tierd: the node memory tier (RAM and NVMe) for training state, over libtier. "
      "Leases expose the buffer protocol: numpy.frombuffer / torch.frombuffer are zero-copy.";
  m.attr("__version__") = TIER_VERSION;
  register_errors(m);
  register_lease(m);
  register_optim(m);

  m.def("default_socket_path", &tier::default_socket_path, "$TIERD_SOCKET, else /run/tierd/tierd.sock");
  m.def(
      "dtype_size", [](py::handle d) { return tier::dtype_size(dtype_from_object(d)); },
      "bytes per element of a dtype");

  py::class_<tier::PoolInfo>(m, "PoolInfo")
      .def_readonly("id", &tier::PoolInfo::id)
      .def_readonly("name", &tier::PoolInfo::name)
      .def_readonly("owner_uid", &tier::PoolInfo::owner_uid)
      .def_readonly("ram_quota", &tier::PoolInfo::ram_quota)
      .def_readonly("nvme_quota", &tier::PoolInfo::nvme_quota)
      .def_readonly("ram_used", &tier::PoolInfo::ram_used)
      .def_readonly("nvme_used", &tier::PoolInfo::nvme_used)
      .def_readonly("tensor_count", &tier::PoolInfo::tensor_count)
      .def("__repr__", [](const tier::PoolInfo& p) {
        return "<tierd.PoolInfo '" + p.name + "' id=" + std::to_string(p.id) +
               " tensors=" + std::to_string(p.tensor_count) + " ram_used=" + std::to_string(p.ram_used) + ">";
      });

  py::class_<tier::TensorInfo>(m, "TensorInfo")
      .def_readonly("id", &tier::TensorInfo::id)
      .def_readonly("name", &tier::TensorInfo::name)
      .def_readonly("size", &tier::TensorInfo::size)
      .def_property_readonly("nbytes", [](const tier::TensorInfo& t) { return t.size; })
      .def_property_readonly("dtype",
                             [](const tier::TensorInfo& t) { return std::string(tier::dtype_name(t.dtype)); })
      .def_property_readonly("shape", [](const tier::TensorInfo& t) { return shape_tuple(t.shape); })
      .def_readonly("numa_node", &tier::TensorInfo::numa_node)
      .def_property_readonly("in_ram",
                             [](const tier::TensorInfo& t) { return (t.tiers & tier::kTierRam) != 0; })
      .def_property_readonly("on_nvme",
                             [](const tier::TensorInfo& t) { return (t.tiers & tier::kTierNvme) != 0; })
      .def_readonly("dirty", &tier::TensorInfo::dirty)
      .def_readonly("readers", &tier::TensorInfo::readers)
      .def_readonly("writer", &tier::TensorInfo::writer)
      .def("__repr__", [](const tier::TensorInfo& t) {
        std::string shape;
        for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
        return "<tierd.TensorInfo '" + t.name + "' id=" + std::to_string(t.id) + " " +
               std::string(tier::dtype_name(t.dtype)) + "[" + shape + "] " + std::to_string(t.size) + " B>";
      });

  py::class_<PyClient>(m, "Client", "A connection to tierd. Thread-safe; see tierd.connect().")
      .def("close", &PyClient::close,
           "Drops this handle. The connection, its leases and arena mappings end when the last "
           "Lease made from it is gone too.")
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("socket_path", [](const PyClient& c) { return c.get().socket_path(); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyClient& c, py::object, py::object, py::object) {
             c.close();
             return false;
           })
      // Pools.
      .def(
          "create_pool",
          [](PyClient& c, const std::string& name, uint64_t ram_quota, uint64_t nvme_quota, bool exist_ok) {
            tier::PoolOptions o{.ram_quota = ram_quota, .nvme_quota = nvme_quota};
            return unwrap(on(c, [&](tier::Client& cl) { return cl.create_pool(name, o, exist_ok); }));
          },
          py::arg("name"), py::kw_only(), py::arg("ram_quota") = 0, py::arg("nvme_quota") = 0,
          py::arg("exist_ok") = false)
      .def(
          "open_pool",
          [](PyClient& c, const std::string& name) {
            return unwrap(on(c, [&](tier::Client& cl) { return cl.open_pool(name); }));
          },
          py::arg("name"))
      .def("list_pools",
           [](PyClient& c) { return unwrap(on(c, [&](tier::Client& cl) { return cl.list_pools(); })); })
      .def(
          "drop_pool",
          [](PyClient& c, const std::string& name) {
            check(on(c, [&](tier::Client& cl) { return cl.drop_pool(name); }));
          },
          py::arg("name"))
      // Tensors.
      .def(
          "create_tensor",
          [](PyClient& c, const std::string& pool, const std::string& name, py::object shape,
             py::object dtype, py::object size, py::object numa_node, py::object near_gpu, bool exist_ok) {
            tier::TensorDesc d;
            d.name = name;
            d.dtype = dtype_from_object(dtype);
            uint64_t elems = 1;
            if (!shape.is_none()) {
              if (py::isinstance<py::int_>(shape)) shape = py::make_tuple(shape);
              for (py::handle x : shape) {
                int64_t v = x.cast<int64_t>();
                if (v < 0) throw py::value_error("negative dimension in shape");
                d.shape.push_back(v);
                elems *= static_cast<uint64_t>(v);
              }
            }
            if (!size.is_none()) d.size = size.cast<uint64_t>();
            else if (!shape.is_none()) d.size = elems * tier::dtype_size(d.dtype);
            else throw py::value_error("create_tensor needs shape= or size=");
            if (!numa_node.is_none()) d.placement = tier::Placement::node(numa_node.cast<int32_t>());
            else if (!near_gpu.is_none()) d.placement = tier::Placement::near_gpu(near_gpu.cast<int32_t>());
            return unwrap(on(c, [&](tier::Client& cl) { return cl.create_tensor(pool, d, exist_ok); }));
          },
          py::arg("pool"), py::arg("name"), py::kw_only(), py::arg("shape") = py::none(),
          py::arg("dtype") = "bytes", py::arg("size") = py::none(), py::arg("numa_node") = py::none(),
          py::arg("near_gpu") = py::none(), py::arg("exist_ok") = false,
          "Creates a tensor of `size` bytes (default: prod(shape) * dtype size). dtype and shape "
          "are metadata; dtype accepts 'f32', 'float32', numpy and torch dtypes.")
      .def(
          "open_tensor",
          [](PyClient& c, const std::string& pool, const std::string& name) {
            return unwrap(on(c, [&](tier::Client& cl) { return cl.open_tensor(pool, name); }));
          },
          py::arg("pool"), py::arg("name"))
      .def(
          "list_tensors",
          [](PyClient& c, const std::string& pool) {
            return unwrap(on(c, [&](tier::Client& cl) { return cl.list_tensors(pool); }));
          },
          py::arg("pool"))
      .def(
          "delete_tensor",
          [](PyClient& c, const std::string& pool, const std::string& name) {
            check(on(c, [&](tier::Client& cl) { return cl.delete_tensor(pool, name); }));
          },
          py::arg("pool"), py::arg("name"))
      // Leases.
      .def(
          "lease",
          [](PyClient& c, py::object tensor, const std::string& mode, py::object timeout) {
            uint64_t id = tensor_id_of(tensor);
            tier::LeaseMode lm = mode_of(mode);
            tier::LeaseWait w = wait_of(timeout);
            auto client = c.shared();
            auto l = unwrap(nogil([&] { return client->lease(id, lm, w); }));
            auto pl = std::make_unique<PyLease>(client, std::move(l));
            if (py::isinstance<tier::TensorInfo>(tensor)) {
              const auto& ti = tensor.cast<const tier::TensorInfo&>();
              pl->dtype = ti.dtype;
              pl->shape = ti.shape;
            }
            return pl;
          },
          py::arg("tensor"), py::arg("mode") = "r", py::arg("timeout") = 0.0,
          "Leases a tensor (TensorInfo or id). mode: 'r' read (shared with other readers), 'w' write "
          "(exclusive; a copy spilled to NVMe is read back first), 'o' overwrite (exclusive and "
          "writable, without reading a spilled copy back: the caller writes every byte). timeout: "
          "seconds to wait for a conflicting lease (0: fail fast with tierd.Busy; None: wait forever).")
      .def(
          "lease_batch",
          [](PyClient& c, py::object tensors, const std::string& mode, py::object timeout) {
            std::vector<py::object> infos;
            for (py::handle t : tensors) infos.push_back(py::reinterpret_borrow<py::object>(t));
            auto ids = tensor_ids_of(tensors);
            tier::LeaseMode lm = mode_of(mode);
            tier::LeaseWait w = wait_of(timeout);
            auto client = c.shared();
            auto leases = unwrap(nogil([&] { return client->lease_batch(ids, lm, w); }));
            py::list out;
            for (size_t i = 0; i < leases.size(); ++i) {
              auto pl = std::make_unique<PyLease>(client, std::move(leases[i]));
              if (i < infos.size() && py::isinstance<tier::TensorInfo>(infos[i])) {
                const auto& ti = infos[i].cast<const tier::TensorInfo&>();
                pl->dtype = ti.dtype;
                pl->shape = ti.shape;
              }
              out.append(py::cast(std::move(pl)));
            }
            return out;
          },
          py::arg("tensors"), py::arg("mode") = "r", py::arg("timeout") = 0.0,
          "Leases several tensors in one round trip, all or none, in order; mode and timeout as "
          "lease() ('r', 'w' or 'o').")
      // Tiering and plans.
      .def(
          "prefetch",
          [](PyClient& c, const std::string& pool, py::object tensors) {
            auto ids = tensor_ids_of(tensors);
            check(on(c, [&](tier::Client& cl) { return cl.prefetch(pool, ids); }));
          },
          py::arg("pool"), py::arg("tensors"), "Queues NVMe -> RAM reads; returns once queued.")
      .def(
          "evict",
          [](PyClient& c, const std::string& pool, py::object tensors) {
            auto ids = tensor_ids_of(tensors);
            check(on(c, [&](tier::Client& cl) { return cl.evict(pool, ids); }));
          },
          py::arg("pool"), py::arg("tensors") = py::tuple(),
          "Writes back and drops from RAM the given tensors (all unleased ones when empty).")
      .def(
          "discard",
          [](PyClient& c, const std::string& pool, py::object tensors) {
            auto ids = tensor_ids_of(tensors);
            check(on(c, [&](tier::Client& cl) { return cl.discard(pool, ids); }));
          },
          py::arg("pool"), py::arg("tensors"),
          "The tensors' bytes are dead until their next write: tierd may drop a RAM copy without "
          "writing it back (they then read as their last written-back bytes).")
      .def(
          "set_plan",
          [](PyClient& c, const std::string& pool, py::object tensors, uint64_t budget) {
            auto ids = tensor_ids_of(tensors);
            check(on(c, [&](tier::Client& cl) { return cl.set_plan(pool, ids, budget); }));
          },
          py::arg("pool"), py::arg("tensors"), py::arg("budget") = 0,
          "Registers one step's ordered tensor uses; replaces this client's earlier plan.")
      .def(
          "snapshot",
          [](PyClient& c, const std::string& pool) {
            auto s = unwrap(on(c, [&](tier::Client& cl) { return cl.snapshot(pool); }));
            py::dict d;
            d["snapshot_id"] = s.snapshot_id;
            d["bytes"] = s.bytes;
            d["stall_us"] = s.stall_us;
            return d;
          },
          py::arg("pool"))
      // Node inspection.
      .def("status",
           [](PyClient& c) {
             return status_dict(unwrap(on(c, [&](tier::Client& cl) { return cl.status(); })));
           })
      .def("topology",
           [](PyClient& c) {
             return topology_dict(unwrap(on(c, [&](tier::Client& cl) { return cl.topology(); })));
           })
      .def(
          "metrics",
          [](PyClient& c) { return unwrap(on(c, [&](tier::Client& cl) { return cl.metrics(); })); },
          "Prometheus text exposition");

  m.def(
      "connect",
      [](py::object socket, py::object name, double timeout) {
        std::string path = socket.is_none() ? std::string() : py::str(socket).cast<std::string>();
        tier::ConnectOptions o;
        if (!name.is_none()) o.client_name = name.cast<std::string>();
        else o.client_name = "python";
        if (timeout < 0) throw py::value_error("timeout must be >= 0 seconds");
        o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout * 1000.0)));
        auto c = unwrap(nogil([&] { return tier::Client::connect(path, o); }));
        return PyClient(std::shared_ptr<tier::Client>(std::move(c)));
      },
      py::arg("socket") = py::none(), py::arg("name") = py::none(), py::arg("timeout") = 0.0,
      "Connects to tierd at `socket` (default: $TIERD_SOCKET, else /run/tierd/tierd.sock). "
      "timeout: seconds to keep retrying while the daemon is not accepting yet. Raises "
      "tierd.Unavailable when no daemon answers.");
}
