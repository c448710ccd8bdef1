// tierd-generator: a systemd generator (systemd.generator(7)) that makes the directories
// /etc/tierd/tierd.toml names writable for tierd.service under ProtectSystem=strict.
//
//   tierd-generator NORMAL_DIR [EARLY_DIR LATE_DIR]
//
// Reads the configuration and writes NORMAL_DIR/tierd.service.d/50-tierd-paths.conf with one
// `ReadWritePaths=-"DIR"` line per NVMe directory (nvme[].path) and for state_dir when it is
// not the unit's StateDirectory (/var/lib/tierd). systemd runs generators at boot and on every
// `systemctl daemon-reload`, so after editing the configuration: daemon-reload, then restart.
//
// Contract: a generator runs before most of the system is up and must never break boot, so this
// program always exits 0 once it has an output directory. A missing or unreadable configuration
// or a TOML syntax error writes no drop-in, and a key of the wrong type is ignored (tierd reports the
// configuration error when it starts); a path it cannot express (relative, or with a control
// character, `\` or `"`) is skipped with a message on stderr (the journal). The `-` prefix makes
// a directory that does not exist yet no reason for systemd to refuse the unit; tierd then says
// what is wrong.
// Depends on nothing but libc and libstdc++ (toml++ is compiled in, header-only).
//
// TIERD_GENERATOR_CONFIG overrides the configuration path (the tests use it).
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#include <toml++/toml.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/toml_text.hpp"
#include "generator_paths.hpp"

namespace {

constexpr const char* kDefaultConfig = "/etc/tierd/tierd.toml";
constexpr const char* kDropIn = "50-tierd-paths.conf";

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: tierd-generator NORMAL_DIR [EARLY_DIR LATE_DIR]\n");
    return 2;
  }
  const char* env = std::getenv("TIERD_GENERATOR_CONFIG");
  const std::string config = env && *env ? env : kDefaultConfig;

  std::error_code ec;
  if (!std::filesystem::exists(config, ec)) return 0;  // not configured yet: the unit as shipped
  std::ifstream in(config, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // toml++ 3.3.0 has undefined behaviour on some non-ASCII text outside strings: not parsed.
  if (auto bad = tier::toml_text::text_problem(text); bad) {
    std::fprintf(stderr, "tierd-generator: %s: %s; no ReadWritePaths= drop-in written\n", config.c_str(),
                 bad->c_str());
    return 0;
  }
  toml::parse_result parsed = toml::parse(text, config);
  if (!parsed) {
    std::fprintf(stderr, "tierd-generator: %s: %s; no ReadWritePaths= drop-in written\n", config.c_str(),
                 std::string(parsed.error().description()).c_str());
    return 0;
  }

  tierd_generator::DropIn dropin = tierd_generator::dropin_for(parsed.table());
  for (const std::string& d : dropin.skipped)
    std::fprintf(
        stderr,
        "tierd-generator: %s: skipped the path '%s' (not absolute, or a control character, \\ or \")\n",
        config.c_str(), d.c_str());
  const std::string& body = dropin.body;
  if (body.empty()) return 0;

  std::filesystem::path dir = std::filesystem::path(argv[1]) / "tierd.service.d";
  std::filesystem::create_directories(dir, ec);
  std::ofstream out(dir / kDropIn);
  out << "# Written by tierd-generator from " << config << " at boot or daemon-reload:\n"
      << "# tierd's NVMe and state directories, writable under ProtectSystem=strict.\n"
      << "[Service]\n"
      << body;
  out.close();
  if (!out) {
    std::fprintf(stderr, "tierd-generator: cannot write %s/%s\n", dir.c_str(), kDropIn);
    return 0;
  }
  return 0;
}
