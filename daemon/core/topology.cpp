#include "core/topology.hpp"
#include "base/errors.hpp"

#include <hwloc.h>

#include <cstdio>
#include <cstdlib>

namespace tier::daemon {

bool Topology::has_node(int32_t id) const noexcept { return node(id) != nullptr; }

const NumaNode* Topology::node(int32_t id) const noexcept {
  for (const auto& n : nodes)
    if (n.id == id) return &n;
  return nullptr;
}

uint64_t Topology::total_memory() const noexcept {
  uint64_t t = 0;
  for (const auto& n : nodes) t += n.memory;
  return t;
}

namespace {

// Owns an hwloc topology for the duration of one load.
struct HwlocTopo {
  hwloc_topology_t t = nullptr;
  HwlocTopo() { hwloc_topology_init(&t); }
  ~HwlocTopo() { hwloc_topology_destroy(t); }
  HwlocTopo(const HwlocTopo&) = delete;
  HwlocTopo& operator=(const HwlocTopo&) = delete;
};

std::string bitmap_list(hwloc_const_bitmap_t b) {
  if (!b) return {};
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, b) < 0 || !s) return {};
  std::string out(s);
  std::free(s);
  return out;
}

int32_t nearest_node(hwloc_topology_t t, hwloc_obj_t dev) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, dev);
  if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

std::string pci_name(hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%01x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

// The first OS device below a PCI device of one of the wanted types, e.g. "nvme0n1".
std::string os_dev_name(hwloc_obj_t pci, std::initializer_list<hwloc_obj_osdev_type_e> types) {
  for (hwloc_obj_t c = pci->io_first_child; c; c = c->next_sibling) {
    if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name) continue;
    for (auto ty : types)
      if (c->attr->osdev.type == ty) return c->name;
  }
  return {};
}

std::string fallback_name(hwloc_obj_t pci, const char* kind) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s %04x:%04x", kind, pci->attr->pcidev.vendor_id,
                pci->attr->pcidev.device_id);
  return buf;
}

Result<Topology> read_hwloc(hwloc_topology_t t, std::string source) {
  Topology topo;
  topo.source = std::move(source);
  int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NumaNode node;
    node.id = static_cast<int32_t>(o->os_index);
    node.memory = o->attr ? o->attr->numanode.local_memory : 0;
    node.cpus = bitmap_list(o->cpuset);
    topo.nodes.push_back(std::move(node));
  }
  if (topo.nodes.empty()) return fail(Code::kInternal, topo.source + ": no NUMA node found");
  for (hwloc_obj_t p = hwloc_get_next_pcidev(t, nullptr); p; p = hwloc_get_next_pcidev(t, p)) {
    unsigned cls = p->attr->pcidev.class_id;
    if (cls == 0x0300 || cls == 0x0302) {
      Device d;
      d.index = static_cast<int32_t>(topo.gpus.size());
      d.name = os_dev_name(p, {HWLOC_OBJ_OSDEV_COPROC, HWLOC_OBJ_OSDEV_GPU});
      if (d.name.empty()) d.name = fallback_name(p, "gpu");
      d.pci = pci_name(p);
      d.numa_node = nearest_node(t, p);
      topo.gpus.push_back(std::move(d));
    } else if (cls == 0x0108) {
      Device d;
      d.index = static_cast<int32_t>(topo.nvme.size());
      d.name = os_dev_name(p, {HWLOC_OBJ_OSDEV_BLOCK});
      if (d.name.empty()) d.name = fallback_name(p, "nvme");
      d.pci = pci_name(p);
      d.numa_node = nearest_node(t, p);
      topo.nvme.push_back(std::move(d));
    }
  }
  // OS devices whose PCI device has another class (e.g. an accelerator reporting 0x0380 or
  // 0x1200 with a CUDA device, or an NVMe drive behind a non-0x0108 function).
  auto counted = [](const std::vector<Device>& v, const std::string& pci) {
    for (const auto& d : v)
      if (d.pci == pci) return true;
    return false;
  };
  for (hwloc_obj_t o = hwloc_get_next_osdev(t, nullptr); o; o = hwloc_get_next_osdev(t, o)) {
    hwloc_obj_t pci = o->parent;
    while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE) pci = pci->parent;
    if (!pci || !o->name) continue;
    std::string bus = pci_name(pci);
    auto type = o->attr->osdev.type;
    bool gpu = type == HWLOC_OBJ_OSDEV_COPROC || type == HWLOC_OBJ_OSDEV_GPU;
    bool nvme = type == HWLOC_OBJ_OSDEV_BLOCK && std::string_view(o->name).starts_with("nvme");
    if (gpu && !counted(topo.gpus, bus))
      topo.gpus.push_back(Device{static_cast<int32_t>(topo.gpus.size()), o->name, bus, nearest_node(t, pci)});
    if (nvme && !counted(topo.nvme, bus))
      topo.nvme.push_back(Device{static_cast<int32_t>(topo.nvme.size()), o->name, bus, nearest_node(t, pci)});
  }
  return topo;
}

class SystemSource final : public TopologySource {
 public:
  Result<Topology> load() const override {
    HwlocTopo h;
    hwloc_topology_set_io_types_filter(h.t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(h.t) != 0)
      return fail(Status::from_errno(errno, "hwloc: load this machine's topology"));
    return read_hwloc(h.t, "hwloc:this system");
  }
};

class SyntheticSource final : public TopologySource {
 public:
  explicit SyntheticSource(std::string desc) : desc_(std::move(desc)) {}
  Result<Topology> load() const override {
    HwlocTopo h;
    if (hwloc_topology_set_synthetic(h.t, desc_.c_str()) != 0)
      return fail(Code::kInvalidArgument, "invalid hwloc synthetic topology '" + desc_ + "'");
    if (hwloc_topology_load(h.t) != 0)
      return fail(Status::from_errno(errno, "hwloc: load synthetic topology"));
    return read_hwloc(h.t, "hwloc:synthetic " + desc_);
  }

 private:
  std::string desc_;
};

class XmlSource final : public TopologySource {
 public:
  explicit XmlSource(std::string path) : path_(std::move(path)) {}
  Result<Topology> load() const override {
    HwlocTopo h;
    if (hwloc_topology_set_xml(h.t, path_.c_str()) != 0)
      return fail(Status::from_errno(errno, "hwloc: read topology XML " + path_));
    hwloc_topology_set_io_types_filter(h.t, HWLOC_TYPE_FILTER_KEEP_ALL);
    if (hwloc_topology_load(h.t) != 0)
      return fail(Code::kInvalidArgument, "hwloc: cannot load topology XML " + path_);
    return read_hwloc(h.t, "hwloc:xml " + path_);
  }

 private:
  std::string path_;
};

}  // namespace

std::unique_ptr<TopologySource> make_topology_source(const std::string& spec) {
  if (spec.empty()) return std::make_unique<SystemSource>();
  if (spec.starts_with("synthetic:")) return std::make_unique<SyntheticSource>(spec.substr(10));
  return std::make_unique<XmlSource>(spec);
}

Result<int32_t> choose_node(const Topology& topo, Placement p, int32_t client_node) {
  if (topo.nodes.empty()) return fail(Code::kInternal, "the topology has no NUMA node");
  switch (p.kind) {
    case Placement::Kind::kNode:
      if (!topo.has_node(p.index))
        return fail(Code::kInvalidArgument, "NUMA node " + std::to_string(p.index) +
                                                " does not exist on this node (it has " +
                                                std::to_string(topo.nodes.size()) + ")");
      return p.index;
    case Placement::Kind::kNearGpu: {
      if (p.index < 0 || static_cast<size_t>(p.index) >= topo.gpus.size())
        return fail(Code::kInvalidArgument, "GPU " + std::to_string(p.index) +
                                                " does not exist (this node has " +
                                                std::to_string(topo.gpus.size()) + " GPUs)");
      int32_t n = topo.gpus[static_cast<size_t>(p.index)].numa_node;
      return topo.has_node(n) ? n : topo.nodes.front().id;
    }
    case Placement::Kind::kAny: return topo.has_node(client_node) ? client_node : topo.nodes.front().id;
  }
  return fail(Code::kInvalidArgument, "unknown placement kind");
}

}  // namespace tier::daemon
