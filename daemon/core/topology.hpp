// The node's topology as tierd uses it: NUMA nodes (memory, CPUs) and, for each GPU and NVMe
// device, its nearest NUMA node. Read once at start through hwloc from one of three sources:
// this machine, an hwloc synthetic description, or an hwloc XML file (tests simulate a
// 2-socket, 4-GPU server on a 1-node machine with tests/data/topo-2numa-4gpu.xml).
//
// NUMA node ids are hwloc OS indexes: on the real machine they are the kernel's node numbers;
// in a synthetic or XML topology they may name nodes this kernel lacks, which the RAM tier
// handles by degrading the binding (see ram/arena.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tier/status.hpp"
#include "tier/types.hpp"

namespace tier::daemon {

struct NumaNode {
  int32_t id = 0;
  uint64_t memory = 0;  // bytes local to the node
  std::string cpus;     // "0-63,128-191"
};

struct Device {
  int32_t index = 0;       // 0.. in PCI bus order, per kind
  std::string name;        // OS device name when hwloc knows it ("nvme0n1", "cuda0"), else PCI ids
  std::string pci;         // "0000:07:00.0"
  int32_t numa_node = -1;  // nearest node; -1 when the device is not local to one node
};

struct Topology {
  std::string source;  // "hwloc:this system", "hwloc:synthetic DESC", "hwloc:xml FILE"
  std::vector<NumaNode> nodes;
  std::vector<Device> gpus;
  std::vector<Device> nvme;

  [[nodiscard]] bool has_node(int32_t id) const noexcept;
  [[nodiscard]] const NumaNode* node(int32_t id) const noexcept;
  [[nodiscard]] uint64_t total_memory() const noexcept;
};

// Where topology comes from. Implementations: this machine, synthetic, XML.
class TopologySource {
 public:
  virtual ~TopologySource() = default;
  [[nodiscard]] virtual Result<Topology> load() const = 0;
};

// "" -> this machine; "synthetic:DESC" -> hwloc synthetic; otherwise an XML file path.
[[nodiscard]] std::unique_ptr<TopologySource> make_topology_source(const std::string& spec);

// Where a new tensor's RAM copy goes (pure): an explicit node must exist; near_gpu=N takes
// GPU N's nearest node (the first node when the GPU is not local to one); kAny takes the
// client's node when the topology has it, else the first node.
[[nodiscard]] Result<int32_t> choose_node(const Topology& topo, Placement p, int32_t client_node);

}  // namespace tier::daemon
