#include <catch2/catch.hpp>

#include "core/topology.hpp"

using namespace tier;
using namespace tier::daemon;

#if defined(__SANITIZE_ADDRESS__)
// As in daemon/main.cpp: hwloc's PCI plugin leaks once per load of this machine's topology.
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }
extern "C" const char* __lsan_default_suppressions() { return "leak:libhwloc.so\n"; }
#endif

namespace {
const std::string kXml = std::string(TIER_SOURCE_DIR) + "/tests/data/topo-2numa-4gpu.xml";
}

TEST_CASE("topology: the 2-socket XML test machine") {
  auto t = make_topology_source(kXml)->load();
  REQUIRE(t);
  CHECK(t->source == "hwloc:xml " + kXml);
  REQUIRE(t->nodes.size() == 2);
  CHECK(t->nodes[0].id == 0);
  CHECK(t->nodes[1].id == 1);
  CHECK(t->nodes[0].memory == 8ull << 30);
  CHECK(t->nodes[0].cpus == "0-3");
  CHECK(t->nodes[1].cpus == "4-7");
  REQUIRE(t->gpus.size() == 4);
  CHECK(t->gpus[0].numa_node == 0);
  CHECK(t->gpus[1].numa_node == 0);
  CHECK(t->gpus[2].numa_node == 1);
  CHECK(t->gpus[3].numa_node == 1);
  CHECK(t->gpus[0].name == "cuda0");
  CHECK(t->gpus[2].pci == "0000:90:00.0");
  REQUIRE(t->nvme.size() == 2);
  CHECK(t->nvme[0].name == "nvme0n1");
  CHECK(t->nvme[0].numa_node == 0);
  CHECK(t->nvme[1].numa_node == 1);
  CHECK(t->total_memory() == 16ull << 30);
}

TEST_CASE("topology: synthetic, this machine, and errors") {
  auto s = make_topology_source("synthetic:pack:2 numa:1 core:2 pu:1")->load();
  REQUIRE(s);
  CHECK(s->nodes.size() == 2);
  CHECK(s->gpus.empty());
  CHECK(s->source == "hwloc:synthetic pack:2 numa:1 core:2 pu:1");
  auto sys = make_topology_source("")->load();
  REQUIRE(sys);
  CHECK(sys->nodes.size() >= 1);
  CHECK(sys->total_memory() > 0);
  auto bad = make_topology_source("synthetic:banana:7")->load();
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == Code::kInvalidArgument);
  CHECK_FALSE(make_topology_source("/nonexistent/topo.xml")->load());
}

TEST_CASE("placement: explicit node, near a GPU, or the client's node") {
  auto t = make_topology_source(kXml)->load();
  REQUIRE(t);
  CHECK(choose_node(*t, Placement::node(1), 0).value() == 1);
  CHECK(choose_node(*t, Placement::node(0), 1).value() == 0);
  CHECK_FALSE(choose_node(*t, Placement::node(2), 0));
  CHECK_FALSE(choose_node(*t, Placement::node(-1), 0));
  CHECK(choose_node(*t, Placement::near_gpu(0), 1).value() == 0);
  CHECK(choose_node(*t, Placement::near_gpu(1), 1).value() == 0);
  CHECK(choose_node(*t, Placement::near_gpu(2), 0).value() == 1);
  CHECK(choose_node(*t, Placement::near_gpu(3), 0).value() == 1);
  auto no_gpu = choose_node(*t, Placement::near_gpu(4), 0);
  REQUIRE_FALSE(no_gpu);
  CHECK(no_gpu.error().message().find("GPU 4") != std::string::npos);
  CHECK(choose_node(*t, Placement::any(), 1).value() == 1);
  CHECK(choose_node(*t, Placement::any(), 0).value() == 0);
  CHECK(choose_node(*t, Placement::any(), -1).value() == 0);  // unknown client node
  CHECK(choose_node(*t, Placement::any(), 7).value() == 0);
  // A GPU not local to one node falls back to the first node.
  Topology u = *t;
  u.gpus[3].numa_node = -1;
  CHECK(choose_node(u, Placement::near_gpu(3), 1).value() == 0);
}
