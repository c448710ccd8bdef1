#include <catch2/catch.hpp>

#include <random>

#include "wire/messages.hpp"

using namespace tier;
using namespace tier::wire;

namespace {
std::span<const std::byte> as_span(const std::vector<std::byte>& v) { return {v.data(), v.size()}; }
}  // namespace

TEST_CASE("codec round-trips a lease request and its reply") {
  LeaseReq req{2, 1500, {1, 2, 3, 0xffffffffffffULL}};
  std::vector<std::byte> buf;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kLease), 7, req, buf).is_ok());
  auto h = parse_header(as_span(buf));
  REQUIRE(h.has_value());
  CHECK(h->type == static_cast<uint16_t>(MsgType::kLease));
  CHECK(h->request_id == 7);
  auto back = decode<LeaseReq>(payload_of(as_span(buf)));
  REQUIRE(back.has_value());
  CHECK(back->mode == 2);
  CHECK(back->timeout_ms == 1500);
  CHECK(back->tensor_ids == req.tensor_ids);

  LeaseRep rep{{{10, 1, 3, 4096, 8192}}};
  REQUIRE(encode_reply(static_cast<uint16_t>(MsgType::kLease), 7, Status::ok(), rep, buf).is_ok());
  auto r = decode_reply<LeaseRep>(payload_of(as_span(buf)));
  REQUIRE(r.has_value());
  REQUIRE(r->grants.size() == 1);
  CHECK(r->grants[0].offset == 4096);
  CHECK(r->grants[0].length == 8192);
}

TEST_CASE("an error reply decodes to its status") {
  std::vector<std::byte> buf;
  REQUIRE(encode_reply(static_cast<uint16_t>(MsgType::kPoolOpen), 1,
                       Status(Code::kNotFound, "no pool named 'x'"), Empty{}, buf)
              .is_ok());
  auto r = decode_reply<PoolInfoW>(payload_of(as_span(buf)));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code() == Code::kNotFound);
  CHECK(r.error().message() == "no pool named 'x'");
}

TEST_CASE("every truncation of a valid message is rejected") {
  TensorCreateReq req{"pool", "layer.0.w", 1 << 20, 1, {1024, 256}, 2, 3, true};
  std::vector<std::byte> buf;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kTensorCreate), 1, req, buf).is_ok());
  auto payload = payload_of(as_span(buf));
  for (size_t n = 0; n < payload.size(); ++n) {
    auto r = decode<TensorCreateReq>(payload.first(n));
    CHECK_FALSE(r.has_value());
    if (!r) CHECK(r.error().code() == Code::kProtocol);
  }
  // Trailing garbage is rejected too.
  std::vector<std::byte> longer(payload.begin(), payload.end());
  longer.push_back(std::byte{0});
  CHECK_FALSE(decode<TensorCreateReq>(as_span(longer)).has_value());
}

TEST_CASE("headers with bad magic, version, length or type are rejected") {
  std::vector<std::byte> buf;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kStatus), 1, Empty{}, buf).is_ok());
  REQUIRE(parse_header(as_span(buf)).has_value());
  auto corrupt = [&](size_t off, std::byte v) {
    auto c = buf;
    c[off] = v;
    return parse_header(as_span(c));
  };
  CHECK_FALSE(corrupt(0, std::byte{0}).has_value());    // magic
  CHECK_FALSE(corrupt(4, std::byte{99}).has_value());   // version
  CHECK_FALSE(corrupt(6, std::byte{0}).has_value());    // type 0
  CHECK_FALSE(corrupt(6, std::byte{200}).has_value());  // unknown type
  CHECK_FALSE(corrupt(12, std::byte{1}).has_value());   // payload length
  CHECK_FALSE(parse_header(as_span(buf).first(10)).has_value());
}

TEST_CASE("a hostile vector count cannot make the reader allocate") {
  // count = 0xffffffff with only a few bytes behind it.
  std::vector<std::byte> p = {std::byte{1},    std::byte{0},    std::byte{0},    std::byte{0},   std::byte{0},
                              std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0xff}};
  auto r = decode<LeaseReq>(as_span(p));
  CHECK_FALSE(r.has_value());
}

TEST_CASE("oversized strings and messages are refused") {
  PoolNameReq big{std::string(kMaxStringBytes + 1, 'a')};
  std::vector<std::byte> buf;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kPoolOpen), 1, big, buf).is_ok());
  CHECK_FALSE(decode<PoolNameReq>(payload_of(as_span(buf))).has_value());

  ReleaseReq huge;
  huge.lease_ids.resize(kMaxMessageBytes / 8 + 1);
  CHECK(encode(static_cast<uint16_t>(MsgType::kRelease), 1, huge, buf).code() == Code::kInvalidArgument);
}

TEST_CASE("random bytes never crash the decoder") {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> p(rng() % 64);
    for (auto& b : p) b = static_cast<std::byte>(rng());
    (void)decode<StatusRep>(as_span(p));
    (void)decode<TensorListRep>(as_span(p));
    (void)decode_reply<LeaseRep>(as_span(p));
    (void)parse_header(as_span(p));
  }
  SUCCEED("20000 random payloads decoded without a crash");
}

namespace {
// The payload bytes encode() produces for `msg`, and what encoded_size() says beforehand.
template <class T> void check_encoded_size(const T& msg) {
  std::vector<std::byte> buf;
  REQUIRE(encode(static_cast<uint16_t>(MsgType::kStatus), 1, msg, buf).is_ok());
  CHECK(encoded_size(msg) == buf.size() - kHeaderBytes);
}
}  // namespace

TEST_CASE("encoded_size() is the size the encoder produces, for every kind of field") {
  check_encoded_size(Empty{});
  check_encoded_size(ReplyStatus{3, "no such pool"});
  check_encoded_size(LeaseReq{2, -1, {1, 2, 3}});
  check_encoded_size(LeaseRep{{{10, 1, 3, 4096, 8192}, {11, 2, 3, 0, 1}}});
  check_encoded_size(LeaseRep{});
  TensorInfoW t{7, "layer.3.attn.w", 1 << 20, 2, {4, 256, 1024}, 1, 3, true, 2, false};
  TensorInfoW u{8, "", 0, 0, {}, -1, 0, false, 0, true};
  check_encoded_size(t);
  check_encoded_size(TensorListRep{{t, u, t}, true});
  check_encoded_size(PoolListRep{{PoolInfoW{1, "p", 1000, 1, 2, 3, 4, 5, 6, true}, PoolInfoW{}}});
  check_encoded_size(PlanSetReq{"pool", {5, 6, 5}, 1 << 30, {1, 0, 1}});
  check_encoded_size(SnapshotListRep{true, 4, 2, {{1, 10, 100}, {2, 20, 200}}});
  StatusRep st;
  st.daemon_version = "0.1.0";
  st.ram = {NodeTierW{0, 1, 2, 3, 4}, NodeTierW{1, 5, 6, 7, 8}};
  st.nvme = {NvmeTierW{"/srv/nvme0", 0, "io_uring", 9, 10}};
  check_encoded_size(st);
  // Sizes grow with the content, not by a constant: a longer name and shape count.
  TensorInfoW longer = t;
  longer.name += "xyz";
  longer.shape.push_back(2);
  CHECK(encoded_size(longer) == encoded_size(t) + 3 + 8);
}

TEST_CASE("the lease grants encoded_size() says fit one reply do fit, and one more does not") {
  const size_t n =
      (kMaxMessageBytes - kHeaderBytes - encoded_size(ReplyStatus{}) - encoded_size(LeaseRep{})) /
      encoded_size(LeaseGrant{});
  CHECK(n < kMaxBatch);
  LeaseRep rep;
  rep.grants.assign(n, LeaseGrant{~0ULL, ~0ULL, ~0ULL, ~0ULL, ~0ULL});
  std::vector<std::byte> buf;
  CHECK(encode_reply(static_cast<uint16_t>(MsgType::kLease), 1, Status::ok(), rep, buf).is_ok());
  rep.grants.push_back({});
  CHECK_FALSE(encode_reply(static_cast<uint16_t>(MsgType::kLease), 1, Status::ok(), rep, buf).is_ok());
}
