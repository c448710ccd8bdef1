// Helpers shared by the integration tests that drive a real tierd through libtier: a temporary
// directory, the options of a daemon with an NVMe tier, a connected Client, tensor descriptions,
// a content hash, writing and hashing a tensor under a lease, and corrupting an NVMe byte. Header-only; for
// Catch2 test sources (REQUIRE on setup failures).
#pragma once

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

namespace tier::test {

// A temporary directory under `base`, removed with its contents at scope exit.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& base = "/tmp") {
    std::string t = base + "/tier-test-XXXXXX";
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// A daemon with the NVMe directory `nvme` and `ram` of RAM tier; `config` is extra TOML (the
// fixture writes it into its own directory).
inline DaemonOptions nvme_opts(const std::string& nvme, const std::string& ram,
                               const std::string& config = "") {
  DaemonOptions o;
  o.ram = ram;
  o.extra_args = {"--remove-arenas-on-exit", "--nvme-dir", nvme};
  o.config = config;
  return o;
}

inline std::unique_ptr<Client> connect_to(const TestDaemon& d, const std::string& name = "tier-test") {
  auto c = Client::connect(d.socket(), {.client_name = name, .connect_timeout = std::chrono::seconds(5)});
  REQUIRE(c.has_value());
  return std::move(*c);
}

inline TensorDesc desc(std::string name, uint64_t size) {
  TensorDesc d;
  d.name = std::move(name);
  d.size = size;
  return d;
}

// FNV-1a of the bytes: compares tensor contents.
inline uint64_t fnv(std::span<const std::byte> b) {
  uint64_t h = 1469598103934665603ull;
  for (std::byte x : b) h = (h ^ static_cast<uint8_t>(x)) * 1099511628211ull;
  return h;
}

// Fills `b` with the bytes of a generator seeded with `seed`.
inline void fill(std::span<std::byte> b, uint64_t seed) {
  std::mt19937_64 g(seed);
  size_t i = 0;
  for (; i + 8 <= b.size(); i += 8) {
    uint64_t v = g();
    std::memcpy(b.data() + i, &v, 8);
  }
  for (; i < b.size(); ++i) b[i] = static_cast<std::byte>(g());
}

// Writes `seed`'s bytes into the tensor; returns their hash.
inline uint64_t write_tensor(Client& c, uint64_t id, uint64_t seed) {
  auto l = c.lease(id, LeaseMode::kWrite, {LeaseWait::kForever});
  REQUIRE(l);
  fill(l->bytes(), seed);
  uint64_t h = fnv(l->bytes());
  REQUIRE(l->release().is_ok());
  return h;
}

// The hash of the tensor's bytes under a read lease.
inline uint64_t read_hash(Client& c, uint64_t id) {
  auto l = c.lease(id, LeaseMode::kRead, {LeaseWait::kForever});
  REQUIRE(l);
  uint64_t h = fnv(l->bytes());
  REQUIRE(l->release().is_ok());
  return h;
}

// Creates tensors "t0", "t1", ... of `size` bytes in `pool` and writes each (seeds `seed`,
// `seed` + 1, ...) until a create is refused or `max` exist; their ids and hashes are appended.
// Returns the refusal (ok when all `max` were made).
inline Status fill_until_refused(Client& c, const std::string& pool, int max, uint64_t size, uint64_t seed,
                                 std::vector<uint64_t>& ids, std::vector<uint64_t>& hashes) {
  for (int i = 0; i < max; ++i) {
    auto t = c.create_tensor(pool, desc("t" + std::to_string(i), size));
    if (!t) return t.error();
    ids.push_back(t->id);
    hashes.push_back(write_tensor(c, t->id, seed + static_cast<uint64_t>(i)));
  }
  return Status::ok();
}

// Flips one bit of the byte at `offset` of `file` (an NVMe data file) and syncs it: corruption
// the next checksum check must catch.
inline void flip_byte(const std::string& file, off_t offset) {
  int fd = ::open(file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  unsigned char x = 0;
  REQUIRE(::pread(fd, &x, 1, offset) == 1);
  x ^= 0x40;
  REQUIRE(::pwrite(fd, &x, 1, offset) == 1);
  ::fsync(fd);
  ::close(fd);
}

}  // namespace tier::test
