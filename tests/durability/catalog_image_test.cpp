// CatalogImage: the meaning of the records, and compaction preserving the catalog exactly.
#include <catch2/catch.hpp>

#include <random>

#include "journal/catalog_image.hpp"
#include "journal/journal.hpp"
#include "journal_util.hpp"

using namespace tier;
using namespace tier::journal;
using namespace tier::journal::test;

namespace {

// Generates a random but valid stream of catalog changes, applying each to `image`.
class Churn {
 public:
  explicit Churn(uint64_t seed) : rng_(seed) {}

  Record next(const CatalogImage& image) {
    for (;;) {
      auto r = candidate(image);
      if (r) return *r;
    }
  }

 private:
  template <class M> auto pick(const M& m) {
    auto it = m.begin();
    std::advance(it, static_cast<long>(rng_() % m.size()));
    return it;
  }

  std::optional<Record> candidate(const CatalogImage& img) {
    const auto& pools = img.pools();
    switch (rng_() % 12) {
      case 0:
        if (pools.size() < 4) {
          uint64_t id = next_pool_++;
          return PoolCreated{id, "pool" + std::to_string(id), 1000, 1000, 0, 1 << 30, 1ull << 34};
        }
        return std::nullopt;
      case 1:
        if (!pools.empty() && rng_() % 4 == 0) return PoolDropped{pick(pools)->first};
        return std::nullopt;
      case 2:
        if (!pools.empty()) {
          auto p = pick(pools);
          uint64_t a = (p->first << 16) | (rng_() % 2);
          if (p->second.arenas.count(a)) return std::nullopt;
          return ArenaCreated{p->first, a, int32_t(a & 1), "tierd-x-p" + std::to_string(p->first), 1 << 30};
        }
        return std::nullopt;
      case 3:
      case 4:
        if (!pools.empty()) {
          auto p = pick(pools);
          uint64_t t = next_tensor_++;
          return TensorCreated{p->first,
                               t,
                               "t" + std::to_string(t),
                               4096 * (t % 7 + 1),
                               3,
                               {int64_t(t % 5 + 1), 1024},
                               0,
                               p->first << 16,
                               t * 8192,
                               8192};
        }
        return std::nullopt;
      default: {
        if (img.tensor_count() == 0) return std::nullopt;
        auto p = pick(pools);
        if (p->second.tensors.empty()) return std::nullopt;
        auto t = pick(p->second.tensors);
        uint64_t tid = t->first;
        switch (rng_() % 8) {
          case 0: return TensorDeleted{p->first, tid};
          case 6:
            if (t->second.write_lease) return WriteLeaseEnded{tid};
            return WriteLeaseHeld{tid,
                                  (rng_() % 9) << 32 | (tid % 64),
                                  1000,
                                  int32_t(tid % 30000 + 2),
                                  rng_() % 1000000,
                                  4026531836ull};
          case 1: return TensorRamPlaced{tid, 1, (p->first << 16) | 1, tid * 4096, 4096};
          case 2: return TensorRamDropped{tid};
          case 3:
            return NvmeCopyWritten{
                tid, next_gen_++, {Extent{"/nvme", "d" + std::to_string(tid), tid << 20, 4096, rng_()}}};
          case 4:
            if (t->second.nvme) return NvmeCopyDropped{tid, t->second.nvme->generation};
            return std::nullopt;
          case 5: {
            uint64_t s = next_snap_++;
            return SnapshotBegun{p->first, s, "/snap/" + std::to_string(s)};
          }
          default:
            if (p->second.snapshots.empty())
              return Watermarks{next_pool_, next_tensor_ + 64, next_snap_, 1, next_gen_};
            auto s = pick(p->second.snapshots);
            switch (rng_() % 5) {
              case 0: return SnapshotTagged{p->first, s->first, rng_() % 100 + 1};
              case 1: return PoolRecovered{p->first, s->first, rng_() % 4};
              case 2:
                if (s->second.durable) return PoolRestored{p->first, s->first};
                return std::nullopt;
              default:
                if (s->second.durable) return SnapshotDropped{p->first, s->first};
                return SnapshotDurable{p->first, s->first, s->second.path, 1 << 20};
            }
        }
      }
    }
  }

  std::mt19937_64 rng_;
  uint64_t next_pool_ = 1, next_tensor_ = 1, next_snap_ = 1, next_gen_ = 1;
};

}  // namespace

TEST_CASE("records change the catalog image as documented", "[journal][image]") {
  CatalogImage img;
  REQUIRE(img.apply(PoolCreated{1, "job", 1000, 1000, 0, 1 << 30, 0}).is_ok());
  REQUIRE(img.apply(ArenaCreated{1, 65536, 0, "tierd-x-p1-n0", 1 << 30}).is_ok());
  // Again for the same pool's arena: re-created under a new name at a start-up.
  REQUIRE(img.apply(ArenaCreated{1, 65536, 0, "tierd-x-p1-n0-2", 1 << 30}).is_ok());
  CHECK(img.pools().at(1).arenas.at(65536).shm_name == "tierd-x-p1-n0-2");
  REQUIRE(img.apply(TensorCreated{1, 5, "w", 4096, 3, {64, 32}, 0, 65536, 8192, 4096}).is_ok());
  REQUIRE(img.apply(NvmeCopyWritten{5, 3, {Extent{"/nvme", "d", 0, 4096, 9}}}).is_ok());
  REQUIRE(img.apply(TensorRamDropped{5}).is_ok());
  const TensorImage* t = img.tensor(5);
  REQUIRE(t);
  CHECK(t->meta.arena_id == 0);
  CHECK(t->meta.numa_node == -1);
  REQUIRE(t->nvme);
  CHECK(t->nvme->generation == 3);
  REQUIRE(img.apply(TensorRamPlaced{5, 0, 65536, 16384, 4096}).is_ok());
  CHECK(img.tensor(5)->meta.offset == 16384);
  REQUIRE(img.apply(NvmeCopyDropped{5, 2}).is_ok());  // an older generation: no-op
  CHECK(img.tensor(5)->nvme);
  REQUIRE(img.apply(NvmeCopyDropped{5, 3}).is_ok());
  CHECK_FALSE(img.tensor(5)->nvme);
  // A write lease: held, replaced by a reclaim's new id, ended; an end without one is a no-op.
  REQUIRE(img.apply(WriteLeaseHeld{5, 7, 1000, 42, 99, 4026531836ull}).is_ok());
  REQUIRE(img.tensor(5)->write_lease);
  CHECK(img.tensor(5)->write_lease->lease_id == 7);
  REQUIRE(img.apply(WriteLeaseHeld{5, (1ull << 32) | 3, 1000, 42, 99, 4026531836ull}).is_ok());
  CHECK(img.tensor(5)->write_lease->lease_id == ((1ull << 32) | 3));
  REQUIRE(img.apply(WriteLeaseEnded{5}).is_ok());
  CHECK_FALSE(img.tensor(5)->write_lease);
  REQUIRE(img.apply(WriteLeaseEnded{5}).is_ok());
  REQUIRE(img.apply(WriteLeaseHeld{5, 8, 1000, 42, 99, 1}).is_ok());  // emitted by compaction
  REQUIRE(img.apply(SnapshotBegun{1, 2, "/s/2"}).is_ok());
  CHECK_FALSE(img.pools().at(1).snapshots.at(2).durable);
  REQUIRE(img.apply(SnapshotTagged{1, 2, 600}).is_ok());
  // A restore needs a durable snapshot.
  CHECK(img.apply(PoolRestored{1, 2}).code() == Code::kCorruption);
  REQUIRE(img.apply(SnapshotDurable{1, 2, "/s/2", 4096}).is_ok());
  CHECK(img.pools().at(1).snapshots.at(2).durable);
  CHECK(img.pools().at(1).snapshots.at(2).tag == 600);  // the tag outlives SnapshotDurable
  CHECK_FALSE(img.pools().at(1).recovered);
  REQUIRE(img.apply(PoolRecovered{1, 2, 3}).is_ok());
  REQUIRE(img.pools().at(1).recovered);
  CHECK(img.pools().at(1).recovered->lost == 3);
  REQUIRE(img.apply(PoolRestored{1, 2}).is_ok());
  CHECK_FALSE(img.pools().at(1).recovered);
  // Watermarks never fall below one past an id seen.
  REQUIRE(img.apply(Watermarks{1, 1, 1, 1, 1}).is_ok());
  CHECK(img.watermarks().next_pool_id == 2);
  CHECK(img.watermarks().next_tensor_id == 6);
  CHECK(img.watermarks().next_snapshot_id == 3);
  CHECK(img.watermarks().next_arena_id == 65537);
  CHECK(img.watermarks().next_generation == 4);
  REQUIRE(img.apply(Watermarks{10, 100, 1, 1, 1}).is_ok());
  CHECK(img.watermarks().next_tensor_id == 100);
  REQUIRE(img.apply(PoolDropped{1}).is_ok());
  CHECK(img.pools().empty());
  CHECK(img.tensor(5) == nullptr);
  CHECK(img.tensor_count() == 0);
  // Ids stay reserved after the drop.
  CHECK(img.watermarks().next_tensor_id == 100);
}

TEST_CASE("records that contradict the image are corruption and change nothing", "[journal][image]") {
  CatalogImage img;
  REQUIRE(img.apply(PoolCreated{1, "job", 0, 0, 0, 1, 1}).is_ok());
  REQUIRE(img.apply(TensorCreated{1, 5, "w", 4096, 3, {}, 0, 0, 0, 0}).is_ok());
  REQUIRE(img.apply(PoolCreated{2, "two", 0, 0, 0, 1, 1}).is_ok());
  REQUIRE(img.apply(ArenaCreated{2, 7, 0, "a", 1}).is_ok());
  const CatalogImage before = img;
  std::vector<Record> bad = {
      PoolCreated{1, "other", 0, 0, 0, 1, 1},  // id exists
      PoolCreated{2, "job", 0, 0, 0, 1, 1},    // name exists
      PoolDropped{9},
      TensorCreated{9, 6, "x", 1, 0, {}, 0, 0, 0, 0},  // no pool
      TensorCreated{1, 5, "y", 1, 0, {}, 0, 0, 0, 0},  // tensor id exists
      TensorDeleted{2, 5},                             // wrong pool
      TensorRamPlaced{6, 0, 1, 0, 0},
      TensorRamDropped{6},
      NvmeCopyWritten{6, 1, {}},
      NvmeCopyDropped{6, 1},
      WriteLeaseHeld{6, 1, 0, 1, 1, 1},
      WriteLeaseEnded{6},
      ArenaCreated{9, 1, 0, "n", 1},
      ArenaCreated{1, 7, 0, "b", 1},  // another pool's arena id
      SnapshotBegun{9, 1, "p"},
      SnapshotDropped{1, 1},
      SnapshotTagged{1, 1, 5},  // no such snapshot
      SnapshotTagged{9, 1, 5},
      PoolRecovered{9, 0, 0},
      PoolRestored{1, 1},
      ManifestBegin{1, 1, 1},
      ManifestEnd{0, 0},
  };
  for (const Record& r : bad) {
    INFO(record_type_name(record_type(r)));
    Status st = img.apply(r);
    CHECK(st.code() == Code::kCorruption);
    CHECK(st.message().find(record_type_name(record_type(r))) != std::string::npos);
    CHECK(img == before);
  }
}

TEST_CASE("a journal that contradicts itself is refused at open", "[journal][image]") {
  TempDir dir;
  {
    auto j = Journal::open(dir.path(), {}, {});
    REQUIRE(j.has_value());
    REQUIRE((*j)->append(PoolCreated{1, "job", 0, 0, 0, 1, 1}).has_value());
    REQUIRE((*j)->append(TensorDeleted{1, 77}).has_value());
  }
  CatalogImage img;
  auto j = Journal::open(dir.path(), {}, img.replayer());
  REQUIRE_FALSE(j.has_value());
  CHECK(j.error().code() == Code::kCorruption);
  CHECK(j.error().message().find("seq 2") != std::string::npos);
}

TEST_CASE("compaction preserves the catalog exactly, across many rounds and reopens",
          "[journal][image][compaction]") {
  TempDir dir;
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  Churn churn(seed);
  CatalogImage truth;
  JournalOptions opts{.fsync = FsyncPolicy::kNever, .compact_ratio = 2.0, .compact_min_bytes = 16 << 10};
  int compactions = 0;
  uint64_t records = 0;
  for (int round = 0; round < 6; ++round) {
    CatalogImage replayed;
    auto j = Journal::open(dir.path(), opts, replayed.replayer());
    REQUIRE(j.has_value());
    REQUIRE(replayed == truth);
    for (int i = 0; i < 600; ++i) {
      Record r = churn.next(truth);
      REQUIRE(truth.apply(r).is_ok());
      REQUIRE((*j)->append(r).has_value());
      ++records;
      if ((*j)->compaction_due()) {
        REQUIRE((*j)->compact([&](const Journal::Emit& e) { return truth.emit_live(e); }).is_ok());
        ++compactions;
      }
    }
  }
  CatalogImage last;
  auto j = Journal::open(dir.path(), opts, last.replayer());
  REQUIRE(j.has_value());
  CHECK(last == truth);
  // A final compaction from the replayed image gives the same image again.
  REQUIRE((*j)->compact([&](const Journal::Emit& e) { return last.emit_live(e); }).is_ok());
  j->reset();
  CatalogImage again;
  REQUIRE(Journal::open(dir.path(), opts, again.replayer()).has_value());
  CHECK(again == truth);
  CHECK(compactions > 0);
  WARN(records << " records, " << compactions << " compactions, " << truth.pools().size() << " pools and "
               << truth.tensor_count() << " tensors live at the end");
}
