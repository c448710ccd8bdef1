// fuzz_generator: arbitrary text as the configuration tierd-generator reads at boot.
//
// The generator must never break boot: any text either fails to parse, or yields a drop-in whose
// every line is `ReadWritePaths="-/..."` with no control character, `\` or unescaped `%`, and
// whose skipped paths are exactly the ones it could not quote.
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/toml_text.hpp"
#include "fuzz/fuzz_check.hpp"
#include "packaging/systemd/generator_paths.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (tier::toml_text::text_problem(text)) return 0;  // the generator does not parse it
  toml::parse_result parsed = toml::parse(text);
  if (!parsed) return 0;
  tierd_generator::DropIn d = tierd_generator::dropin_for(parsed.table());
  size_t lines = 0;
  for (size_t at = 0; at < d.body.size();) {
    size_t end = d.body.find('\n', at);
    FUZZ_CHECK(end != std::string::npos);  // every line is terminated
    std::string_view line(d.body.data() + at, end - at);
    FUZZ_CHECK(line.starts_with("ReadWritePaths=\"-/") && line.ends_with("\""));
    std::string_view inner = line.substr(17, line.size() - 18);  // between -/ ... and the closing "
    for (size_t i = 0; i < inner.size(); ++i) {
      const auto c = static_cast<unsigned char>(inner[i]);
      FUZZ_CHECK(c >= 0x20 && c != 0x7f && c != '\\' && c != '"');
      if (c == '%') {  // specifiers doubled
        FUZZ_CHECK(i + 1 < inner.size() && inner[i + 1] == '%');
        ++i;
      }
    }
    ++lines;
    at = end + 1;
  }
  for (const std::string& s : d.skipped) FUZZ_CHECK(tierd_generator::quote_path(s).empty());
  FUZZ_CHECK(lines + d.skipped.size() == tierd_generator::writable_dirs(parsed.table()).size());
  return 0;
}
