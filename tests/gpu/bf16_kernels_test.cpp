// --precision bf16 on the device: the conversion kernels and the CUDA backend's bf16 upload and
// download give exactly the bits of the host conversions (trainer/bf16.hpp), for ordinary
// values and for every special case (ties, denormals, overflow to inf, NaN). A shard rounded on
// the device or on the host is then the same shard, which is what lets the host path and the
// NCCL pipeline share the tier's bf16 state. Skips visibly without a device.
#include <cuda_runtime_api.h>

#include <bit>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "trainer/bf16.hpp"
#include "trainer/cuda/cuda_backend.hpp"
#include "trainer/cuda/kernels.hpp"

using namespace tier::train;

namespace {

// Every kind of input the rounding must get right, then a sweep of bit patterns.
std::vector<float> conversion_inputs() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.5f,
                          std::bit_cast<float>(0x3f808000u),  // tie, even below: rounds down
                          std::bit_cast<float>(0x3f818000u),  // tie, odd below: rounds up
                          std::bit_cast<float>(0x3f808001u),  // just above a tie
                          std::bit_cast<float>(0x00000001u),  // smallest denormal
                          std::bit_cast<float>(0x807fffffu),  // largest negative denormal
                          std::numeric_limits<float>::max(),  // rounds to +inf
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::bit_cast<float>(0x7fc00001u),   // quiet NaN with payload
                          std::bit_cast<float>(0xff800001u),   // signalling NaN, negative
                          std::bit_cast<float>(0x7f7f8000u)};  // tie at the top of the range
  for (uint32_t u = 0; u < 200000; ++u) v.push_back(std::bit_cast<float>(u * 21475u + 0x1234u));
  return v;
}

std::vector<uint16_t> host_bits(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = bf16_from_f32(x[i]);
  return h;
}

// Bit patterns of floats (NaN == NaN when the bits are equal).
std::vector<uint32_t> bits(const std::vector<float>& x) {
  std::vector<uint32_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = std::bit_cast<uint32_t>(x[i]);
  return b;
}

}  // namespace

TEST_CASE("the device's bf16 conversions give the host's bits", "[gpu][bf16]") {
  if (!tier::test::have_cuda_device()) return;
  const std::vector<float> x = conversion_inputs();
  const size_t n = x.size();
  const std::vector<uint16_t> want = host_bits(x);
  float *dx = nullptr, *dy = nullptr;
  uint16_t* dh = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dx), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dy), n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dh), n * sizeof(uint16_t)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cuda::f32_to_bf16(dh, dx, n, nullptr) == cudaSuccess);
  REQUIRE(cuda::bf16_to_f32(dy, dh, n, nullptr) == cudaSuccess);
  std::vector<uint16_t> got(n);
  std::vector<float> widened(n);
  REQUIRE(cudaMemcpy(got.data(), dh, n * sizeof(uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(widened.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(got == want);
  std::vector<float> host_widened(n);
  bf16_to_f32(want.data(), host_widened.data(), n);
  CHECK(bits(widened) == bits(host_widened));
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dh);
}

TEST_CASE("the CUDA backend's bf16 upload and download give the host's bits", "[gpu][bf16]") {
  if (!tier::test::have_cuda_device()) return;
  std::string err;
  auto be = cuda::make_cuda_backend({.device = 0}, &err);
  INFO(err);
  REQUIRE(be != nullptr);
  const std::vector<float> x = conversion_inputs();
  const std::vector<uint16_t> want = host_bits(x);
  // Twice, the second time larger: the staging buffers grow.
  for (const size_t n : {x.size() / 2, x.size()}) {
    float* d = be->alloc(n);
    REQUIRE(d != nullptr);
    // Upload the host's bf16 values: the device holds them widened, exactly.
    REQUIRE(be->upload_bf16(d, want.data(), n));
    std::vector<float> up(n);
    be->download(up.data(), d, n);
    std::vector<float> host_up(n);
    bf16_to_f32(want.data(), host_up.data(), n);
    CHECK(bits(up) == bits(host_up));
    // Upload fp32 and download bf16: rounded on the device as the host rounds.
    be->upload(d, x.data(), n);
    std::vector<uint16_t> down(n, 0xdead);
    REQUIRE(be->download_bf16(down.data(), d, n));
    CHECK(down == std::vector<uint16_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(n)));
    be->free(d);
  }
  CHECK(cuda::backend_error(*be).empty());
}
