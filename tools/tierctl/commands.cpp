#include "commands.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "table.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

namespace tier::ctl {

using nlohmann::json;

namespace {

void print_json(const json& j) { std::printf("%s\n", j.dump(2).c_str()); }

std::string uptime(uint64_t ms) {
  uint64_t s = ms / 1000, d = s / 86400, h = s % 86400 / 3600, m = s % 3600 / 60;
  char buf[64];
  if (d)
    std::snprintf(buf, sizeof buf, "%llud %lluh %llum", (unsigned long long)d, (unsigned long long)h,
                  (unsigned long long)m);
  else if (h) std::snprintf(buf, sizeof buf, "%lluh %llum", (unsigned long long)h, (unsigned long long)m);
  else if (m)
    std::snprintf(buf, sizeof buf, "%llum %llus", (unsigned long long)m, (unsigned long long)(s % 60));
  else std::snprintf(buf, sizeof buf, "%.1fs", ms / 1000.0);
  return buf;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "-";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

std::string tiers_str(uint8_t t) {
  std::string s;
  if (t & kTierRam) s += "ram";
  if (t & kTierNvme) s += s.empty() ? "nvme" : "+nvme";
  return s.empty() ? "-" : s;
}

std::string node_str(int32_t n) { return n < 0 ? "-" : std::to_string(n); }

json tensor_json(const TensorInfo& t) {
  return {{"id", t.id},
          {"name", t.name},
          {"size", t.size},
          {"dtype", std::string(dtype_name(t.dtype))},
          {"shape", t.shape},
          {"numa_node", t.numa_node},
          {"ram", (t.tiers & kTierRam) != 0},
          {"nvme", (t.tiers & kTierNvme) != 0},
          {"dirty", t.dirty},
          {"readers", t.readers},
          {"writer", t.writer}};
}

// The whole of `len` bytes through read/write, retrying short transfers and EINTR.
Status read_all(int fd, std::byte* p, size_t len, const std::string& file) {
  while (len > 0) {
    ssize_t n = ::read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "read " + file);
    if (n == 0) return Status(Code::kIo, file + " shrank while it was being read");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::ok();
}
Status write_all(int fd, const std::byte* p, size_t len, const std::string& file) {
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::from_errno(errno, "write " + file);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::ok();
}

// An owned file descriptor, closed once (movable, not copyable).
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) ::close(fd);
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Result<TensorInfo> find_tensor(Client& c, const std::string& pool, const std::string& name) {
  auto t = c.open_tensor(pool, name);
  if (!t && t.error().code() == Code::kNotFound && t.error().message().empty())
    return fail(Code::kNotFound, "no tensor named '" + name + "' in pool '" + pool + "'");
  return t;
}

}  // namespace

std::string owner_name(uint32_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr && pw.pw_name != nullptr)
    return pw.pw_name;
  return std::to_string(uid);
}

json pool_json(const PoolInfo& p) {
  return {{"id", p.id},
          {"name", p.name},
          {"owner_uid", p.owner_uid},
          {"owner", owner_name(p.owner_uid)},
          {"ram_quota", p.ram_quota},
          {"ram_used", p.ram_used},
          {"nvme_quota", p.nvme_quota},
          {"nvme_used", p.nvme_used},
          {"tensors", p.tensor_count},
          {"group", p.group_read ? json(p.group) : json(nullptr)},
          {"group_read", p.group_read}};
}

json status_json(const NodeStatus& s, const std::string& socket) {
  json ram = json::array(), nvme = json::array();
  for (const auto& r : s.ram)
    ram.push_back({{"node", r.node},
                   {"capacity", r.capacity},
                   {"used", r.used},
                   {"dirty", r.dirty},
                   {"tensors", r.tensors}});
  for (const auto& n : s.nvme)
    nvme.push_back({{"path", n.path},
                    {"numa_node", n.numa_node},
                    {"backend", n.backend},
                    {"capacity", n.capacity},
                    {"used", n.used}});
  return {{"socket", socket},
          {"daemon_version", s.daemon_version},
          {"uptime_ms", s.uptime_ms},
          {"clients", s.clients},
          {"pools", s.pools},
          {"leases", s.leases},
          {"ram", ram},
          {"nvme", nvme},
          {"counters",
           {{"nvme_bytes_read", s.bytes_read},
            {"nvme_bytes_written", s.bytes_written},
            {"hits", s.hits},
            {"misses", s.misses},
            {"stalls", s.stalls},
            {"evictions", s.evictions},
            {"prefetches", s.prefetches},
            {"requests", s.requests},
            {"errors", s.errors}}}};
}

Status cmd_status(Client& c, const Output& o) {
  auto s = c.status();
  TIER_TRY(s);
  if (o.json) {
    print_json(status_json(*s, c.socket_path()));
    return Status::ok();
  }
  std::printf("tierd %s at %s, up %s\n", s->daemon_version.c_str(), c.socket_path().c_str(),
              uptime(s->uptime_ms).c_str());
  std::printf("%u client(s), %u pool(s), %llu lease(s) held\n\n", s->clients, s->pools,
              (unsigned long long)s->leases);
  std::printf("RAM tier\n");
  Table ram({"NODE", "CAPACITY", "USED", "DIRTY", "TENSORS"}, {true, true, true, true, true});
  for (const auto& r : s->ram)
    ram.add({std::to_string(r.node), format_size(r.capacity), format_size(r.used), format_size(r.dirty),
             std::to_string(r.tensors)});
  ram.print(stdout, "  ");
  std::printf("\nNVMe tier\n");
  if (s->nvme.empty()) {
    std::printf("  (none configured)\n");
  } else {
    Table nv({"PATH", "NODE", "BACKEND", "CAPACITY", "USED"}, {false, true, false, true, true});
    for (const auto& n : s->nvme)
      nv.add({n.path, node_str(n.numa_node), n.backend, format_size(n.capacity), format_size(n.used)});
    nv.print(stdout, "  ");
  }
  std::printf("\nCounters\n");
  Table ct({"NAME", "VALUE"}, {false, true});
  ct.add({"nvme read", format_size(s->bytes_read)});
  ct.add({"nvme written", format_size(s->bytes_written)});
  ct.add({"hits", std::to_string(s->hits)});
  ct.add({"misses", std::to_string(s->misses)});
  ct.add({"stalls", std::to_string(s->stalls)});
  ct.add({"evictions", std::to_string(s->evictions)});
  ct.add({"prefetches", std::to_string(s->prefetches)});
  ct.add({"requests", std::to_string(s->requests)});
  ct.add({"errors", std::to_string(s->errors)});
  ct.print(stdout, "  ");
  return Status::ok();
}

Status cmd_topo(Client& c, const Output& o) {
  auto t = c.topology();
  TIER_TRY(t);
  auto devs_json = [](const std::vector<TopoDevice>& v) {
    json a = json::array();
    for (const auto& d : v)
      a.push_back({{"index", d.index}, {"name", d.name}, {"pci", d.pci}, {"numa_node", d.numa_node}});
    return a;
  };
  if (o.json) {
    json nodes = json::array();
    for (const auto& n : t->nodes) nodes.push_back({{"id", n.id}, {"memory", n.memory}, {"cpus", n.cpus}});
    print_json({{"source", t->source},
                {"nodes", nodes},
                {"gpus", devs_json(t->gpus)},
                {"nvme", devs_json(t->nvme)}});
    return Status::ok();
  }
  std::printf("topology from %s\n\nNUMA nodes\n", t->source.c_str());
  Table nodes({"NODE", "MEMORY", "CPUS"}, {true, true, false});
  for (const auto& n : t->nodes) nodes.add({std::to_string(n.id), format_size(n.memory), n.cpus});
  nodes.print(stdout, "  ");
  auto devs = [](const char* title, const std::vector<TopoDevice>& v) {
    std::printf("\n%s\n", title);
    if (v.empty()) {
      std::printf("  (none)\n");
      return;
    }
    Table tb({"INDEX", "NAME", "PCI", "NODE"}, {true, false, false, true});
    for (const auto& d : v) tb.add({std::to_string(d.index), d.name, d.pci, node_str(d.numa_node)});
    tb.print(stdout, "  ");
  };
  devs("GPUs", t->gpus);
  devs("NVMe devices", t->nvme);
  return Status::ok();
}

Status cmd_pools(Client& c, const Output& o) {
  auto pools = c.list_pools();
  TIER_TRY(pools);
  if (o.json) {
    json a = json::array();
    for (const auto& p : *pools) a.push_back(pool_json(p));
    print_json({{"pools", a}});
    return Status::ok();
  }
  if (pools->empty()) {
    std::printf("no pools\n");
    return Status::ok();
  }
  Table tb({"NAME", "ID", "OWNER", "GROUP", "TENSORS", "RAM USED", "RAM QUOTA", "NVME USED", "NVME QUOTA"},
           {false, true, true, true, true, true, true, true, true});
  for (const auto& p : *pools)
    tb.add({p.name, std::to_string(p.id), owner_name(p.owner_uid),
            p.group_read ? std::to_string(p.group) + " (read)" : "-", std::to_string(p.tensor_count),
            format_size(p.ram_used), format_size(p.ram_quota), format_size(p.nvme_used),
            format_size(p.nvme_quota)});
  tb.print();
  return Status::ok();
}

Status cmd_tensors(Client& c, const Output& o, const std::string& pool) {
  auto ts = c.list_tensors(pool);
  TIER_TRY(ts);
  if (o.json) {
    json a = json::array();
    for (const auto& t : *ts) a.push_back(tensor_json(t));
    print_json({{"pool", pool}, {"tensors", a}});
    return Status::ok();
  }
  if (ts->empty()) {
    std::printf("no tensors in pool '%s'\n", pool.c_str());
    return Status::ok();
  }
  Table tb({"NAME", "ID", "SIZE", "DTYPE", "SHAPE", "NODE", "TIERS", "DIRTY", "LEASES"},
           {false, true, true, false, false, true, false, false, false});
  for (const auto& t : *ts) {
    std::string leases = t.writer ? "write" : t.readers ? std::to_string(t.readers) + " read" : "-";
    tb.add({t.name, std::to_string(t.id), format_size(t.size), std::string(dtype_name(t.dtype)),
            shape_str(t.shape), node_str(t.numa_node), tiers_str(t.tiers), t.dirty ? "yes" : "no", leases});
  }
  tb.print();
  return Status::ok();
}

// Where put's bytes come from: a regular file (its size known up front, read straight into the
// lease), or anything else (a pipe, `-` for stdin, a character device), read to EOF into memory
// first, since a tensor's size is fixed at its creation.
struct PutSource {
  Fd fd;
  std::string label;  // for messages: the file's name, or "stdin"
  uint64_t size = 0;
  std::vector<std::byte> buffered;  // the bytes of a source that is not a regular file
  bool regular = false;

  Status copy_to(std::byte* dst) {
    if (!regular) {
      std::memcpy(dst, buffered.data(), buffered.size());
      return Status::ok();
    }
    return read_all(fd.fd, dst, size, label);
  }
};

Result<PutSource> open_put_source(const std::string& file) {
  PutSource src;
  const bool stdin_ = file == "-";
  src.label = stdin_ ? "stdin" : file;
  src.fd.fd = stdin_ ? ::dup(0) : ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (src.fd.fd < 0) return std::unexpected(Status::from_errno(errno, "open " + src.label));
  struct stat st{};
  if (::fstat(src.fd.fd, &st) != 0) return std::unexpected(Status::from_errno(errno, "stat " + src.label));
  if (S_ISDIR(st.st_mode))
    return std::unexpected(Status(Code::kInvalidArgument, src.label + " is a directory"));
  src.regular = S_ISREG(st.st_mode);
  if (src.regular) {
    src.size = static_cast<uint64_t>(st.st_size);
  } else {
    std::byte chunk[1 << 16];
    for (;;) {
      ssize_t n = ::read(src.fd.fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return std::unexpected(Status::from_errno(errno, "read " + src.label));
      if (n == 0) break;
      src.buffered.insert(src.buffered.end(), chunk, chunk + n);
    }
    src.size = src.buffered.size();
  }
  if (src.size == 0)
    return std::unexpected(
        Status(Code::kInvalidArgument, src.label + " is empty; a tensor holds at least one byte"));
  return src;
}

Status cmd_put(Client& c, const Output& o, const std::string& pool, const std::string& name,
               const std::string& file, const PutOptions& p) {
  auto source = open_put_source(file);
  TIER_TRY(source);
  PutSource& in = *source;
  const uint64_t size = in.size;

  // What this put creates goes again when a later step fails: a failed put leaves nothing
  // behind (the daemon refuses up front a tensor that could never be leased; a lease can still
  // time out or find RAM and NVMe full, and the file can shrink while it is read).
  // Whether this put creates the pool is decided by a create without exist_ok; the list only
  // spares an existing pool that refusal (an error answer in the daemon's status). A pool the
  // list misses (another uid's, or past what one reply holds) is refused and then opened.
  bool pool_created = false, created = false;
  auto pools = c.list_pools();
  TIER_TRY(pools);
  const bool listed =
      std::any_of(pools->begin(), pools->end(), [&](const PoolInfo& x) { return x.name == pool; });
  Result<PoolInfo> pi = fail(Code::kAlreadyExists, "");
  if (!listed) {
    pi = c.create_pool(pool, PoolOptions{.ram_quota = p.ram_quota}, /*exist_ok=*/false);
    pool_created = pi.has_value();
  }
  if (!pi && pi.error().code() == Code::kAlreadyExists)
    pi = c.create_pool(pool, PoolOptions{.ram_quota = p.ram_quota}, /*exist_ok=*/true);
  TIER_TRY(pi);
  auto undo = [&](Status st) {
    if (created) (void)c.delete_tensor(pool, name);
    if (pool_created) (void)c.drop_pool(pool);
    return st;
  };
  // In an empty pool the tensor is new: no lookup first (its kNotFound would count as an error
  // answer in the daemon's status).
  auto t = pi->tensor_count == 0 ? Result<TensorInfo>(fail(Code::kNotFound, "")) : c.open_tensor(pool, name);
  if (!t && t.error().code() == Code::kNotFound) {
    t = c.create_tensor(pool, TensorDesc{.name = name, .size = size, .shape = {}, .placement = {}},
                        /*exist_ok=*/false);
    created = t.has_value();
  }
  if (!t) return undo(t.error());
  if (t->size != size)
    return Status(Code::kInvalidArgument,
                  "tensor '" + name + "' in pool '" + pool + "' is " + std::to_string(t->size) +
                      " bytes but " + in.label + " is " + std::to_string(size) +
                      " bytes; delete it first (tierctl rm) or put a file of the same size");
  // An overwrite lease: every byte is written from the file, so the tensor's old bytes are never
  // read (a tensor only on NVMe is not fetched, and one whose NVMe copy is corrupt can be
  // replaced). The lease is released before any undo.
  auto write = [&]() -> Status {
    auto lease = c.lease(t->id, LeaseMode::kOverwrite, LeaseWait{p.wait_ms});
    TIER_TRY(lease);
    TIER_TRY(in.copy_to(lease->bytes().data()));
    return lease->release();
  };
  if (Status st = write(); !st) return undo(std::move(st));
  if (o.json) {
    print_json({{"pool", pool},
                {"tensor", name},
                {"id", t->id},
                {"bytes", size},
                {"created", created},
                {"file", file}});
  } else {
    std::printf("put %s -> %s/%s (%s%s)\n", in.label.c_str(), pool.c_str(), name.c_str(),
                format_size(size).c_str(), created ? ", new tensor" : "");
  }
  return Status::ok();
}

Status cmd_get(Client& c, const Output& o, const std::string& pool, const std::string& name,
               const std::string& file, int32_t wait_ms) {
  auto t = find_tensor(c, pool, name);
  TIER_TRY(t);
  auto lease = c.lease(t->id, LeaseMode::kRead, LeaseWait{wait_ms});
  TIER_TRY(lease);
  // `-`: the bytes go to stdout, and the summary (table or JSON) to stderr so as not to mix in.
  const bool to_stdout = file == "-";
  const std::string label = to_stdout ? "stdout" : file;
  Fd out{to_stdout ? ::dup(1) : ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (out.fd < 0) return Status::from_errno(errno, "create " + label);
  auto bytes = lease->bytes();
  TIER_TRY(write_all(out.fd, bytes.data(), bytes.size(), label));
  TIER_TRY(lease->release());
  if (::close(std::exchange(out.fd, -1)) != 0) return Status::from_errno(errno, "close " + label);
  std::FILE* summary = to_stdout ? stderr : stdout;
  if (o.json) {
    json j = {{"pool", pool}, {"tensor", name}, {"id", t->id}, {"bytes", bytes.size()}, {"file", file}};
    std::fprintf(summary, "%s\n", j.dump(2).c_str());
  } else {
    std::fprintf(summary, "get %s/%s -> %s (%s)\n", pool.c_str(), name.c_str(), label.c_str(),
                 format_size(bytes.size()).c_str());
  }
  return Status::ok();
}

Status cmd_rm(Client& c, const Output& o, const std::string& pool, const std::string& name) {
  TIER_TRY(c.delete_tensor(pool, name));
  if (o.json) print_json({{"pool", pool}, {"tensor", name}, {"deleted", true}});
  else std::printf("deleted %s/%s\n", pool.c_str(), name.c_str());
  return Status::ok();
}

Status cmd_evict(Client& c, const Output& o, const std::string& pool, const std::string& name) {
  std::vector<uint64_t> ids;
  if (!name.empty()) {
    auto t = find_tensor(c, pool, name);
    TIER_TRY(t);
    ids.push_back(t->id);
  }
  TIER_TRY(c.evict(pool, ids));
  std::string what = name.empty() ? "every unleased tensor of " + pool : pool + "/" + name;
  if (o.json)
    print_json({{"pool", pool}, {"tensor", name.empty() ? json(nullptr) : json(name)}, {"evicted", true}});
  else std::printf("evicted %s\n", what.c_str());
  return Status::ok();
}

Status cmd_prefetch(Client& c, const Output& o, const std::string& pool, const std::string& name) {
  auto t = find_tensor(c, pool, name);
  TIER_TRY(t);
  uint64_t id = t->id;
  TIER_TRY(c.prefetch(pool, {&id, 1}));
  if (o.json) print_json({{"pool", pool}, {"tensor", name}, {"queued", true}});
  else std::printf("prefetch of %s/%s queued\n", pool.c_str(), name.c_str());
  return Status::ok();
}

Status cmd_snapshot(Client& c, const Output& o, const std::string& pool, const SnapshotOptions& opts) {
  auto s = (opts.tag == 0 && opts.keep == 1) ? c.snapshot(pool) : c.snapshot(pool, opts);
  TIER_TRY(s);
  if (o.json) {
    print_json(
        {{"pool", pool}, {"snapshot_id", s->snapshot_id}, {"bytes", s->bytes}, {"stall_us", s->stall_us}});
  } else {
    std::printf("snapshot %llu of %s: %s durable (pool frozen %.3f ms)\n", (unsigned long long)s->snapshot_id,
                pool.c_str(), format_size(s->bytes).c_str(), s->stall_us / 1000.0);
  }
  return Status::ok();
}

Status cmd_snapshots(Client& c, const Output& o, const std::string& pool) {
  auto l = c.list_snapshots(pool);
  TIER_TRY(l);
  if (o.json) {
    json a = json::array();
    for (const auto& e : l->snapshots)
      a.push_back({{"snapshot_id", e.snapshot_id}, {"tag", e.tag}, {"bytes", e.bytes}});
    print_json({{"pool", pool},
                {"recovered", l->recovered},
                {"recovered_from", l->recovered_from},
                {"lost", l->lost},
                {"snapshots", a}});
    return Status::ok();
  }
  if (l->recovered)
    std::printf(
        "pool %s was rebuilt after its RAM was lost: snapshot %llu plus newer NVMe copies, %llu tensor(s) "
        "lost; restore a snapshot for one point in time\n",
        pool.c_str(), (unsigned long long)l->recovered_from, (unsigned long long)l->lost);
  if (l->snapshots.empty()) {
    std::printf("pool %s has no durable snapshot\n", pool.c_str());
    return Status::ok();
  }
  std::printf("%-12s %-20s %s\n", "SNAPSHOT", "TAG", "BYTES");
  for (const auto& e : l->snapshots)
    std::printf("%-12llu %-20s %s\n", (unsigned long long)e.snapshot_id,
                e.tag ? std::to_string(e.tag).c_str() : "-", format_size(e.bytes).c_str());
  return Status::ok();
}

Status cmd_restore(Client& c, const Output& o, const std::string& pool, uint64_t snapshot_id) {
  auto r = c.restore_snapshot(pool, snapshot_id);
  TIER_TRY(r);
  if (o.json) {
    print_json({{"pool", pool},
                {"snapshot_id", snapshot_id},
                {"tensors", r->tensors},
                {"bytes", r->bytes},
                {"deleted", r->deleted},
                {"dropped_snapshots", r->dropped_snapshots}});
  } else {
    std::printf(
        "pool %s restored to snapshot %llu: %llu tensor(s), %s; %llu deleted, %llu newer snapshot(s) "
        "dropped\n",
        pool.c_str(), (unsigned long long)snapshot_id, (unsigned long long)r->tensors,
        format_size(r->bytes).c_str(), (unsigned long long)r->deleted,
        (unsigned long long)r->dropped_snapshots);
  }
  return Status::ok();
}

Status cmd_drop(Client& c, const Output& o, const std::string& pool, bool yes) {
  if (!yes && ::isatty(0) && ::isatty(2)) {
    std::string what;
    if (auto pools = c.list_pools()) {
      for (const auto& p : *pools)
        if (p.name == pool)
          what = " (" + std::to_string(p.tensor_count) + " tensor(s), " + format_size(p.ram_used) + " RAM, " +
                 format_size(p.nvme_used) + " NVMe)";
    }
    std::fprintf(stderr, "drop pool '%s'%s and every tensor in it? [y/N] ", pool.c_str(), what.c_str());
    std::fflush(stderr);
    char answer[16] = {};
    if (std::fgets(answer, sizeof answer, stdin) == nullptr || (answer[0] != 'y' && answer[0] != 'Y'))
      return Status(Code::kInvalidArgument,
                    "not confirmed: pool '" + pool + "' not dropped (answer y, or pass --yes)");
  }
  TIER_TRY(c.drop_pool(pool));
  if (o.json) print_json({{"pool", pool}, {"dropped", true}});
  else std::printf("dropped pool %s\n", pool.c_str());
  return Status::ok();
}

Status cmd_metrics(Client& c, const Output& o) {
  auto m = c.metrics();
  TIER_TRY(m);
  if (o.json) print_json({{"format", "prometheus-text-0.0.4"}, {"text", *m}});
  else std::fputs(m->c_str(), stdout);
  return Status::ok();
}

}  // namespace tier::ctl
