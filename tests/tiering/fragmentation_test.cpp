// Free RAM in fragments never makes an acknowledged tensor unreadable (issue 33 finding 6): a
// 64 MiB RAM tier over a full 256 MiB NVMe tier, tensors of about 4 MiB with odd sizes. Reading
// them back drops clean copies here and there; what is left in RAM is dirty and cannot be written
// back (NVMe is full), so the free RAM is in pieces smaller than a tensor. tierd compacts the
// pool's arena (moves unleased tensors) to make a range, so every tensor can be leased.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "nvme/test_util.hpp"
#include "support/daemon_fixture.hpp"
#include "support/tier_test_util.hpp"
#include "tier/client.hpp"

using namespace tier;
using namespace tier::test;

namespace {

struct Acked {
  std::string name;
  uint64_t id, hash;
};

// Creates and writes `name` (`size` bytes, seed `seed`); false when it was not acknowledged
// (no room left for it).
bool put(Client& c, const std::string& name, uint64_t size, uint64_t seed, std::vector<Acked>& acked) {
  auto t = c.create_tensor("frag", desc(name, size));
  if (!t) return false;
  auto l = c.lease(t->id, LeaseMode::kWrite, {10000});
  if (!l) return false;
  fill(l->bytes(), seed);
  const uint64_t h = fnv(l->bytes());
  REQUIRE(l->release().is_ok());
  acked.push_back({name, t->id, h});
  return true;
}

}  // namespace

TEST_CASE("every acknowledged tensor stays leasable when free RAM is fragmented", "[tiering][ram]") {
  const tier::nvme::testing::TempDir nvme;
  REQUIRE(!nvme.path().empty());
  TestDaemon d(nvme_opts(nvme.path(), "64M", "nvme_capacity = \"256M\"\n"));
  auto c = connect_to(d);
  REQUIRE(c->create_pool("frag"));
  std::vector<Acked> acked;
  // Tensors of about 4 MiB with odd sizes, most of them soon only on NVMe; then tensors of
  // about 1.5 MiB (packed at 4 KiB in RAM) until the tiers are full: RAM holds them dirty, and
  // NVMe has no room to write them back.
  for (int i = 0; i < 50; ++i)
    REQUIRE(put(*c, "b" + std::to_string(i),
                (4u << 20) - 4096u * static_cast<uint64_t>((i * 37) % 100) - 1237u,
                1000 + static_cast<uint64_t>(i), acked));
  const size_t bigs = acked.size();
  for (int i = 0; i < 400; ++i)
    if (!put(*c, "s" + std::to_string(i), (3u << 19) + 4096u * static_cast<uint64_t>(i % 5) + 333u,
             5000 + static_cast<uint64_t>(i), acked))
      break;
  INFO(acked.size() - bigs << " small tensors acknowledged");
  REQUIRE(acked.size() > bigs + 40);
  // Every other small one in RAM, in address order, goes: the RAM it frees is in pieces
  // smaller than a big one, between dirty tensors NVMe has no room for.
  std::vector<std::pair<const std::byte*, size_t>> in_ram;  // address, index in acked
  for (size_t k = bigs; k < acked.size(); ++k) {
    auto info = c->open_tensor("frag", acked[k].name);
    REQUIRE(info);
    if (!(info->tiers & kTierRam)) continue;
    auto l = c->lease(acked[k].id, LeaseMode::kRead, {10000});
    REQUIRE(l);
    in_ram.emplace_back(l->bytes().data(), k);
    REQUIRE(l->release().is_ok());
  }
  std::sort(in_ram.begin(), in_ram.end());
  std::vector<bool> gone(acked.size(), false);
  for (size_t j = 1; j < in_ram.size(); j += 2) {
    gone[in_ram[j].second] = true;
    REQUIRE(c->delete_tensor("frag", acked[in_ram[j].second].name).is_ok());
  }
  INFO(in_ram.size() << " small tensors in RAM, every other one deleted");
  std::vector<Acked> kept;
  for (size_t k = 0; k < acked.size(); ++k)
    if (!gone[k]) kept.push_back(acked[k]);
  for (int round = 0; round < 2; ++round) {
    size_t unreadable = 0;
    std::string first_error;
    for (const Acked& a : kept) {
      auto l = c->lease(a.id, LeaseMode::kRead, {10000});
      if (!l) {
        if (unreadable++ == 0) first_error = a.name + ": " + l.error().message();
        continue;
      }
      CHECK(fnv(l->bytes()) == a.hash);
      REQUIRE(l->release().is_ok());
    }
    INFO("round " << round << ": " << first_error);
    CHECK(unreadable == 0);
  }
}
