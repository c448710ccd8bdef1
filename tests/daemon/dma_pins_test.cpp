// DmaPins (daemon/tiering/ram/dma_pins.hpp): which parts of a freed extent tierd may punch.
#include "ram/dma_pins.hpp"

#include <catch2/catch.hpp>

using tier::Code;
using tier::daemon::DmaPins;
using Parts = std::vector<std::pair<uint64_t, uint64_t>>;

TEST_CASE("DmaPins: the unpinned parts of an extent, pins widened to pages, per session") {
  DmaPins p;
  CHECK(p.unpinned(1, 0, 8192) == Parts{{0, 8192}});
  // A pin of bytes 100..199 of arena 1 covers their whole page.
  REQUIRE(p.add(7, 1, 100, 100).is_ok());
  CHECK(p.unpinned(1, 0, 12288) == Parts{{4096, 8192}});
  CHECK(p.unpinned(2, 0, 4096) == Parts{{0, 4096}});  // another arena: nothing pinned
  // Overlapping and adjacent pins of two sessions merge for punching.
  REQUIRE(p.add(8, 1, 8192, 8192).is_ok());
  REQUIRE(p.add(7, 1, 12288, 8192).is_ok());
  CHECK(p.unpinned(1, 0, 32768) == Parts{{4096, 4096}, {20480, 12288}});
  CHECK(p.unpinned(1, 9000, 100).empty());  // inside a pin
  // Removing needs the same (widened) range; a session's close drops all of its pins.
  CHECK(p.remove(7, 1, 8192, 4096).code() == Code::kNotFound);
  REQUIRE(p.remove(7, 1, 0, 4096).is_ok());
  p.drop_session(8);
  CHECK(p.unpinned(1, 0, 32768) == Parts{{0, 12288}, {20480, 12288}});
  CHECK(p.size() == 1);
  CHECK(p.pinned_bytes() == 8192);
  CHECK(p.add(7, 1, 0, 0).code() == Code::kInvalidArgument);
  CHECK(p.add(7, 1, UINT64_MAX - 10, 5).code() == Code::kInvalidArgument);
}

TEST_CASE("DmaPins: a uid's pinned bytes are capped over its connections; covered() merges; overlap()") {
  DmaPins p;
  REQUIRE(p.add(1, 100, 1, 0, 8192, 16384).is_ok());
  REQUIRE(p.add(2, 100, 1, 4096, 8192, 16384).is_ok());  // another connection of the same uid
  CHECK(p.uid_bytes(100) == 16384);
  CHECK(p.add(2, 100, 2, 0, 1, 16384).code() == Code::kResourceExhausted);
  CHECK(p.add(3, 200, 2, 0, 8192, 16384).is_ok());  // another uid has its own
  CHECK(p.covered(1) == Parts{{0, 12288}});
  CHECK(p.overlap(1, 8192, 8192) == 4096);
  CHECK(p.overlap(9, 0, 4096) == 0);
  DmaPins::Range gone{};
  REQUIRE(p.remove(1, 1, 0, 8192, &gone).is_ok());
  CHECK(gone == DmaPins::Range{0, 8192});
  CHECK(p.uid_bytes(100) == 8192);
  auto dropped = p.drop_session(2);
  REQUIRE(dropped.size() == 1);
  CHECK(dropped[0].arena == 1);
  CHECK(p.uid_bytes(100) == 0);
  CHECK(p.drop_arena(2).size() == 1);
  CHECK(p.size() == 0);
}
