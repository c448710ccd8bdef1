// A program outside the tierd tree, built against an installed libtier (find_package(tier) or
// pkg-config tier). `consumer SOCKET`: connects; with no daemon prints the Status and exits 3;
// with one, writes a tensor through a write lease, reads it back under a read lease, drops the
// pool and prints "ok <bytes>".
#include <cstdio>
#include <cstring>
#include <string>

#include <unistd.h>

#include <tier/client.hpp>

namespace {
int failed(const char* what, const tier::Status& st) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, st.to_string().c_str());
  return st.code() == tier::Code::kUnavailable ? 3 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer SOCKET\n");
    return 2;
  }
  auto c = tier::Client::connect(argv[1], {.client_name = "consumer"});
  if (!c) return failed("connect", c.error());
  auto& client = **c;
  const std::string pool = "consumer-" + std::to_string(::getpid());
  if (auto p = client.create_pool(pool); !p) return failed("create_pool", p.error());
  auto t = client.create_tensor(pool, {.name = "t", .size = 4096, .dtype = tier::DType::kU8});
  if (!t) return failed("create_tensor", t.error());
  {
    auto w = client.lease(t->id, tier::LeaseMode::kWrite);
    if (!w) return failed("lease w", w.error());
    for (size_t i = 0; i < w->bytes().size(); ++i) w->bytes()[i] = std::byte(i * 7);
    if (auto st = w->release(); !st) return failed("release", st);
  }
  auto r = client.lease(t->id, tier::LeaseMode::kRead);
  if (!r) return failed("lease r", r.error());
  for (size_t i = 0; i < r->bytes().size(); ++i) {
    if (r->bytes()[i] != std::byte(i * 7)) {
      std::fprintf(stderr, "consumer: byte %zu differs\n", i);
      return 1;
    }
  }
  const size_t n = r->bytes().size();
  if (auto st = r->release(); !st) return failed("release", st);
  if (auto st = client.drop_pool(pool); !st) return failed("drop_pool", st);
  std::printf("ok %zu\n", n);
  return 0;
}
