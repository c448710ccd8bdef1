// --state resident: shards in private, page-aligned memory of the rank. The baseline.
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <unistd.h>

#include <fmt/format.h>

#include "trainer/memory_model.hpp"
#include "trainer/state.hpp"
#include "wire/errors.hpp"

namespace tier::train {

const char* shard_kind_name(ShardKind k) {
  switch (k) {
    case ShardKind::kParam: return "param";
    case ShardKind::kM: return "m";
    case ShardKind::kV: return "v";
    case ShardKind::kGrad: return "grad";
    case ShardKind::kCkpt: return "ckpt";
    case ShardKind::kMaster: return "master";
  }
  return "?";
}

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

size_t shard_elem_bytes(ShardKind k, Precision p) {
  const bool half = p == Precision::kBf16 && (k == ShardKind::kParam || k == ShardKind::kGrad);
  return half ? 2 : sizeof(float);
}

std::string shard_tensor_name(int rank, const ShardRef& ref) {
  if (ref.kind == ShardKind::kGrad || ref.kind == ShardKind::kCkpt)
    return fmt::format("r{}.l{}.{}", rank, ref.layer, shard_kind_name(ref.kind));
  return fmt::format("r{}.l{}.{}.{}", rank, ref.layer, shard_kind_name(ref.kind), ref.buffer);
}

Result<std::vector<Pinned>> ShardStore::acquire_many(std::span<const ShardRef> refs, Access access,
                                                     Lane lane) {
  std::vector<Pinned> out;
  out.reserve(refs.size());
  for (const auto& r : refs) {
    auto p = acquire(r, access, lane);
    if (!p) return fail(p.error());
    out.push_back(std::move(*p));
  }
  return out;
}

namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

class ResidentStore final : public ShardStore {
 public:
  const char* name() const override { return "resident"; }

  Status open(const StoreLayout& layout) override {
    if (layout.ckpt_floats > 0)
      return {Code::kUnsupported, "activation checkpoints are offloaded to tierd only (--state tier)"};
    layout_ = layout;
    slots_.clear();
    ranges_.clear();
    bytes_ = 0;
    // The memory model's list of a layer's shards (as the tier store creates); slots_ is
    // indexed by index(ref), and a slot no shard takes stays empty.
    slots_.resize(layout.shard_floats.size() * kShardKinds * 2);
    for (size_t l = 0; l < layout.shard_floats.size(); ++l) {
      const size_t n = layout.shard_floats[l];
      for (const ShardRef& ref : layer_shards(static_cast<int>(l), layout.buffers, layout.precision)) {
        const size_t elem = shard_elem_bytes(ref.kind, layout.precision);
        const size_t bytes = (n * elem + 4095) / 4096 * 4096;
        float* p = static_cast<float*>(std::aligned_alloc(4096, bytes == 0 ? 4096 : bytes));
        if (p == nullptr) return {Code::kResourceExhausted, fmt::format("cannot allocate {} bytes", bytes)};
        std::memset(p, 0, bytes);
        slots_[index(ref)].reset(p);
        ranges_.emplace_back(reinterpret_cast<std::byte*>(p), bytes == 0 ? 4096 : bytes);
        bytes_ += n * elem;
      }
    }
    return {};
  }

  Result<Pinned> acquire(const ShardRef& ref, Access, Lane) override {
    const size_t i = index(ref);
    if (ref.kind == ShardKind::kCkpt || ref.layer < 0 ||
        static_cast<size_t>(ref.layer) >= layout_.shard_floats.size() || i >= slots_.size() || !slots_[i])
      return fail(Code::kNotFound, fmt::format("no shard {}", shard_tensor_name(layout_.rank, ref)));
    return Pinned{slots_[i].get(), layout_.shard_floats[static_cast<size_t>(ref.layer)], nullptr};
  }

  Result<CommitMarker> read_marker() override {
    std::lock_guard lk(mu_);
    return marker_;
  }
  Status write_marker(const CommitMarker& m) override {
    std::lock_guard lk(mu_);
    marker_ = m;
    return {};
  }
  // The marker lives in this process's memory: a domain of its own (the store's address,
  // which no other store in this process has, and a pid no other live process has).
  std::string marker_domain() const override {
    return fmt::format("resident:{}:{}", static_cast<long>(getpid()), static_cast<const void*>(this));
  }
  uint64_t bytes() const override { return bytes_; }
  std::vector<std::span<std::byte>> private_ranges() override { return ranges_; }

 private:
  static size_t index(const ShardRef& r) {
    return (static_cast<size_t>(r.layer) * kShardKinds + static_cast<size_t>(r.kind)) * 2 +
           static_cast<size_t>(r.buffer & 1);
  }
  StoreLayout layout_;
  std::vector<std::unique_ptr<float, FreeDeleter>> slots_;
  std::vector<std::span<std::byte>> ranges_;  // one per allocated slot
  uint64_t bytes_ = 0;
  std::mutex mu_;
  CommitMarker marker_;
};

}  // namespace

std::unique_ptr<ShardStore> make_resident_store() { return std::make_unique<ResidentStore>(); }

}  // namespace tier::train
