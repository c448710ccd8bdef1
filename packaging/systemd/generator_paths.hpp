// The pure part of tierd-generator: which directories a configuration makes writable, and the
// drop-in lines for them. Header-only so that the generator stays one dependency-free program;
// fuzz/fuzz_generator.cpp runs it on arbitrary text. Include after <toml++/toml.h> with the
// generator's settings (TOML_HEADER_ONLY=1, TOML_EXCEPTIONS=0).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tierd_generator {

inline constexpr const char* kStateDirectory = "/var/lib/tierd";  // the unit's StateDirectory=tierd

// A path as one quoted word of a unit file (spaces allowed); `%` starts a specifier, so it is
// doubled. Empty when the path cannot be written: relative, or a control character, `\` or `"`
// (whose unescaping differs between systemd versions).
inline std::string quote_path(const std::string& p) {
  if (p.empty() || p.front() != '/') return {};
  std::string q = "\"";
  for (char c : p) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\' || c == '"') return {};
    if (c == '%') q += "%%";
    else q += c;
  }
  return q + "\"";
}

// The directories tierd writes outside its StateDirectory: nvme[].path, and state_dir when set
// elsewhere. Keys of the wrong type are ignored here (tierd refuses them with a message).
inline std::vector<std::string> writable_dirs(const toml::table& cfg) {
  std::vector<std::string> dirs;
  if (const toml::array* nvme = cfg["nvme"].as_array()) {
    for (const toml::node& e : *nvme) {
      const toml::table* t = e.as_table();
      if (!t) continue;
      if (auto p = (*t)["path"].value<std::string>()) dirs.push_back(*p);
    }
  }
  if (auto s = cfg["state_dir"].value<std::string>()) {
    std::filesystem::path sp = std::filesystem::path(*s).lexically_normal();
    std::string norm = sp.string();
    while (norm.size() > 1 && norm.back() == '/') norm.pop_back();
    if (!norm.empty() && norm != kStateDirectory) dirs.push_back(*s);
  }
  return dirs;
}

// The drop-in's lines for `cfg`, one `ReadWritePaths="-DIR"` per writable directory, and the
// directories that could not be expressed (skipped, for a message).
struct DropIn {
  std::string body;
  std::vector<std::string> skipped;
};

inline DropIn dropin_for(const toml::table& cfg) {
  DropIn out;
  for (const std::string& d : writable_dirs(cfg)) {
    std::string q = quote_path(d);
    if (q.empty()) {
      out.skipped.push_back(d);
      continue;
    }
    // The '-' goes inside the quotes: systemd reads the prefix off the unquoted word.
    out.body += "ReadWritePaths=\"-" + q.substr(1) + "\n";
  }
  return out;
}

}  // namespace tierd_generator
