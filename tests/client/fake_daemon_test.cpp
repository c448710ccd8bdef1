// libtier against a scripted fake daemon: the protocol edge cases a real tierd never produces on
// purpose (mismatched reply ids, short grants, a vanished peer) and the mechanics of arena
// mapping (fd passing, offsets), without needing tierd itself.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <thread>

#include "tier/client.hpp"
#include "wire/messages.hpp"
#include "wire/transport.hpp"

using namespace tier;
using namespace tier::wire;

namespace {

struct Req {
  Header h;
  std::vector<std::byte> payload;
};

// A one-connection server on a temporary socket; `script` runs on its thread with the accepted
// socket. Hello is answered before the script starts.
class FakeDaemon {
 public:
  explicit FakeDaemon(std::function<void(FakeDaemon&)> script) : script_(std::move(script)) {
    char tmpl[] = "/tmp/tier-fake.XXXXXX";
    REQUIRE(mkdtemp(tmpl));
    dir_ = tmpl;
    path_ = dir_ + "/s.sock";
    listen_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof a.sun_path - 1);
    REQUIRE(::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listen_, 4) == 0);
    thread_ = std::thread([this] {
      fd_ = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd_ < 0) return;
      Req hello;
      if (recv(hello)) {
        hello_ = decode<HelloReq>(hello.payload).value_or(HelloReq{});
        reply(hello, HelloRep{kVersion, "fake", 42});
        script_(*this);
      }
      ::close(fd_);
    });
  }
  ~FakeDaemon() {
    ::shutdown(listen_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }
  const HelloReq& hello() const { return hello_; }

  bool recv(Req& r) {
    std::vector<std::byte> buf;
    if (!recv_datagram(fd_, buf).is_ok()) return false;
    auto h = parse_header(buf);
    if (!h) return false;
    r.h = *h;
    r.payload.assign(buf.begin() + kHeaderBytes, buf.end());
    return true;
  }
  template <class T> void reply(const Req& r, const T& body, int pass_fd = -1,
                                const Status& st = Status::ok(), int32_t id_delta = 0) {
    // No Catch2 assertions here: this runs on the server thread. A failure shows up as the
    // client's call failing, which the test checks.
    std::vector<std::byte> out;
    if (!encode_reply(r.h.type, r.h.request_id + id_delta, st, body, out).is_ok()) return;
    (void)send_datagram(fd_, out, pass_fd);
  }

 private:
  std::function<void(FakeDaemon&)> script_;
  std::string dir_, path_;
  int listen_ = -1, fd_ = -1;
  HelloReq hello_;
  std::thread thread_;
};

int make_memfd(size_t size) {
  int fd = memfd_create("tier-fake-arena", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
  return fd;
}

}  // namespace

TEST_CASE("default socket path honours TIERD_SOCKET") {
  ::setenv("TIERD_SOCKET", "/tmp/x/tierd.sock", 1);
  CHECK(default_socket_path() == "/tmp/x/tierd.sock");
  ::unsetenv("TIERD_SOCKET");
  CHECK(default_socket_path() == kDefaultSocketPath);
}

TEST_CASE("connecting to a missing socket is Unavailable, after retrying") {
  auto c = Client::connect("/tmp/tier-no-such-dir/tierd.sock",
                           {.client_name = "t", .connect_timeout = std::chrono::milliseconds(100)});
  REQUIRE_FALSE(c.has_value());
  CHECK(c.error().code() == Code::kUnavailable);
  CHECK(c.error().message().find("/tmp/tier-no-such-dir/tierd.sock") != std::string::npos);
}

TEST_CASE("hello carries pid, NUMA node and client name") {
  FakeDaemon d([](FakeDaemon&) {});
  auto c = Client::connect(d.path(), {.client_name = "hello-test", .connect_timeout = {}});
  REQUIRE(c.has_value());
  c->reset();  // wait for the script to end before looking at what it saw
  CHECK(d.hello().pid == ::getpid());
  CHECK(d.hello().client_name == "hello-test");
  CHECK(d.hello().numa_node >= 0);
}

TEST_CASE("a lease maps its arena once from the passed fd and points at the granted offset") {
  constexpr size_t kArena = 1 << 20;
  int memfd = make_memfd(kArena);
  auto* shared =
      static_cast<unsigned char*>(mmap(nullptr, kArena, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  REQUIRE(shared != MAP_FAILED);
  std::memset(shared + 8192, 0xab, 100);
  int map_requests = 0;
  std::vector<uint64_t> released;
  FakeDaemon d([&](FakeDaemon& s) {
    Req r;
    uint64_t next_lease = 100;
    while (s.recv(r)) {
      switch (static_cast<MsgType>(r.h.type)) {
        case MsgType::kLease: {
          auto req = decode<LeaseReq>(r.payload).value();
          LeaseRep rep;
          for (uint64_t id : req.tensor_ids) rep.grants.push_back({next_lease++, id, 7, 8192, 100});
          s.reply(r, rep);
          break;
        }
        case MsgType::kMapArena:
          ++map_requests;
          s.reply(r, MapArenaRep{7, kArena, 0}, memfd);
          break;
        case MsgType::kRelease: {
          auto req = decode<ReleaseReq>(r.payload).value();
          released.insert(released.end(), req.lease_ids.begin(), req.lease_ids.end());
          s.reply(r, Empty{});
          break;
        }
        default: s.reply(r, Empty{}, -1, Status(Code::kUnsupported, "fake"));
      }
    }
  });
  auto c = Client::connect(d.path());
  REQUIRE(c.has_value());
  {
    auto l = (*c)->lease(5, LeaseMode::kRead);
    REQUIRE(l.has_value());
    REQUIRE(l->bytes().size() == 100);
    CHECK(static_cast<unsigned char>(l->bytes()[0]) == 0xab);
    CHECK(static_cast<unsigned char>(l->bytes()[99]) == 0xab);
    shared[8192] = 0x11;  // the same memory, not a copy
    CHECK(static_cast<unsigned char>(l->bytes()[0]) == 0x11);
    auto arenas = (*c)->mapped_arenas();
    REQUIRE(arenas.size() == 1);
    CHECK(arenas[0].arena_id == 7);
    CHECK(arenas[0].size == kArena);
    CHECK(l->bytes().data() == arenas[0].base + 8192);

    std::vector<uint64_t> ids = {1, 2, 3};
    auto batch = (*c)->lease_batch(ids, LeaseMode::kWrite);
    REQUIRE(batch.has_value());
    REQUIRE(batch->size() == 3);
    CHECK((*batch)[2].tensor_id() == 3);
    CHECK((*c)->release_batch(*batch).is_ok());
    for (auto& b : *batch) CHECK_FALSE(b.valid());
  }
  c->reset();
  CHECK(map_requests == 1);
  CHECK(released.size() == 4);
  munmap(shared, kArena);
  ::close(memfd);
}

TEST_CASE("a reply with the wrong request id is a protocol error that breaks the connection") {
  FakeDaemon d([](FakeDaemon& s) {
    Req r;
    if (s.recv(r)) s.reply(r, PoolListRep{}, -1, Status::ok(), /*id_delta=*/5);
    while (s.recv(r)) s.reply(r, PoolListRep{});
  });
  auto c = Client::connect(d.path());
  REQUIRE(c.has_value());
  auto p = (*c)->list_pools();
  REQUIRE_FALSE(p.has_value());
  CHECK(p.error().code() == Code::kProtocol);
  auto again = (*c)->list_pools();
  REQUIRE_FALSE(again.has_value());
  CHECK(again.error().code() == Code::kProtocol);
}

TEST_CASE("error replies come back as their Status") {
  FakeDaemon d([](FakeDaemon& s) {
    Req r;
    while (s.recv(r)) s.reply(r, Empty{}, -1, Status(Code::kBusy, "tensor 5 is write-leased"));
  });
  auto c = Client::connect(d.path());
  REQUIRE(c.has_value());
  auto l = (*c)->lease(5, LeaseMode::kWrite);
  REQUIRE_FALSE(l.has_value());
  CHECK(l.error().code() == Code::kBusy);
  CHECK(l.error().message() == "tensor 5 is write-leased");
  // The connection is still good after an error reply.
  CHECK((*c)->drop_pool("p").code() == Code::kBusy);
}

TEST_CASE("a batch answered with too few grants is refused and what was granted is given back") {
  std::vector<uint64_t> released;
  FakeDaemon d([&](FakeDaemon& s) {
    Req r;
    while (s.recv(r)) {
      if (r.h.type == static_cast<uint16_t>(MsgType::kLease)) {
        s.reply(r, LeaseRep{{LeaseGrant{900, 1, 7, 0, 10}}});
      } else {
        auto req = decode<ReleaseReq>(r.payload).value();
        released.insert(released.end(), req.lease_ids.begin(), req.lease_ids.end());
        s.reply(r, Empty{});
      }
    }
  });
  auto c = Client::connect(d.path());
  REQUIRE(c.has_value());
  std::vector<uint64_t> ids = {1, 2};
  auto b = (*c)->lease_batch(ids, LeaseMode::kRead);
  REQUIRE_FALSE(b.has_value());
  CHECK(b.error().code() == Code::kProtocol);
  c->reset();
  CHECK(released == std::vector<uint64_t>{900});
}

TEST_CASE("list_tensors follows pages until more is false") {
  std::vector<uint64_t> afters;
  FakeDaemon d([&](FakeDaemon& s) {
    Req r;
    while (s.recv(r)) {
      auto req = decode<TensorListReq>(r.payload).value();
      afters.push_back(req.after_id);
      TensorListRep rep;
      uint64_t first = req.after_id + 1;
      for (uint64_t i = first; i < first + 3 && i <= 7; ++i) {
        TensorInfoW t;
        t.id = i;
        t.name = "t" + std::to_string(i);
        t.size = 1;
        rep.tensors.push_back(t);
      }
      rep.more = first + 3 <= 7;
      s.reply(r, rep);
    }
  });
  auto c = Client::connect(d.path());
  REQUIRE(c.has_value());
  auto ts = (*c)->list_tensors("p");
  REQUIRE(ts.has_value());
  REQUIRE(ts->size() == 7);
  CHECK(ts->back().name == "t7");
  c->reset();
  CHECK(afters == std::vector<uint64_t>{0, 3, 6});
}

TEST_CASE("a daemon that goes away turns every call into Unavailable") {
  FakeDaemon d([](FakeDaemon&) {});  // closes right after hello
  ConnectOptions no_reconnect;
  no_reconnect.reconnect_timeout = std::chrono::milliseconds(0);
  auto c = Client::connect(d.path(), no_reconnect);
  REQUIRE(c.has_value());
  auto p = (*c)->list_pools();
  REQUIRE_FALSE(p.has_value());
  CHECK(p.error().code() == Code::kUnavailable);
  CHECK((*c)->status().error().code() == Code::kUnavailable);
  auto l = (*c)->lease(1, LeaseMode::kRead);
  REQUIRE_FALSE(l.has_value());
  CHECK(l.error().code() == Code::kUnavailable);
}
