// Admission against a real tierd: creates that could never be leased are refused up front (with
// and without the NVMe tier, any u64 size), a failed `tierctl put` leaves nothing behind, a full
// NVMe tier is named as such and leasing recovers as soon as NVMe space is freed, a put replaces
// a tensor whose NVMe copy is corrupt, names with control characters are refused, and the
// configuration checks refuse what the start would (duplicate NVMe dirs, long socket paths).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "support/daemon_fixture.hpp"
#include "support/raw_client.hpp"
#include "support/tier_test_util.hpp"
#include "tier/client.hpp"
#include "tools/tierctl_run.hpp"

using namespace tier;
using namespace tier::test;
namespace fs = std::filesystem;

namespace {

DaemonOptions ram_only() {
  DaemonOptions o;
  o.extra_args = {"--remove-arenas-on-exit"};
  return o;
}

// A sparse file of `n` bytes (reads as zeros, takes no disk).
void sparse_file(const std::string& path, uint64_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(n)) == 0);
  ::close(fd);
}

// `tierd ARGS --check-config` (or a real start without it); exit code and output.
RunResult tierd(const std::vector<std::string>& args) { return run_binary(bin_path("tierd"), args, {}, 30); }

// Checks the refusal of an oversize create in pool "p" that already holds tensor "small".
void check_oversize_refused(const TestDaemon& d, Client& c, uint64_t small_id, uint64_t small_hash) {
  auto big = c.create_tensor("p", desc("big", 300ull << 20));
  REQUIRE_FALSE(big);
  CHECK(big.error().code() == Code::kResourceExhausted);
  CHECK_THAT(big.error().message(), Catch::Contains("can never be leased") && Catch::Contains("RAM quota"));
  // Through the raw protocol, sizes near 2^64 get the same refusal, no overflow.
  auto raw = RawClient::connect(d.socket());
  REQUIRE(raw);
  for (uint64_t size : {uint64_t{1} << 63, ~uint64_t{0}, ~uint64_t{0} - 4095}) {
    INFO("size " << size);
    auto t = raw->tensor_create("p", "huge", size);
    REQUIRE_FALSE(t);
    CHECK(t.error().code() == Code::kResourceExhausted);
    CHECK_THAT(t.error().message(), Catch::Contains("can never be leased"));
  }
  // Nothing was created and nothing evicted to make room for it.
  auto list = c.list_tensors("p");
  REQUIRE(list);
  REQUIRE(list->size() == 1);
  CHECK((*list)[0].id == small_id);
  CHECK(((*list)[0].tiers & kTierRam) != 0);
  auto l = c.lease(small_id, LeaseMode::kRead, {LeaseWait::kForever});
  REQUIRE(l);
  CHECK(fnv(l->bytes()) == small_hash);
}

// `s` with every byte outside printable ASCII as \xNN, for test output.
std::string escaped(const std::string& s) {
  std::string o;
  char buf[8];
  for (unsigned char ch : s) {
    if (ch >= 0x20 && ch < 0x7f) o += static_cast<char>(ch);
    else {
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      o += buf;
    }
  }
  return o;
}

}  // namespace

TEST_CASE("a tensor larger than its pool's RAM quota is refused at create, with the NVMe tier") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "256M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));  // quota: the whole 256 MiB RAM tier
  auto small = c->create_tensor("p", desc("small", 1 << 20));
  REQUIRE(small);
  uint64_t h = write_tensor(*c, small->id, 1);
  check_oversize_refused(d, *c, small->id, h);
  // Also refused: one that fits RAM but not the pool's NVMe quota, where eviction puts it.
  PoolOptions po;
  po.nvme_quota = 64ull << 20;
  REQUIRE(c->create_pool("q", po));
  auto t = c->create_tensor("q", desc("t", 100ull << 20));
  REQUIRE_FALSE(t);
  CHECK(t.error().code() == Code::kResourceExhausted);
  CHECK_THAT(t.error().message(), Catch::Contains("NVMe quota"));
  CHECK(c->create_tensor("q", desc("fits", 64ull << 20)));
}

TEST_CASE("a tensor larger than its pool's RAM quota is refused at create on a RAM-only daemon") {
  TestDaemon d(ram_only());
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  auto small = c->create_tensor("p", desc("small", 1 << 20));
  REQUIRE(small);
  uint64_t h = write_tensor(*c, small->id, 2);
  check_oversize_refused(d, *c, small->id, h);
}

TEST_CASE("a failed tierctl put leaves neither the tensor nor the pool it created") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "256M"));
  std::string big = d.dir() + "/big.bin";
  sparse_file(big, 300ull << 20);
  // Into an existing 256 MiB pool: refused, and no tensor is left behind.
  std::string in = d.dir() + "/in.bin";
  write_random_file(in, 4096, 1);
  REQUIRE(ctl(d, {"put", "job", "small", in}).rc == 0);  // creates the pool
  REQUIRE(ctl(d, {"put", "job", "small", in}).rc == 0);  // into the existing pool and tensor
  {
    // Finding out whether the pool exists costs no error answer, in either case.
    auto st = connect_to(d)->status();
    REQUIRE(st);
    CHECK(st->errors == 0);
  }
  auto put = ctl(d, {"put", "job", "big", big});
  CHECK(put.rc == 1);
  CHECK_THAT(put.err, Catch::Contains("can never be leased"));
  auto tensors = ctl(d, {"tensors", "job"});
  REQUIRE(tensors.rc == 0);
  CHECK(tensors.out.find("small") != std::string::npos);
  CHECK(tensors.out.find("big") == std::string::npos);
  // Into a pool the put creates: the pool goes too.
  write_random_file(in + ".2", 2 << 20, 2);
  auto put2 = ctl(d, {"put", "--ram-quota", "1M", "fresh", "t", in + ".2"});
  CHECK(put2.rc == 1);
  auto pools = ctl(d, {"pools"});
  REQUIRE(pools.rc == 0);
  CHECK(pools.out.find("job") != std::string::npos);
  CHECK(pools.out.find("fresh") == std::string::npos);
}

TEST_CASE("a full NVMe tier is named in lease errors, and leasing recovers as soon as space is freed") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "4M", "nvme_capacity = \"1M\"\n"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("f"));
  std::vector<uint64_t> ids, hashes;
  REQUIRE_FALSE(fill_until_refused(*c, "f", 12, 512u << 10, 300, ids, hashes).is_ok());
  // The tensors only on NVMe (it holds two of 512 KiB); every other one is dirty in RAM.
  std::vector<size_t> on_nvme;
  for (size_t k = 0; k < ids.size(); ++k) {
    auto t = c->open_tensor("f", "t" + std::to_string(k));
    REQUIRE(t);
    if (t->tiers == kTierNvme) on_nvme.push_back(k);
  }
  REQUIRE(on_nvme.size() == 2);
  const size_t want = on_nvme[0], gone = on_nvme[1];
  // Leasing one needs RAM, which needs a victim written back, which needs NVMe space.
  auto l = c->lease(ids[want], LeaseMode::kRead, {LeaseWait::kForever});
  REQUIRE_FALSE(l);
  CHECK(l.error().code() == Code::kResourceExhausted);
  CHECK_THAT(l.error().message(), Catch::Contains("NVMe tier full") && Catch::Contains("needed"));
  CHECK_THAT(l.error().message(), !Catch::Contains("leased or pinned"));
  // Free NVMe space: the very next lease succeeds, with the tensor's bytes.
  REQUIRE(c->delete_tensor("f", "t" + std::to_string(gone)).is_ok());
  auto l2 = c->lease(ids[want], LeaseMode::kRead, {LeaseWait::kForever});
  INFO((l2 ? std::string("granted") : l2.error().message()));
  REQUIRE(l2);
  CHECK(fnv(l2->bytes()) == hashes[want]);
}

TEST_CASE("tierctl put replaces a tensor whose NVMe copy is corrupt") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  std::string in = d.dir() + "/in.bin", out = d.dir() + "/out.bin";
  write_random_file(in, 256 << 10, 1);
  REQUIRE(ctl(d, {"put", "p", "t", in}).rc == 0);
  REQUIRE(ctl(d, {"evict", "p", "t"}).rc == 0);  // its only copy: at offset 0 of file 0
  flip_byte(nvme.path + "/data-000000.tier", 1000);
  auto get = ctl(d, {"get", "p", "t", out});
  REQUIRE(get.rc == 1);
  CHECK_THAT(get.err, Catch::Contains("checksum"));
  // The new bytes replace the corrupt copy without it being read.
  std::string data = write_random_file(in, 256 << 10, 2);
  auto put = ctl(d, {"put", "p", "t", in});
  INFO(put.err);
  REQUIRE(put.rc == 0);
  REQUIRE(ctl(d, {"get", "p", "t", out}).rc == 0);
  CHECK(read_text(out) == data);
  // And they survive an eviction and a fetch.
  REQUIRE(ctl(d, {"evict", "p", "t"}).rc == 0);
  REQUIRE(ctl(d, {"get", "p", "t", out}).rc == 0);
  CHECK(read_text(out) == data);
}

TEST_CASE(
    "an overwrite lease waiting for a conflict reads nothing, so a corrupt NVMe copy does not fail it") {
  TempDir nvme;
  TestDaemon d(nvme_opts(nvme.path, "64M"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("p"));
  auto a = c->create_tensor("p", desc("a", 256 << 10));
  auto b = c->create_tensor("p", desc("b", 256 << 10));
  REQUIRE(a);
  REQUIRE(b);
  write_tensor(*c, a->id, 1);
  write_tensor(*c, b->id, 2);
  uint64_t ida = a->id;
  REQUIRE(c->evict("p", {&ida, 1}).is_ok());  // a's only copy: at offset 0 of file 0
  flip_byte(nvme.path + "/data-000000.tier", 1000);
  const std::vector<uint64_t> both = {a->id, b->id};
  {
    auto held = c->lease(b->id, LeaseMode::kRead);  // the conflict
    REQUIRE(held);
    auto w = c->lease_batch(both, LeaseMode::kOverwrite, {300});
    REQUIRE_FALSE(w);
    CHECK(w.error().code() == Code::kTimeout);  // waited for the conflict, never read a
  }
  auto w = c->lease_batch(both, LeaseMode::kOverwrite, {LeaseWait::kForever});
  REQUIRE(w);
  for (auto& l : *w) fill(l.bytes(), l.tensor_id());
  const uint64_t ha = fnv((*w)[0].bytes());
  REQUIRE(c->release_batch(*w).is_ok());
  REQUIRE(c->evict("p", {&ida, 1}).is_ok());
  CHECK(read_hash(*c, a->id) == ha);
}

TEST_CASE("tensor and pool names with control characters or malformed UTF-8 are refused by the daemon") {
  TestDaemon d(ram_only());
  auto raw = RawClient::connect(d.socket());
  REQUIRE(raw);
  REQUIRE(raw->pool_create("p"));
  for (std::string name :
       {std::string("a\nb"), std::string("\x1b[31mred"), std::string("del\x7f"), std::string("tab\there"),
        std::string("c1\xc2\x85nel"), std::string("bad\xff"), std::string("overlong\xc0\xaf"),
        std::string("trunc\xe6\x97"), std::string("surrogate\xed\xa0\x80")}) {
    INFO("name " << escaped(name));
    auto t = raw->tensor_create("p", name, 4096);
    REQUIRE_FALSE(t);
    CHECK(t.error().code() == Code::kInvalidArgument);
    CHECK_THAT(t.error().message(), Catch::Contains("printable"));
    auto pl = raw->pool_create(name);
    REQUIRE_FALSE(pl);
    CHECK(pl.error().code() == Code::kInvalidArgument);
  }
  // Printable UTF-8 beyond ASCII, spaces and punctuation stay valid.
  CHECK(raw->tensor_create("p", "layer 0: w\xc3\xbc \xe5\x90\x8d\xf0\x9f\x98\x80", 4096));
  CHECK(raw->tensor_create("p", "nbsp\xc2\xa0ok", 4096));
}

TEST_CASE("an NVMe directory listed twice, or two on one file system, is refused") {
  TempDir dir;
  const std::string a = dir.path + "/a", b = dir.path + "/b", link = dir.path + "/link";
  fs::create_directories(a);
  fs::create_directories(b);
  fs::create_directory_symlink(a, link);
  const std::vector<std::string> base = {
      "--state-dir", dir.path + "/state", "--socket", dir.path + "/s", "--ram", "64M"};
  auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return tierd(args);
  };
  auto ok = run({"--nvme-dir", a, "--check-config"});
  INFO(ok.err);
  REQUIRE(ok.rc == 0);
  for (auto pair : {std::pair{a, a}, std::pair{a, a + "/"}, std::pair{a, link}}) {
    INFO(pair.first << " and " << pair.second);
    auto r = run({"--nvme-dir", pair.first, "--nvme-dir", pair.second, "--check-config"});
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains("listed twice"));
  }
  auto same_fs = run({"--nvme-dir", a, "--nvme-dir", b, "--check-config"});
  CHECK(same_fs.rc == 2);
  CHECK_THAT(same_fs.err, Catch::Contains("same file system"));
  // The TOML list, and a real start (not only --check-config).
  std::ofstream(dir.path + "/t.toml")
      << "nvme = [ { path = \"" << a << "\" }, { path = \"" << a << "\" } ]\n";
  auto toml = run({"--config", dir.path + "/t.toml", "--check-config"});
  CHECK(toml.rc == 2);
  CHECK_THAT(toml.err, Catch::Contains("listed twice"));
  std::ofstream(dir.path + "/u.toml")
      << "nvme = [ { path = \"" << a << "\" }, { path = \"" << link << "\" } ]\n";
  auto start = run({"--config", dir.path + "/u.toml", "--remove-arenas-on-exit"});
  CHECK(start.rc == 2);
  CHECK_THAT(start.err, Catch::Contains("listed twice"));
}

TEST_CASE("check-config refuses a socket path longer than a Unix socket address holds") {
  TempDir dir;
  const std::string sock = dir.path + "/" + std::string(120, 's') + ".sock";
  auto r = tierd({"--state-dir", dir.path + "/state", "--socket", sock, "--ram", "64M", "--check-config"});
  CHECK(r.rc == 2);
  CHECK_THAT(r.err, Catch::Contains("at most 107"));
  const std::string fits = dir.path + "/ok.sock";
  CHECK(tierd({"--state-dir", dir.path + "/state", "--socket", fits, "--ram", "64M", "--check-config"}).rc ==
        0);
}
