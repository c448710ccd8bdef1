// Sizes as people write them on command lines and in tierd.toml, and as tables print them.
// Internal to the project (tierd, tierctl, tier-train): not part of libtier's public API.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tier/status.hpp"

namespace tier {

// Sizes: "4096", "512K", "512M", "64G", "1.5T" (powers of 1024), and "80%" when total is given.
// Returns kInvalidArgument with a message naming the text on anything else.
[[nodiscard]] Result<uint64_t> parse_size(std::string_view text, std::optional<uint64_t> total = {});
// "1.5 GiB", "512 MiB", "12 B".
[[nodiscard]] std::string format_size(uint64_t bytes);

}  // namespace tier
