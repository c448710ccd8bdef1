// trainer/gpu_map.hpp on a synthetic node: CUDA ordinals in another order than PCI order,
// CUDA_VISIBLE_DEVICES subsets, and tierd's hwloc GPU list.
#include "trainer/gpu_map.hpp"

#include <catch2/catch.hpp>

using namespace tier;
using namespace tier::train;

namespace {

// tierd's view of a 4-GPU node, PCI order (what hwloc reports).
const std::vector<TopoDevice> kTierd = {{0, "cuda0", "0000:07:00.0", 0},
                                        {1, "cuda1", "0000:0f:00.0", 0},
                                        {2, "cuda2", "0000:87:00.0", 1},
                                        {3, "cuda3", "0000:8f:00.0", 1}};

// The tierd GPU local rank r ends up next to, as tier-train decides it.
int tierd_gpu_of_rank(int r, const std::vector<std::string>& cuda_pci, bool visible_set) {
  const int dev = cuda_device_for_rank(r, cuda_pci, visible_set);
  return dev < 0 ? -1 : tierd_gpu_index(cuda_pci[static_cast<size_t>(dev)], kTierd);
}

}  // namespace

TEST_CASE("gpu_map: PCI addresses in CUDA's and hwloc's spellings are the same device") {
  CHECK(normalize_pci("00000000:87:00.0") == "0000:87:00.0");
  CHECK(normalize_pci("0000:8F:00.0") == "0000:8f:00.0");
  CHECK(normalize_pci("07:00.0") == "0000:07:00.0");
  CHECK(tierd_gpu_index("00000000:8F:00.0", kTierd) == 3);
  CHECK(tierd_gpu_index("0000:99:00.0", kTierd) == -1);
  CHECK(tierd_gpu_index("", kTierd) == -1);
}

TEST_CASE("gpu_map: without CUDA_VISIBLE_DEVICES ranks follow PCI order whatever CUDA's order") {
  // CUDA enumerated FASTEST_FIRST: ordinal 0 is the GPU at 87:00.0 (tierd's GPU 2).
  const std::vector<std::string> cuda = {"00000000:87:00.0", "00000000:07:00.0", "00000000:8F:00.0",
                                         "00000000:0F:00.0"};
  CHECK(cuda_device_for_rank(0, cuda, false) == 1);
  CHECK(cuda_device_for_rank(1, cuda, false) == 3);
  CHECK(cuda_device_for_rank(2, cuda, false) == 0);
  CHECK(cuda_device_for_rank(3, cuda, false) == 2);
  for (int r = 0; r < 4; ++r) CHECK(tierd_gpu_of_rank(r, cuda, false) == r);
  // More ranks than GPUs share them round robin; the same GPU, the same tierd index.
  CHECK(tierd_gpu_of_rank(5, cuda, false) == 1);
  // The old rule (rank i -> ordinal i -> tierd GPU i) would have put rank 0's shards next to
  // GPU 0 while it computes on tierd's GPU 2, on the other socket.
  CHECK(tierd_gpu_index(cuda[0], kTierd) == 2);
}

TEST_CASE("gpu_map: CUDA_VISIBLE_DEVICES picks the devices and their order; tierd indexes follow") {
  // CUDA_VISIBLE_DEVICES=3,1: CUDA shows two ordinals, 0 = PCI 8f, 1 = PCI 0f.
  const std::vector<std::string> cuda = {"00000000:8F:00.0", "00000000:0F:00.0"};
  CHECK(cuda_device_for_rank(0, cuda, true) == 0);
  CHECK(cuda_device_for_rank(1, cuda, true) == 1);
  CHECK(tierd_gpu_of_rank(0, cuda, true) == 3);
  CHECK(tierd_gpu_of_rank(1, cuda, true) == 1);
  CHECK(tierd_gpu_of_rank(2, cuda, true) == 3);
  // No device: nothing to use.
  CHECK(cuda_device_for_rank(0, {}, true) == -1);
  CHECK(cuda_device_for_rank(0, {}, false) == -1);
}
