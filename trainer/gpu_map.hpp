// Which GPU a local rank drives, and which of tierd's GPUs that is: decided by PCI address.
// Pure functions (no CUDA): the CUDA backend feeds them cudaDeviceGetPCIBusId of each visible
// device, the tier state feeds them the GPUs tierd reports (hwloc's PCI devices).
//
// Why: CUDA numbers devices FASTEST_FIRST unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and renumbers
// them under CUDA_VISIBLE_DEVICES, while tierd lists GPUs in PCI order. "Local rank i uses CUDA
// device i and tierd's GPU i" then puts a rank's shards next to another GPU's socket.
#pragma once

#include <algorithm>
#include <cctype>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/client.hpp"

namespace tier::train {

// A PCI address in one spelling: lower case, a 4-hex-digit domain ("0000:07:00.0"), from
// CUDA's "00000000:07:00.0" or hwloc's "0000:07:00.0". A string without a domain gets "0000:".
inline std::string normalize_pci(std::string_view id) {
  std::string s(id);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t colons = static_cast<size_t>(std::count(s.begin(), s.end(), ':'));
  if (colons == 1) s = "0000:" + s;
  if (const size_t c = s.find(':'); c != std::string::npos && c > 4) s.erase(0, c - 4);
  return s;
}

// The CUDA ordinal local rank `local_rank` uses, given the PCI bus id of each ordinal CUDA
// exposes (`cuda_pci[i]` for ordinal i, CUDA_VISIBLE_DEVICES already applied by CUDA).
// With CUDA_VISIBLE_DEVICES set (`visible_devices_set`) the user chose the devices and their
// order: rank r takes ordinal r mod n. Without it, rank r takes the (r mod n)-th device in PCI
// address order, whatever order CUDA enumerates them in. -1 when there is no device.
inline int cuda_device_for_rank(int local_rank, std::span<const std::string> cuda_pci,
                                bool visible_devices_set) {
  const int n = static_cast<int>(cuda_pci.size());
  if (n == 0 || local_rank < 0) return -1;
  const int slot = local_rank % n;
  if (visible_devices_set) return slot;
  std::vector<int> by_pci(static_cast<size_t>(n));
  std::iota(by_pci.begin(), by_pci.end(), 0);
  // Equal addresses keep CUDA's order: ties compare the ordinals (a plain sort, so no
  // temporary buffer).
  std::ranges::sort(by_pci, [&](int a, int b) {
    const std::string pa = normalize_pci(cuda_pci[static_cast<size_t>(a)]);
    const std::string pb = normalize_pci(cuda_pci[static_cast<size_t>(b)]);
    return pa != pb ? pa < pb : a < b;
  });
  return by_pci[static_cast<size_t>(slot)];
}

// tierd's index (TopoDevice::index, the Placement::near_gpu argument) of the GPU at PCI
// address `pci`; -1 when tierd does not list it (or `pci` is empty).
inline int tierd_gpu_index(std::string_view pci, std::span<const TopoDevice> gpus) {
  if (pci.empty()) return -1;
  const std::string want = normalize_pci(pci);
  for (const TopoDevice& g : gpus)
    if (!g.pci.empty() && normalize_pci(g.pci) == want) return g.index;
  return -1;
}

}  // namespace tier::train
