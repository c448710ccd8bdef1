// --state tier: every shard is a tensor in a tierd pool, reached zero-copy through leases.
#include "trainer/state.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tier/client.hpp"
#include "trainer/gpu_map.hpp"
#include "trainer/memory_model.hpp"
#include "wire/errors.hpp"

namespace tier::train {

namespace {

constexpr int kLeaseTimeoutMs = 60'000;
constexpr const char* kMarkerName = "commit";

// Which daemon a socket path reaches, the same string from every process that reaches it: the
// host name and the socket's inode (device and number, so a symlink or another spelling of the
// path names the same daemon and two sockets on one host differ; a node in its own mount
// namespace has its own /run/tierd, another device). Only when the socket cannot be found
// (then connecting failed too) the path stands in.
std::string daemon_identity(const std::string& socket) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  struct stat st{};
  if (stat(socket.c_str(), &st) != 0) return fmt::format("tierd:{}:{}", host, socket);
  return fmt::format("tierd:{}:{}:{}", host, static_cast<unsigned long long>(st.st_dev),
                     static_cast<unsigned long long>(st.st_ino));
}

LeaseMode lease_mode(Access a) {
  switch (a) {
    case Access::kRead: return LeaseMode::kRead;
    case Access::kWrite: return LeaseMode::kWrite;
    case Access::kOverwrite: return LeaseMode::kOverwrite;
  }
  return LeaseMode::kWrite;
}

class TierStore final : public ShardStore {
 public:
  TierStore(std::unique_ptr<Client> c, std::unique_ptr<Client> opt, TierStoreOptions o)
      : client_(std::move(c)), opt_client_(std::move(opt)), opts_(std::move(o)) {}
  const char* name() const override { return "tier"; }

  Status open(const StoreLayout& layout) override {
    layout_ = layout;
    PoolOptions po;
    po.ram_quota = opts_.ram_quota;
    po.nvme_quota = opts_.nvme_quota;
    if (auto p = client_->create_pool(opts_.pool, po, /*exist_ok=*/true); !p) return p.error();
    // A daemon without an NVMe tier keeps every shard in RAM: plans and prefetch hints would
    // only be answered kUnsupported (and counted as errors in its status), so none are sent.
    if (auto st = client_->status(); st && st->nvme.empty())
      no_tiering_.store(true, std::memory_order_relaxed);
    // Near the rank's GPU: the tierd GPU with the PCI address the backend computes on
    // (trainer/gpu_map.hpp). Without one (CPU backend), near GPU local_rank when the node has
    // that many; else anywhere: the daemon then uses the NUMA node of this process's CPU.
    placement_ = Placement::any();
    if (auto topo = client_->topology(); topo) {
      const int g = !layout.gpu_pci.empty() ? tierd_gpu_index(layout.gpu_pci, topo->gpus)
                    : layout.local_rank < static_cast<int>(topo->gpus.size()) ? layout.local_rank
                                                                              : -1;
      if (g >= 0) placement_ = Placement::near_gpu(g);
    }
    ids_.assign(layout.shard_floats.size() * kShardKinds * 2, 0);
    bytes_ = 0;
    for (size_t l = 0; l < layout.shard_floats.size(); ++l) {
      // The memory model's list, so --plan adds up exactly these tensors.
      for (const ShardRef& ref : layer_shards(static_cast<int>(l), layout.buffers, layout.precision)) {
        const size_t elem = shard_elem_bytes(ref.kind, layout.precision);
        const uint64_t size = layout.shard_floats[l] * elem;
        auto id =
            create(shard_tensor_name(layout.rank, ref), size, {static_cast<int64_t>(layout.shard_floats[l])},
                   elem == 2 ? DType::kBF16 : DType::kF32);
        if (!id) return id.error();
        ids_[index(ref)] = *id;
        bytes_ += size;
      }
    }
    if (auto s = open_checkpoints(layout); !s) return s;
    auto m = create(kMarkerName, sizeof(CommitMarker), {static_cast<int64_t>(sizeof(CommitMarker))},
                    DType::kBytes);
    if (!m) return m.error();
    marker_id_ = *m;
    return {};
  }

  std::string marker_domain() const override { return domain_; }

  Result<Pinned> acquire(const ShardRef& ref, Access access, Lane lane) override {
    const uint64_t id = lookup(ref);
    if (id == 0)
      return fail(Code::kNotFound, fmt::format("no shard {}", shard_tensor_name(layout_.rank, ref)));
    auto l = of(lane).lease(id, lease_mode(access), LeaseWait{kLeaseTimeoutMs});
    if (!l) return fail(l.error());
    return pin(std::move(*l), ref);
  }

  Result<std::vector<Pinned>> acquire_many(std::span<const ShardRef> refs, Access access,
                                           Lane lane) override {
    std::vector<uint64_t> ids;
    ids.reserve(refs.size());
    for (const auto& r : refs) {
      const uint64_t id = lookup(r);
      if (id == 0)
        return fail(Code::kNotFound, fmt::format("no shard {}", shard_tensor_name(layout_.rank, r)));
      ids.push_back(id);
    }
    auto ls = of(lane).lease_batch(ids, lease_mode(access), LeaseWait{kLeaseTimeoutMs});
    if (!ls) return fail(ls.error());
    std::vector<Pinned> out;
    out.reserve(refs.size());
    for (size_t i = 0; i < refs.size(); ++i) {
      auto p = pin(std::move((*ls)[i]), refs[i]);
      if (!p) return fail(p.error());
      out.push_back(std::move(*p));
    }
    return out;
  }

  void release_many(std::vector<Pinned>& pins, Lane lane) override {
    std::vector<Lease> leases;
    std::vector<void*> seen;
    for (auto& p : pins) {
      void* raw = p.pin.get();
      if (raw != nullptr && std::find(seen.begin(), seen.end(), raw) == seen.end()) {
        seen.push_back(raw);
        // Moving the Lease out leaves the shared one empty: its destructor then does nothing.
        leases.push_back(std::move(*static_cast<Lease*>(raw)));
      }
    }
    for (auto& p : pins) p.release();
    if (!leases.empty()) (void)of(lane).release_batch(leases);  // the client that granted them
  }

  void prefetch(std::span<const ShardRef> refs, Lane lane) override {
    // A daemon without an NVMe tier answers kUnsupported: every shard is in RAM already, so
    // stop sending hints (each would count as an error in tierd's status). Other failures
    // (no room right now) only cost that hint.
    if (no_tiering_.load(std::memory_order_relaxed)) return;
    const std::vector<uint64_t> ids = known_ids(refs);
    if (ids.empty()) return;
    if (Status st = of(lane).prefetch(opts_.pool, ids); st.code() == Code::kUnsupported)
      no_tiering_.store(true, std::memory_order_relaxed);
  }

  void discard(std::span<const ShardRef> refs, Lane lane) override {
    if (no_tiering_.load(std::memory_order_relaxed)) return;
    (void)of(lane).discard(opts_.pool, known_ids(refs));  // a hint: a failure only costs a write-back
  }

  void set_plan(std::span<const ShardUse> uses, Lane lane) override {
    if (no_tiering_.load(std::memory_order_relaxed)) return;
    std::vector<PlanUse> plan;
    for (const auto& u : uses)
      if (uint64_t id = lookup(u.ref)) plan.push_back({id, u.overwrite});
    // kUnsupported (a daemon without an NVMe tier) and other failures only cost the hint.
    if (Status st = of(lane).set_plan(opts_.pool, plan); st.code() == Code::kUnsupported)
      no_tiering_.store(true, std::memory_order_relaxed);
  }

  Result<CommitMarker> read_marker() override {
    if (marker_id_ == 0) {  // before open(): the marker an earlier run left, if any
      CommitMarker m;
      auto got = read_named(kMarkerName, std::as_writable_bytes(std::span<CommitMarker>(&m, 1)));
      if (!got) return fail(got.error());
      return *got ? m : CommitMarker{};
    }
    auto l = client_->lease(marker_id_, LeaseMode::kRead, LeaseWait{kLeaseTimeoutMs});
    if (!l) return fail(l.error());
    CommitMarker m;
    if (l->bytes().size() < sizeof m) return fail(Code::kInternal, "commit marker too small");
    std::memcpy(&m, l->bytes().data(), sizeof m);
    return m;
  }

  // Only the step field changes between commits of one run, and it is written with one
  // aligned 8-byte atomic store: a rank killed at any instant leaves either the old or the new
  // step, never a torn value. The other fields are written when the run (re)initializes.
  Status write_marker(const CommitMarker& m) override {
    auto l = client_->lease(marker_id_, LeaseMode::kWrite, LeaseWait{kLeaseTimeoutMs});
    if (!l) return l.error();
    auto* dst = reinterpret_cast<CommitMarker*>(l->bytes().data());
    if (dst->magic != m.magic || dst->ranks != m.ranks || dst->config_hash != m.config_hash) {
      std::atomic_ref<uint64_t>(dst->magic).store(0, std::memory_order_release);
      dst->ranks = m.ranks;
      dst->config_hash = m.config_hash;
      std::atomic_ref<uint64_t>(dst->step).store(m.step, std::memory_order_release);
      std::atomic_ref<uint64_t>(dst->magic).store(m.magic, std::memory_order_release);
    } else {
      std::atomic_ref<uint64_t>(dst->step).store(m.step, std::memory_order_release);
    }
    return l->release();
  }

  Result<bool> read_named(const std::string& name, std::span<std::byte> out) override {
    auto t = client_->open_tensor(opts_.pool, name);
    if (!t) {
      if (t.error().code() == Code::kNotFound) return false;
      return fail(t.error());
    }
    if (t->size != out.size()) return false;
    auto l = client_->lease(t->id, LeaseMode::kRead, LeaseWait{kLeaseTimeoutMs});
    if (!l) return fail(l.error());
    std::memcpy(out.data(), l->bytes().data(), out.size());
    if (auto s = l->release(); !s) return fail(s);
    return true;
  }

  Status drop_named(const std::string& name) override {
    Status s = client_->delete_tensor(opts_.pool, name);
    return s.code() == Code::kNotFound ? Status{} : s;
  }

  Result<std::vector<std::string>> names() override {
    auto ts = client_->list_tensors(opts_.pool);
    if (!ts) return fail(ts.error());
    std::vector<std::string> out;
    out.reserve(ts->size());
    for (auto& t : *ts) out.push_back(std::move(t.name));
    return out;
  }

  Status snapshot(uint64_t tag, uint32_t keep) override {
    auto s = client_->snapshot(opts_.pool, SnapshotOptions{tag, keep});
    return s ? Status{} : s.error();
  }

  Result<SnapshotState> snapshots() override {
    auto l = client_->list_snapshots(opts_.pool);
    SnapshotState out;
    if (!l && l.error().code() == Code::kNotFound) return out;  // this daemon never held the job
    if (!l) return fail(l.error());
    out.recovered = l->recovered;
    for (const auto& e : l->snapshots) out.snapshots.emplace_back(e.snapshot_id, e.tag);
    return out;
  }

  Status restore(uint64_t id) override {
    auto r = client_->restore_snapshot(opts_.pool, id);
    return r ? Status{} : r.error();
  }

  uint64_t bytes() const override { return bytes_; }
  Client* client() override { return client_.get(); }

  NvmeIo nvme_io() override {
    auto st = client_->status();
    if (!st) return {};
    return {static_cast<int64_t>(st->bytes_read), static_cast<int64_t>(st->bytes_written)};
  }

 private:
  Client& of(Lane lane) { return lane == Lane::kOptimizer && opt_client_ ? *opt_client_ : *client_; }

  static size_t index(const ShardRef& r) {
    return (static_cast<size_t>(r.layer) * kShardKinds + static_cast<size_t>(r.kind)) * 2 +
           static_cast<size_t>(r.buffer & 1);
  }
  uint64_t lookup(const ShardRef& r) const {
    const size_t i = index(r);
    return r.layer >= 0 && i < ids_.size() ? ids_[i] : 0;
  }
  // The tensor ids of the shards this rank has (for hints: unknown refs are skipped).
  std::vector<uint64_t> known_ids(std::span<const ShardRef> refs) const {
    std::vector<uint64_t> ids;
    for (const auto& r : refs)
      if (uint64_t id = lookup(r)) ids.push_back(id);
    return ids;
  }

  Result<uint64_t> create(const std::string& name, uint64_t size, std::vector<int64_t> shape,
                          DType dtype = DType::kF32) {
    TensorDesc d;
    d.name = name;
    d.size = size;
    d.dtype = dtype;
    d.shape = std::move(shape);
    d.placement = placement_;
    auto t = client_->create_tensor(opts_.pool, d, /*exist_ok=*/true);
    if (!t && t.error().code() != Code::kAlreadyExists) return fail(t.error());
    if (!t || t->size != size) {
      // Left over from another model or rank count: replace it.
      if (auto s = client_->delete_tensor(opts_.pool, name); !s) return fail(s);
      t = client_->create_tensor(opts_.pool, d, /*exist_ok=*/false);
      if (!t) return fail(t.error());
    }
    return t->id;
  }

  // --offload-checkpoints: block l's input [ckpt_floats] for l = 1..L. Without, this rank's
  // that an earlier run of the job left are deleted (their bytes are of no use to anyone);
  // only those that exist, as tierd counts every refused request as an error.
  Status open_checkpoints(const StoreLayout& layout) {
    std::vector<std::string> held;
    if (layout.ckpt_floats == 0) {
      auto n = names();
      if (!n) return n.error();
      held = std::move(*n);
    }
    for (size_t l = 1; l < layout.shard_floats.size(); ++l) {
      const ShardRef ref{static_cast<int>(l), ShardKind::kCkpt, 0};
      const std::string name = shard_tensor_name(layout.rank, ref);
      if (layout.ckpt_floats == 0) {
        if (std::ranges::find(held, name) != held.end())
          if (Status s = client_->delete_tensor(opts_.pool, name); !s) return s;
        continue;
      }
      const uint64_t size = layout.ckpt_floats * sizeof(float);
      auto id = create(name, size, {static_cast<int64_t>(layout.ckpt_floats)});
      if (!id) return id.error();
      ids_[index(ref)] = *id;
      bytes_ += size;
    }
    return {};
  }

  Result<Pinned> pin(Lease lease, const ShardRef& ref) {
    const size_t want = ref.kind == ShardKind::kCkpt ? layout_.ckpt_floats
                                                     : layout_.shard_floats[static_cast<size_t>(ref.layer)];
    const size_t want_bytes = want * shard_elem_bytes(ref.kind, layout_.precision);
    if (lease.bytes().size() < want_bytes)
      return fail(Code::kInternal,
                  fmt::format("lease of {} is {} bytes, want {}", shard_tensor_name(layout_.rank, ref),
                              lease.bytes().size(), want_bytes));
    Pinned p;
    p.data = reinterpret_cast<float*>(lease.bytes().data());
    p.floats = want;
    p.pin = std::make_shared<Lease>(std::move(lease));
    return p;
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<Client> opt_client_;  // Lane::kOptimizer's connection (its own plan), or null
  TierStoreOptions opts_;
  StoreLayout layout_;
  std::vector<uint64_t> ids_;
  uint64_t marker_id_ = 0;
  std::string domain_ = daemon_identity(opts_.socket.empty() ? default_socket_path() : opts_.socket);
  uint64_t bytes_ = 0;
  Placement placement_;
  std::atomic<bool> no_tiering_{false};  // the daemon answered kUnsupported: no hints
};

}  // namespace

Result<std::unique_ptr<ShardStore>> make_tier_store(const TierStoreOptions& o) {
  ConnectOptions co;
  co.client_name = "tier-train";
  co.connect_timeout = std::chrono::milliseconds(5000);
  auto c = Client::connect(o.socket, co);
  if (!c) return fail(c.error());
  std::unique_ptr<Client> opt;
  if (o.optimizer_lane) {
    co.client_name = "tier-train optimizer";
    auto oc = Client::connect(o.socket, co);
    if (!oc) return fail(oc.error());
    opt = std::move(*oc);
  }
  return std::unique_ptr<ShardStore>(new TierStore(std::move(*c), std::move(opt), o));
}

}  // namespace tier::train
