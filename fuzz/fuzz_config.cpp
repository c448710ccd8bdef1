// fuzz_config: arbitrary text as tierd's TOML configuration.
//
// parse_config is pure and must turn any text into a Config or a Status: no crash, no escaping
// exception, no sanitizer report. A config that parses must survive resolve_sizes against a
// machine size without crashing (it may still be refused).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/config.hpp"
#include "fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto cfg = tier::daemon::parse_config(text);
  if (!cfg) {
    FUZZ_CHECK(!cfg.error().message().empty());
    return 0;
  }
  auto sizes = tier::daemon::resolve_sizes(*cfg, 64ull << 30);
  (void)sizes;
  return 0;
}
