#include "tier/types.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tier {

namespace {
struct DTypeRow {
  DType d;
  std::string_view name;
  size_t bytes;
};
constexpr std::array<DTypeRow, 9> kDTypes{{
    {DType::kBytes, "bytes", 1},
    {DType::kF32, "f32", 4},
    {DType::kF16, "f16", 2},
    {DType::kBF16, "bf16", 2},
    {DType::kF64, "f64", 8},
    {DType::kI32, "i32", 4},
    {DType::kI64, "i64", 8},
    {DType::kU8, "u8", 1},
    {DType::kI8, "i8", 1},
}};
}  // namespace

std::string_view dtype_name(DType d) noexcept {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.name;
  return "unknown";
}

std::optional<DType> dtype_from_name(std::string_view s) noexcept {
  for (const auto& r : kDTypes)
    if (r.name == s) return r.d;
  return std::nullopt;
}

size_t dtype_size(DType d) noexcept {
  for (const auto& r : kDTypes)
    if (r.d == d) return r.bytes;
  return 1;
}

}  // namespace tier
