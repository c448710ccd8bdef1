#include "trainer/dump.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <vector>

namespace tier::train {

Status dump_layers(Comm& comm, ShardStore& store, ShardKind kind, int buffer, std::span<const size_t> shard,
                   std::span<const size_t> layer_floats, const std::string& path) {
  const bool writer = comm.rank() == 0;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(nullptr, &std::fclose);
  if (writer) {
    f.reset(std::fopen(path.c_str(), "wb"));
    if (!f) return Status::from_errno(errno, fmt::format("--dump: create '{}'", path));
  }
  std::vector<float> full;
  for (size_t l = 0; l < shard.size(); ++l) {
    auto pin = store.acquire({static_cast<int>(l), kind, buffer}, Access::kRead);
    if (!pin) return pin.error();
    full.assign(shard[l] * static_cast<size_t>(comm.size()), 0.0f);
    Comm::Op op;
    op.start = [&](Comm::Request& req) {
      return comm.start_allgather(pin->data, full.data(), shard[l], req);
    };
    if (auto s = comm.submit(std::move(op)).wait(); !s) return s;
    pin->release();
    if (writer && std::fwrite(full.data(), sizeof(float), layer_floats[l], f.get()) != layer_floats[l])
      return Status::from_errno(errno, fmt::format("--dump: write '{}'", path));
  }
  if (writer && std::fclose(f.release()) != 0)
    return Status::from_errno(errno, fmt::format("--dump: write '{}'", path));
  return {};
}

}  // namespace tier::train
