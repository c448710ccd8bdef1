// The request handler in memory: every malformed input is answered or closes, never crashes;
// authorization; lease waits answered through the deferred sink.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <random>

#include "ram/arena.hpp"
#include "rpc/request_handler.hpp"
#include "support/handler_harness.hpp"

using namespace tier;
using namespace tier::daemon;
using namespace tier::wire;

namespace {

// The daemon's handler on a synthetic two-node topology with a 256 MiB RAM tier.
struct Harness : tier::test::HandlerHarness {
  Harness() : HandlerHarness(config(), ResolvedSizes{256ull << 20, 64ull << 20, 2ull << 20}) {}
  static Config config() {
    Config cfg;
    cfg.topology = "synthetic:pack:2 numa:1 core:1 pu:1";
    cfg.max_leases_per_client = 64;
    return cfg;
  }
};

Code code_of(const Reply& r) {
  auto b = decode_reply<Empty>(payload_of(r.bytes));
  return b ? Code::kOk : b.error().code();
}

}  // namespace

TEST_CASE("handler: malformed datagrams are answered or close, never crash") {
  Harness h;
  auto s = h.session();
  std::vector<std::byte> good;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kStatus), 5, Empty{}, good));

  SECTION("empty and short") {
    CHECK(h.raw(*s, {}).close);
    CHECK(h.raw(*s, std::span(good).first(7)).close);
  }
  SECTION("bad magic") {
    auto b = good;
    b[0] = std::byte{0};
    Reply r = h.raw(*s, b);
    CHECK(r.close);
    CHECK(r.bytes.empty());
  }
  SECTION("payload length mismatch") {
    auto b = good;
    b.push_back(std::byte{0});
    Reply r = h.raw(*s, b);
    CHECK(r.close);
    CHECK(code_of(r) == Code::kProtocol);
  }
  SECTION("unknown type and replies from the client") {
    auto b = good;
    b[6] = std::byte{77};
    CHECK(h.raw(*s, b).close);
    auto c = good;
    c[7] = std::byte{0x80};
    Reply r = h.raw(*s, c);
    CHECK(r.close);
    CHECK(code_of(r) == Code::kProtocol);
  }
  SECTION("a body that does not decode keeps the connection") {
    std::vector<std::byte> b;
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kPoolCreate), 1, uint32_t{5000}, b));
    Reply r = h.raw(*s, b);
    CHECK_FALSE(r.close);
    CHECK(code_of(r) == Code::kProtocol);
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kStatus), 1, uint8_t{1}, b));  // trailing byte
    r = h.raw(*s, b);
    CHECK(code_of(r) == Code::kProtocol);
    // A vector count far beyond the bytes present.
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kLease), 1, LeaseReq{1, 0, {}}, b));
    uint32_t huge = 0x7fffffff;
    std::memcpy(b.data() + kHeaderBytes + 5, &huge, 4);
    r = h.raw(*s, b);
    CHECK(code_of(r) == Code::kProtocol);
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kRelease), 1, uint32_t{3}, b));
    r = h.raw(*s, b);
    CHECK(code_of(r) == Code::kProtocol);
  }
  SECTION("Hello first, and of this version") {
    auto fresh = h.session(0, false);
    Reply r = h.raw(*fresh, good);
    CHECK(r.close);
    CHECK(code_of(r) == Code::kProtocol);
    auto old = h.call<HelloRep>(*fresh, MsgType::kHello, HelloReq{9, 1, -1, "x"});
    REQUIRE_FALSE(old);
    CHECK(old.error().code() == Code::kProtocol);
  }
  SECTION("random mutations of valid requests") {
    std::vector<std::vector<std::byte>> seeds;
    std::vector<std::byte> b;
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kPoolCreate), 1, PoolCreateReq{"p", 1 << 20, 0, true}, b));
    seeds.push_back(b);
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kTensorCreate), 2,
                   TensorCreateReq{"p", "t", 4096, 1, {2, 3}, 2, 0, true}, b));
    seeds.push_back(b);
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kLease), 3, LeaseReq{2, 0, {1, 2}}, b));
    seeds.push_back(b);
    REQUIRE(encode(static_cast<uint16_t>(MsgType::kTensorList), 4, TensorListReq{"p", 0, 3}, b));
    seeds.push_back(b);
    std::mt19937 rng(1);
    for (int i = 0; i < 20000; ++i) {
      auto m = seeds[rng() % seeds.size()];
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) m[rng() % m.size()] = std::byte(rng());
      if (rng() % 8 == 0) m.resize(rng() % (m.size() + 1));
      auto sess = h.session();
      Reply r = h.raw(*sess, m);
      if (!r.deferred && !r.close) REQUIRE(parse_header(r.bytes));
      h.handler->session_closed(*sess);
    }
    CHECK(h.state->leases.live() == 0);
    CHECK(h.state->leases.waiter_count() == 0);
  }
}

TEST_CASE("handler: request validation") {
  Harness h;
  auto s = h.session();
  REQUIRE(h.call<PoolInfoW>(*s, MsgType::kPoolCreate, PoolCreateReq{"p", 8 << 20, 0, false}));
  auto err = [&](auto r) {
    REQUIRE_FALSE(r);
    return r.error().code();
  };
  CHECK(err(h.call<PoolInfoW>(*s, MsgType::kPoolCreate, PoolCreateReq{"p", 0, 0, false})) ==
        Code::kAlreadyExists);
  CHECK(err(h.call<PoolInfoW>(*s, MsgType::kPoolCreate, PoolCreateReq{"bad/name", 0, 0, false})) ==
        Code::kInvalidArgument);
  CHECK(err(h.call<PoolInfoW>(*s, MsgType::kPoolCreate, PoolCreateReq{"big", 1ull << 40, 0, false})) ==
        Code::kResourceExhausted);
  CHECK(h.call<PoolInfoW>(*s, MsgType::kPoolCreate, PoolCreateReq{"p", 0, 0, true}));
  auto tc = [&](TensorCreateReq r) { return h.call<TensorInfoW>(*s, MsgType::kTensorCreate, r); };
  CHECK(err(tc({"p", "t", 0, 0, {}, 0, -1, false})) == Code::kInvalidArgument);
  CHECK(err(tc({"p", "t", 4096, 99, {}, 0, -1, false})) == Code::kInvalidArgument);
  CHECK(err(tc({"p", "t", 4096, 0, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 0, -1, false})) == Code::kInvalidArgument);
  CHECK(err(tc({"p", "t", 4096, 0, {-1}, 0, -1, false})) == Code::kInvalidArgument);
  CHECK(err(tc({"p", "t", 4096, 0, {}, 7, -1, false})) == Code::kInvalidArgument);
  CHECK(err(tc({"p", "t", 4096, 0, {}, 1, 5, false})) == Code::kInvalidArgument);  // no node 5
  CHECK(err(tc({"nope", "t", 4096, 0, {}, 0, -1, false})) == Code::kNotFound);
  CHECK(err(tc({"p", "t", 9 << 20, 0, {}, 0, -1, false})) == Code::kResourceExhausted);  // quota
  auto t = tc({"p", "t", 4096, 1, {1024}, 1, 1, false});
  REQUIRE(t);
  CHECK(t->numa_node == 1);
  CHECK(err(tc({"p", "t", 4096, 1, {}, 0, -1, false})) == Code::kAlreadyExists);
  CHECK(err(tc({"p", "t", 8192, 1, {}, 0, -1, true})) == Code::kAlreadyExists);  // size differs
  CHECK(tc({"p", "t", 4096, 1, {}, 0, -1, true})->id == t->id);
  CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{4, 0, {t->id}})) == Code::kInvalidArgument);
  CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{0, 0, {t->id}})) == Code::kInvalidArgument);
  {
    // Overwrite (3) on a RAM tensor is an exclusive write lease; a read then waits or fails.
    auto w = h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{3, 0, {t->id}});
    REQUIRE(w);
    REQUIRE(w->grants.size() == 1);
    CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{1, 0, {t->id}})) == Code::kBusy);
    REQUIRE(h.call<Empty>(*s, MsgType::kRelease, ReleaseReq{{w->grants[0].lease_id}}));
  }
  CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{1, 0, {}})) == Code::kInvalidArgument);
  CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease,
                             LeaseReq{1, 0, std::vector<uint64_t>(kMaxBatch + 1, t->id)})) ==
        Code::kInvalidArgument);
  CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{1, 0, std::vector<uint64_t>(1638, t->id)})) ==
        Code::kInvalidArgument);
  CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{1, 0, {12345}})) == Code::kNotFound);
  CHECK(err(h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{1, 0, std::vector<uint64_t>(65, t->id)})) ==
        Code::kResourceExhausted);
  CHECK(err(h.call<Empty>(*s, MsgType::kRelease, ReleaseReq{{42}})) == Code::kNotFound);
  CHECK(err(h.call<MapArenaRep>(*s, MsgType::kMapArena, MapArenaReq{999})) == Code::kNotFound);
  CHECK(err(h.call<Empty>(*s, MsgType::kSnapshot, PoolNameReq{"p"})) == Code::kUnsupported);
  CHECK(err(h.call<Empty>(*s, MsgType::kTensorDelete, TensorRefReq{"p", "nope"})) == Code::kNotFound);
  // Tensor listing pages by id.
  for (int i = 0; i < 5; ++i) REQUIRE(tc({"p", "x" + std::to_string(i), 4096, 0, {}, 0, -1, false}));
  auto page = h.call<TensorListRep>(*s, MsgType::kTensorList, TensorListReq{"p", 0, 4});
  REQUIRE(page);
  CHECK(page->tensors.size() == 4);
  CHECK(page->more);
  auto rest = h.call<TensorListRep>(*s, MsgType::kTensorList, TensorListReq{"p", page->tensors.back().id, 0});
  REQUIRE(rest);
  CHECK(rest->tensors.size() == 2);
  CHECK_FALSE(rest->more);
  // Map gives the arena fd of the right node.
  auto l = h.call<LeaseRep>(*s, MsgType::kLease, LeaseReq{1, 0, {t->id}});
  REQUIRE(l);
  Reply keep;
  auto m = h.call<MapArenaRep>(*s, MsgType::kMapArena, MapArenaReq{l->grants[0].arena_id}, &keep);
  REQUIRE(m);
  CHECK(m->numa_node == 1);
  CHECK(keep.fd >= 0);
  CHECK(err(h.call<Empty>(*s, MsgType::kTensorDelete, TensorRefReq{"p", "t"})) == Code::kBusy);
  h.handler->session_closed(*s);
  CHECK(h.state->leases.live() == 0);
}

TEST_CASE("handler: authorization by uid") {
  Harness h;
  auto owner = h.session(1000);
  auto other = h.session(1001);
  auto root = h.session(0);
  REQUIRE(h.call<PoolInfoW>(*owner, MsgType::kPoolCreate, PoolCreateReq{"mine", 4 << 20, 0, false}));
  auto t = h.call<TensorInfoW>(*owner, MsgType::kTensorCreate,
                               TensorCreateReq{"mine", "t", 4096, 0, {}, 0, -1, false});
  REQUIRE(t);
  auto denied = h.call<PoolInfoW>(*other, MsgType::kPoolOpen, PoolNameReq{"mine"});
  REQUIRE_FALSE(denied);
  CHECK(denied.error().code() == Code::kPermissionDenied);
  CHECK(denied.error().message() == "pool 'mine' belongs to uid 1000");
  CHECK(h.call<PoolInfoW>(*other, MsgType::kPoolCreate, PoolCreateReq{"mine", 0, 0, true}).error().code() ==
        Code::kPermissionDenied);
  CHECK(h.call<LeaseRep>(*other, MsgType::kLease, LeaseReq{1, 0, {t->id}}).error().code() ==
        Code::kPermissionDenied);
  CHECK(h.call<TensorInfoW>(*other, MsgType::kTensorCreate,
                            TensorCreateReq{"mine", "u", 4096, 0, {}, 0, -1, false})
            .error()
            .code() == Code::kPermissionDenied);
  CHECK(h.call<Empty>(*other, MsgType::kPoolDrop, PoolNameReq{"mine"}).error().code() ==
        Code::kPermissionDenied);
  CHECK(h.call<PoolListRep>(*other, MsgType::kPoolList, Empty{})->pools.empty());
  // root inspects and drops, but does not lease another uid's tensors.
  CHECK(h.call<PoolInfoW>(*root, MsgType::kPoolOpen, PoolNameReq{"mine"}));
  CHECK(h.call<TensorListRep>(*root, MsgType::kTensorList, TensorListReq{"mine", 0, 0})->tensors.size() == 1);
  CHECK(h.call<LeaseRep>(*root, MsgType::kLease, LeaseReq{1, 0, {t->id}}).error().code() ==
        Code::kPermissionDenied);
  CHECK(h.call<PoolListRep>(*root, MsgType::kPoolList, Empty{})->pools.size() == 1);
  // A member of admin_group (by primary gid) inspects like root.
  h.state->admin_gid = 4242;
  auto admin = h.session(1002);
  admin->gid = 4242;
  CHECK(h.call<PoolListRep>(*admin, MsgType::kPoolList, Empty{})->pools.size() == 1);
  CHECK(h.call<LeaseRep>(*admin, MsgType::kLease, LeaseReq{1, 0, {t->id}}).error().code() ==
        Code::kPermissionDenied);
  CHECK(h.state->ram->used() > 0);
  CHECK(h.call<Empty>(*root, MsgType::kPoolDrop, PoolNameReq{"mine"}));
  CHECK(h.state->catalog.pool_count() == 0);
  CHECK(h.state->ram->arena_count() == 0);
  // The drop takes the pool's extents off the node usage in bulk: nothing is left counted.
  CHECK(h.state->ram->used() == 0);
  for (const auto& n : h.state->ram->nodes()) CHECK((n.used == 0 && n.tensors == 0));
}

TEST_CASE("handler: lease waits are answered later through the sink") {
  Harness h;
  auto a = h.session(), b = h.session();
  REQUIRE(h.call<PoolInfoW>(*a, MsgType::kPoolCreate, PoolCreateReq{"p", 4 << 20, 0, false}));
  auto t =
      h.call<TensorInfoW>(*a, MsgType::kTensorCreate, TensorCreateReq{"p", "t", 4096, 0, {}, 0, -1, false});
  REQUIRE(t);
  auto w = h.call<LeaseRep>(*a, MsgType::kLease, LeaseReq{2, 0, {t->id}});
  REQUIRE(w);
  Reply r;
  auto waiting = h.call<LeaseRep>(*b, MsgType::kLease, LeaseReq{1, -1, {t->id}}, &r);
  CHECK(r.deferred);
  auto timed = h.call<LeaseRep>(*b, MsgType::kLease, LeaseReq{1, 10, {t->id}}, &r);
  CHECK(r.deferred);
  CHECK(h.handler->next_deadline().has_value());
  h.handler->expire(Clock::now() + std::chrono::seconds(1));
  REQUIRE(h.deferred.size() == 1);
  CHECK(decode_reply<LeaseRep>(payload_of(h.deferred[0].second)).error().code() == Code::kTimeout);
  REQUIRE(h.call<Empty>(*a, MsgType::kRelease, ReleaseReq{{w->grants[0].lease_id}}));
  REQUIRE(h.deferred.size() == 2);
  CHECK(h.deferred[1].first == b->id);
  auto granted = decode_reply<LeaseRep>(payload_of(h.deferred[1].second));
  REQUIRE(granted);
  CHECK(granted->grants[0].tensor_id == t->id);
  CHECK(t->id == granted->grants[0].tensor_id);
  // A waiter whose tensor is deleted... cannot be: deletion refuses leased tensors; a waiter
  // whose session closes is dropped silently.
  auto w2 = h.call<LeaseRep>(*a, MsgType::kLease, LeaseReq{2, -1, {t->id}}, &r);
  CHECK(r.deferred);
  h.handler->session_closed(*a);
  CHECK(h.state->leases.waiter_count() == 0);
  h.handler->session_closed(*b);
  CHECK(h.state->leases.live() == 0);
  CHECK(h.handler->metrics_text().find("tierd_lease_timeouts_total 1") != std::string::npos);
}

TEST_CASE("handler: RAM tier capacity per node, pool quota, and space returned on delete") {
  Harness h;  // 256 MiB over 2 equal nodes: 128 MiB each
  REQUIRE(h.state->ram->nodes().size() == 2);
  CHECK(h.state->ram->nodes()[0].capacity == 128ull << 20);
  auto s = h.session();
  REQUIRE(h.call<PoolInfoW>(*s, MsgType::kPoolCreate, PoolCreateReq{"p", 200ull << 20, 0, false}));
  auto tc = [&](const std::string& name, uint64_t size, int node) {
    return h.call<TensorInfoW>(*s, MsgType::kTensorCreate,
                               TensorCreateReq{"p", name, size, 0, {}, 1, node, false});
  };
  REQUIRE(tc("a", 100ull << 20, 0));
  auto full = tc("b", 50ull << 20, 0);
  REQUIRE_FALSE(full);
  CHECK(full.error().code() == Code::kResourceExhausted);
  CHECK(full.error().message().find("NUMA node 0 is full") != std::string::npos);
  REQUIRE(tc("b", 90ull << 20, 1));  // the other node has room
  auto quota = tc("c", 20ull << 20, 1);
  REQUIRE_FALSE(quota);
  CHECK(quota.error().message().find("quota") != std::string::npos);
  auto info = h.call<PoolInfoW>(*s, MsgType::kPoolOpen, PoolNameReq{"p"});
  REQUIRE(info);
  CHECK(info->ram_used == 190ull << 20);
  CHECK(info->tensor_count == 2);
  REQUIRE(h.call<Empty>(*s, MsgType::kTensorDelete, TensorRefReq{"p", "a"}));
  CHECK(h.state->ram->nodes()[0].used == 0);
  REQUIRE(tc("c", 100ull << 20, 0));  // the space came back
  auto st = h.call<StatusRep>(*s, MsgType::kStatus, Empty{});
  REQUIRE(st);
  REQUIRE(st->ram.size() == 2);
  CHECK(st->ram[0].used == 100ull << 20);
  CHECK(st->ram[1].used == 90ull << 20);
  CHECK(st->ram[1].tensors == 1);
  CHECK(h.handler->status_line().find("RAM 190 MiB of 256 MiB used") != std::string::npos);
}
