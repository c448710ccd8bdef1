// The README's client example: store a tensor in tierd and read it back, zero-copy.
// Build: g++ -std=c++23 client_example.cpp -ltier   Run: TIERD_SOCKET=/run/tierd/tierd.sock ./a.out
#include <tier/client.hpp>

#include <algorithm>
#include <cstdio>

int main() {
  auto client = tier::Client::connect();  // --socket-less: $TIERD_SOCKET, else /run/tierd/tierd.sock
  if (!client) {
    std::fprintf(stderr, "connect: %s\n", client.error().to_string().c_str());
    return 1;
  }
  tier::Client& c = **client;

  auto pool = c.create_pool("example", {.ram_quota = 64ull << 20}, /*exist_ok=*/true);
  if (!pool) return std::fprintf(stderr, "%s\n", pool.error().to_string().c_str()), 1;

  tier::TensorDesc desc;
  desc.name = "weights";
  desc.size = 1 << 20;
  desc.dtype = tier::DType::kF32;
  desc.shape = {512, 512};
  auto tensor = c.create_tensor("example", desc, /*exist_ok=*/true);
  if (!tensor) return std::fprintf(stderr, "%s\n", tensor.error().to_string().c_str()), 1;

  {  // A write lease: the span is the tensor's memory in the daemon's arena.
    auto lease = c.lease(tensor->id, tier::LeaseMode::kWrite);
    if (!lease) return std::fprintf(stderr, "%s\n", lease.error().to_string().c_str()), 1;
    std::ranges::fill(lease->bytes(), std::byte{42});
  }  // released here; the bytes stay in tierd

  auto lease = c.lease(tensor->id, tier::LeaseMode::kRead);
  if (!lease) return std::fprintf(stderr, "%s\n", lease.error().to_string().c_str()), 1;
  bool ok = std::ranges::all_of(lease->bytes(), [](std::byte b) { return b == std::byte{42}; });
  std::printf("%s: %zu bytes read back %s\n", desc.name.c_str(), lease->bytes().size(),
              ok ? "intact" : "CORRUPTED");
  (void)lease->release();
  (void)c.drop_pool("example");
  return ok ? 0 : 1;
}
