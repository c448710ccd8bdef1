// Running tierctl against a TestDaemon, and the random input files its tests put.
#pragma once

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "tools/run_binary.hpp"

namespace tier::test {

// `tierctl --socket <the daemon's> ARGS...`.
inline RunResult ctl(const TestDaemon& d, std::vector<std::string> args) {
  args.insert(args.begin(), {"--socket", d.socket()});
  return run_binary(bin_path("tierctl"), args);
}

// Writes `n` bytes from a generator seeded with `seed` to `path`; returns them.
inline std::string write_random_file(const std::string& path, size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string data(n, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  std::ofstream(path, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  return data;
}

}  // namespace tier::test
