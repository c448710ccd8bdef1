// Helpers of the snapshot tests (snapshot_test.cpp, snapshot_restore_test.cpp): a simulated
// reboot, tensors written with a per-version pattern, and their hashes. Catch2 assertions.
#pragma once

#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

namespace tier::test::snap {

namespace fs = std::filesystem;

// A new boot as far as tierd can tell: new IPC namespace, new /dev/shm (empty tmpfs).
inline void fresh_boot() {
  REQUIRE(::unshare(CLONE_NEWIPC | CLONE_NEWNS) == 0);
  REQUIRE(::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0);
  REQUIRE(::mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=4g,mode=1777") == 0);
}

inline std::unique_ptr<Client> connect_to(const TestDaemon& d) {
  auto c = Client::connect(d.socket(), {.client_name = "snapshot-test",
                                        .connect_timeout = std::chrono::seconds(5),
                                        .reconnect_timeout = std::chrono::milliseconds(0)});
  REQUIRE(c.has_value());
  return std::move(*c);
}

// Version `v` of tensor `name`: a cheap pattern that differs per name and version.
inline uint64_t fill(std::span<std::byte> b, const std::string& name, int v) {
  uint64_t seed = std::hash<std::string>{}(name) * 31 + static_cast<uint64_t>(v);
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t x = seed ^ (i * 0x9E3779B97F4A7C15ull);
    std::memcpy(b.data() + i, &x, std::min<size_t>(8, b.size() - i));
  }
  return XXH3_64bits(b.data(), b.size());
}

inline uint64_t write_version(Client& c, uint64_t id, const std::string& name, int v,
                              int32_t timeout_ms = 10000) {
  auto l = c.lease(id, LeaseMode::kWrite, {.timeout_ms = timeout_ms});
  REQUIRE(l.has_value());
  uint64_t h = fill(l->bytes(), name, v);
  REQUIRE(l->release().is_ok());
  return h;
}

inline uint64_t put(Client& c, const std::string& pool, const std::string& name, size_t size, int v) {
  TensorDesc d;
  d.name = name;
  d.size = size;
  auto t = c.create_tensor(pool, d);
  REQUIRE(t.has_value());
  return write_version(c, t->id, name, v);
}

inline std::optional<uint64_t> read_hash(Client& c, const std::string& pool, const std::string& name) {
  auto t = c.open_tensor(pool, name);
  if (!t) return std::nullopt;
  auto l = c.lease(t->id, LeaseMode::kRead, {.timeout_ms = 10000});
  if (!l) return std::nullopt;
  return XXH3_64bits(l->bytes().data(), l->bytes().size());
}

// An NVMe tier directory, removed when it goes out of scope (also when a REQUIRE fails).
struct TempDir {
  std::string path;
  explicit TempDir(const char* tag)
      : path(fs::temp_directory_path().string() + "/tierd-snap-" + tag + "-" + std::to_string(::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A tierd with `ram` and an NVMe tier in `nvme`.
inline DaemonOptions with_nvme(const TempDir& nvme, std::string ram) {
  DaemonOptions o;
  o.ram = std::move(ram);
  o.extra_args = {"--nvme-dir", nvme.path};
  return o;
}

}  // namespace tier::test::snap
