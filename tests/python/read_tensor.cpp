// tier_read_tensor SOCKET POOL NAME OUTFILE: writes a tensor's bytes, read under a read lease
// through libtier, to OUTFILE. The Python tests use it to check that what the binding wrote is
// what a C++ client reads. Exit 0 ok; 1 with the Status on stderr; 2 usage.
#include <cstdio>
#include <string>

#include "tier/client.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: tier_read_tensor SOCKET POOL NAME OUTFILE\n");
    return 2;
  }
  auto client = tier::Client::connect(argv[1]);
  if (!client) {
    std::fprintf(stderr, "%s\n", client.error().to_string().c_str());
    return 1;
  }
  auto info = (*client)->open_tensor(argv[2], argv[3]);
  if (!info) {
    std::fprintf(stderr, "%s\n", info.error().to_string().c_str());
    return 1;
  }
  auto lease = (*client)->lease(info->id, tier::LeaseMode::kRead, {.timeout_ms = 10000});
  if (!lease) {
    std::fprintf(stderr, "%s\n", lease.error().to_string().c_str());
    return 1;
  }
  std::FILE* f = std::fopen(argv[4], "wb");
  if (f == nullptr) {
    std::perror(argv[4]);
    return 1;
  }
  auto bytes = lease->bytes();
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::fprintf(stderr, "short write to %s\n", argv[4]);
    return 1;
  }
  tier::Status st = lease->release();
  if (!st) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
