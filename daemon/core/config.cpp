#include "core/config.hpp"
#include "core/listen_addr.hpp"

#include <fmt/format.h>
#include <toml++/toml.h>

#include "core/toml_text.hpp"
#include "tier/types.hpp"
#include "base/errors.hpp"
#include "base/sizes.hpp"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tier::daemon {

std::string_view hugepages_name(HugePages h) noexcept {
  switch (h) {
    case HugePages::kNone: return "none";
    case HugePages::k2M: return "2M";
    case HugePages::k1G: return "1G";
  }
  return "none";
}

uint64_t hugepage_bytes(HugePages h) noexcept {
  switch (h) {
    case HugePages::kNone: return 0;
    case HugePages::k2M: return 2ull << 20;
    case HugePages::k1G: return 1ull << 30;
  }
  return 0;
}

Result<HugePages> parse_hugepages(std::string_view s) {
  if (s == "none" || s == "off" || s.empty()) return HugePages::kNone;
  if (s == "2M" || s == "2m") return HugePages::k2M;
  if (s == "1G" || s == "1g") return HugePages::k1G;
  return fail(Code::kInvalidArgument, "hugepages must be none, 2M or 1G, not '" + std::string(s) + "'");
}

namespace {

// A size must parse both as an absolute value and as a percentage of something.
Status check_size(std::string_view key, const std::string& text) {
  auto r = parse_size(text, uint64_t{1} << 40);
  if (!r) return Status(Code::kInvalidArgument, std::string(key) + ": " + r.error().message());
  return Status::ok();
}

std::string where(const toml::node& n) {
  const auto& src = n.source();
  return "line " + std::to_string(src.begin.line);
}

Status bad_type(std::string_view key, const toml::node& n, std::string_view want) {
  return Status(Code::kInvalidArgument,
                "config key '" + std::string(key) + "' (" + where(n) + ") must be " + std::string(want));
}

Status get_string(std::string_view key, const toml::node& n, std::string& out) {
  if (auto v = n.value<std::string>(); v && n.is_string()) {
    out = *v;
    return Status::ok();
  }
  return bad_type(key, n, "a string");
}

// Sizes may be written as strings ("64G", "80%") or as plain integers (bytes).
Status get_size(std::string_view key, const toml::node& n, std::string& out) {
  if (n.is_integer()) {
    int64_t v = *n.value<int64_t>();
    if (v < 0) return bad_type(key, n, "a non-negative size");
    out = std::to_string(v);
    return Status::ok();
  }
  if (!n.is_string()) return bad_type(key, n, "a size such as \"64G\" or \"80%\"");
  out = *n.value<std::string>();
  return check_size(key, out);
}

Status get_u32(std::string_view key, const toml::node& n, uint32_t& out, uint32_t lo) {
  if (!n.is_integer()) return bad_type(key, n, "an integer");
  int64_t v = *n.value<int64_t>();
  if (v < lo || v > UINT32_MAX)
    return bad_type(key, n, "an integer in [" + std::to_string(lo) + ", 4294967295]");
  out = static_cast<uint32_t>(v);
  return Status::ok();
}

Status get_bool(std::string_view key, const toml::node& n, bool& out) {
  if (!n.is_boolean()) return bad_type(key, n, "true or false");
  out = *n.value<bool>();
  return Status::ok();
}

// Pure: the same directory written twice (up to "." and "//"); check_nvme_dirs() also finds
// other paths to one directory and one file system.
Status check_nvme_listed_once(const std::vector<NvmeDir>& dirs, const std::string& path,
                              const std::string& where_text) {
  const std::filesystem::path norm = std::filesystem::path(path).lexically_normal();
  for (const NvmeDir& d : dirs)
    if (std::filesystem::path(d.path).lexically_normal() == norm)
      return Status(Code::kInvalidArgument,
                    fmt::format("nvme directory '{}' ({}) is listed twice: its space would count twice", path,
                                where_text));
  return Status::ok();
}

Status parse_nvme(const toml::node& n, std::vector<NvmeDir>& out) {
  const toml::array* arr = n.as_array();
  if (!arr) return bad_type("nvme", n, "an array of tables: nvme = [{ path = \"/mnt/nvme0\" }]");
  for (const toml::node& e : *arr) {
    const toml::table* t = e.as_table();
    if (!t) return bad_type("nvme", e, "an array of tables: nvme = [{ path = \"/mnt/nvme0\" }]");
    NvmeDir d;
    bool have_path = false;
    for (const auto& [k, v] : *t) {
      std::string_view key = k.str();
      if (key == "path") {
        TIER_TRY(get_string("nvme.path", v, d.path));
        have_path = true;
      } else if (key == "numa_node") {
        if (!v.is_integer()) return bad_type("nvme.numa_node", v, "an integer");
        int64_t x = *v.value<int64_t>();
        if (x < -1 || x > 4095) return bad_type("nvme.numa_node", v, "-1 or a NUMA node number");
        d.numa_node = static_cast<int32_t>(x);
      } else {
        return Status(Code::kInvalidArgument,
                      "unknown config key 'nvme." + std::string(key) + "' (" + where(v) + ")");
      }
    }
    if (!have_path || d.path.empty())
      return Status(Code::kInvalidArgument, "an nvme entry (" + where(e) + ") needs a path");
    TIER_TRY(check_nvme_listed_once(out, d.path, where(e)));
    out.push_back(std::move(d));
  }
  return Status::ok();
}

Status get_fraction(std::string_view key, const toml::node& n, double& out) {
  std::optional<double> x = n.value<double>();
  if (!x || !(*x > 0.0) || *x > 1.0) return bad_type(key, n, "a number in (0, 1]");
  out = *x;
  return Status::ok();
}

Status apply_table(const toml::table& tbl, Config& c) {
  for (const auto& [k, v] : tbl) {
    std::string_view key = k.str();
    Status st;
    if (key == "socket") st = get_string(key, v, c.socket);
    else if (key == "state_dir") st = get_string(key, v, c.state_dir);
    else if (key == "ram") st = get_size(key, v, c.ram);
    else if (key == "pool_quota") st = get_size(key, v, c.pool_quota);
    else if (key == "nvme_pool_quota") st = get_size(key, v, c.nvme_pool_quota);
    else if (key == "alignment") st = get_size(key, v, c.alignment);
    else if (key == "hugepages") {
      std::string s;
      st = get_string(key, v, s);
      if (st) {
        auto h = parse_hugepages(s);
        TIER_TRY(h);
        c.hugepages = *h;
      }
    } else if (key == "hugetlbfs_mount") st = get_string(key, v, c.hugetlbfs_mount);
    else if (key == "topology") st = get_string(key, v, c.topology);
    else if (key == "nvme") st = parse_nvme(v, c.nvme);
    else if (key == "admin_group") st = get_string(key, v, c.admin_group);
    else if (key == "watchdog") st = get_bool(key, v, c.watchdog);
    else if (key == "status_interval_ms") st = get_u32(key, v, c.status_interval_ms, 100);
    else if (key == "max_clients") st = get_u32(key, v, c.max_clients, 1);
    else if (key == "max_leases_per_client") st = get_u32(key, v, c.max_leases_per_client, 1);
    else if (key == "remove_arenas_on_exit") st = get_bool(key, v, c.remove_arenas_on_exit);
    else if (key == "ram_high_watermark") st = get_fraction(key, v, c.ram_high_watermark);
    else if (key == "ram_low_watermark") st = get_fraction(key, v, c.ram_low_watermark);
    else if (key == "ram_dirty_background") st = get_fraction(key, v, c.ram_dirty_background);
    else if (key == "nvme_capacity") {
      if (v.is_string() && v.value<std::string>()->empty()) c.nvme_capacity.clear();
      else st = get_size(key, v, c.nvme_capacity);
    } else if (key == "nvme_hash_threads") {
      st = get_u32(key, v, c.nvme_hash_threads, 0);
      if (st && c.nvme_hash_threads > 256) return bad_type(key, v, "an integer in [0, 256]");
    } else if (key == "nvme_flush_behind") {
      std::string text;
      if (st = get_size(key, v, text); st) {
        auto bytes = parse_size(text);  // without a total to take it of, a percentage is refused
        if (!bytes) return bad_type(key, v, "a size in bytes such as \"64M\" (\"0\": off), not a percentage");
        c.nvme_flush_behind = *bytes;
      }
    } else if (key == "uid_ram_quota") st = get_size(key, v, c.uid_ram_quota);
    else if (key == "uid_nvme_quota") st = get_size(key, v, c.uid_nvme_quota);
    else if (key == "max_connections_per_uid") st = get_u32(key, v, c.max_connections_per_uid, 1);
    else if (key == "max_pools_per_uid") st = get_u32(key, v, c.max_pools_per_uid, 1);
    else if (key == "uid_pinned_quota") st = get_size(key, v, c.uid_pinned_quota);
    else if (key == "max_reply_bytes_per_connection" || key == "max_reply_bytes_per_uid") {
      std::string text;
      if (st = get_size(key, v, text); st) {
        auto bytes = parse_size(text);
        if (!bytes || *bytes < (uint64_t{64} << 10))
          return bad_type(key, v, "a size in bytes of at least 64K such as \"4M\", not a percentage");
        (key == "max_reply_bytes_per_uid" ? c.max_reply_bytes_per_uid : c.max_reply_bytes_per_connection) =
            *bytes;
      }
    } else if (key == "metrics_http_per_pool") st = get_bool(key, v, c.metrics_http_per_pool);
    else if (key == "max_waiters_per_client") st = get_u32(key, v, c.max_waiters_per_client, 1);
    else if (key == "lease_reclaim_timeout_ms") st = get_u32(key, v, c.lease_reclaim_timeout_ms, 0);
    else if (key == "snapshot_free_floor") st = get_size(key, v, c.snapshot_free_floor);
    else if (key == "journal_reserve") st = get_size(key, v, c.journal_reserve);
    else if (key == "max_plan_uses") st = get_u32(key, v, c.max_plan_uses, 1);
    else if (key == "metrics_listen") {
      st = get_string(key, v, c.metrics_listen);
      if (st && !c.metrics_listen.empty()) {
        auto addr = parse_metrics_listen(c.metrics_listen);
        TIER_TRY(addr);
      }
    } else if (key == "prefault") st = get_bool(key, v, c.prefault);
    else if (key == "log_level") {
      st = get_string(key, v, c.log_level);
      if (st && c.log_level != "error" && c.log_level != "warning" && c.log_level != "info" &&
          c.log_level != "debug")
        return bad_type(key, v, "one of error, warning, info, debug");
    } else {
      return Status(Code::kInvalidArgument,
                    "unknown config key '" + std::string(key) + "' (" + where(v) + ")");
    }
    if (!st) return st;
  }
  return Status::ok();
}

Status check_alignment(const std::string& text) {
  auto a = parse_size(text);
  if (!a) return Status(Code::kInvalidArgument, "alignment: " + a.error().message());
  uint64_t x = *a;
  if (x < 4096 || x > (1ull << 30) || (x & (x - 1)) != 0)
    return Status(Code::kInvalidArgument,
                  "alignment must be a power of two between 4K and 1G, not '" + text + "'");
  return Status::ok();
}

}  // namespace

Result<Config> parse_config(std::string_view toml_text) {
  Config c;
  // toml++ 3.3.0 has undefined behaviour on some non-ASCII text outside strings (toml_text.hpp).
  if (auto bad = ::tier::toml_text::text_problem(toml_text); bad)
    return fail(Code::kInvalidArgument, "config syntax error at " + *bad);
  try {
    toml::table tbl = toml::parse(toml_text, std::string_view("config"));
    Status st = apply_table(tbl, c);
    if (!st) return fail(std::move(st));
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    return fail(Code::kInvalidArgument, "config syntax error at line " + std::to_string(src.begin.line) +
                                            ": " + std::string(e.description()));
  } catch (const std::exception& e) {
    return fail(Code::kInvalidArgument, std::string("config: ") + e.what());
  }
  TIER_TRY(check_alignment(c.alignment));
  if (c.state_dir.empty()) return fail(Code::kInvalidArgument, "state_dir must not be empty");
  if (c.ram_low_watermark > c.ram_high_watermark)
    return fail(Code::kInvalidArgument, "ram_low_watermark must not exceed ram_high_watermark");
  return c;
}

Result<Config> load_config(const std::string& path) {
  std::ifstream f(path);
  if (!f) return fail(Status::from_errno(errno, "open config " + path));
  std::stringstream ss;
  ss << f.rdbuf();
  auto c = parse_config(ss.str());
  if (!c) return fail(c.error().code(), path + ": " + c.error().message());
  return c;
}

Status apply_overrides(Config& cfg, const Overrides& o) {
  if (o.socket) cfg.socket = *o.socket;
  if (o.state_dir) cfg.state_dir = *o.state_dir;
  if (o.ram) {
    TIER_TRY(check_size("--ram", *o.ram));
    cfg.ram = *o.ram;
  }
  if (o.pool_quota) {
    TIER_TRY(check_size("--pool-quota", *o.pool_quota));
    cfg.pool_quota = *o.pool_quota;
  }
  if (o.hugepages) {
    auto h = parse_hugepages(*o.hugepages);
    TIER_TRY(h);
    cfg.hugepages = *h;
  }
  if (o.topology) cfg.topology = *o.topology;
  for (const auto& d : o.nvme_dirs) {
    TIER_TRY(check_nvme_listed_once(cfg.nvme, d, "--nvme-dir"));
    cfg.nvme.push_back(NvmeDir{d, -1});
  }
  if (o.remove_arenas_on_exit) cfg.remove_arenas_on_exit = *o.remove_arenas_on_exit;
  if (cfg.state_dir.empty()) return Status(Code::kInvalidArgument, "the state dir must not be empty");
  return Status::ok();
}

Status check_nvme_dirs(const std::vector<NvmeDir>& dirs) {
  std::vector<struct stat> seen;
  for (size_t i = 0; i < dirs.size(); ++i) {
    struct stat st{};
    if (::stat(dirs[i].path.c_str(), &st) != 0)
      return Status::from_errno(errno, "nvme directory '" + dirs[i].path + "'");
    for (size_t j = 0; j < seen.size(); ++j) {
      if (seen[j].st_dev != st.st_dev) continue;
      if (seen[j].st_ino == st.st_ino)
        return Status(Code::kInvalidArgument, "nvme directory '" + dirs[i].path + "' is listed twice (as '" +
                                                  dirs[j].path + "' too): its space would count twice");
      return Status(Code::kInvalidArgument,
                    "nvme directories '" + dirs[j].path + "' and '" + dirs[i].path +
                        "' are on the same file system: its space would count twice; list one "
                        "directory per device");
    }
    seen.push_back(st);
  }
  return Status::ok();
}

Status check_socket_path(const std::string& path) {
  if (path.empty()) return Status(Code::kInvalidArgument, "the socket path is empty");
  if (path.size() >= sizeof(sockaddr_un::sun_path))
    return Status(Code::kInvalidArgument, "socket path '" + path + "' is " + std::to_string(path.size()) +
                                              " bytes; a Unix socket path has at most " +
                                              std::to_string(sizeof(sockaddr_un::sun_path) - 1));
  return Status::ok();
}

Status check_paths(const Config& cfg, bool create_state_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& d : cfg.nvme) {
    if (!fs::is_directory(d.path, ec))
      return Status(Code::kInvalidArgument, "nvme directory '" + d.path + "' is not a directory");
  }
  TIER_TRY(check_nvme_dirs(cfg.nvme));
  if (!create_state_dir) {
    fs::path a = fs::absolute(cfg.state_dir, ec);
    while (!a.empty() && !fs::exists(a, ec) && a.has_parent_path() && a != a.parent_path())
      a = a.parent_path();
    if (!fs::is_directory(a, ec))
      return Status(Code::kInvalidArgument, "cannot create state dir '" + cfg.state_dir + "': '" +
                                                a.string() + "' is not a directory");
  } else if (!fs::is_directory(cfg.state_dir, ec)) {
    fs::create_directories(cfg.state_dir, ec);
    if (ec)
      return Status(Code::kInvalidArgument,
                    "cannot create state dir '" + cfg.state_dir + "': " + ec.message());
  }
  if (!cfg.topology.empty() && !cfg.topology.starts_with("synthetic:") &&
      !fs::is_regular_file(cfg.topology, ec))
    return Status(Code::kInvalidArgument, "topology XML '" + cfg.topology + "' is not a file");
  return Status::ok();
}

Result<ResolvedSizes> resolve_sizes(const Config& cfg, uint64_t mem_total) {
  ResolvedSizes r;
  auto ram = parse_size(cfg.ram, mem_total);
  if (!ram) return fail(Code::kInvalidArgument, "ram: " + ram.error().message());
  if (*ram < (1ull << 20)) return fail(Code::kInvalidArgument, "ram: the RAM tier needs at least 1 MiB");
  if (*ram > mem_total)
    return fail(Code::kInvalidArgument, "ram: " + format_size(*ram) + " is more than this node's " +
                                            format_size(mem_total) + " of memory");
  r.ram = *ram;
  auto q = parse_size(cfg.pool_quota, r.ram);
  if (!q) return fail(Code::kInvalidArgument, "pool_quota: " + q.error().message());
  r.pool_quota = *q == 0 ? r.ram : *q;
  auto a = parse_size(cfg.alignment);
  if (!a) return fail(Code::kInvalidArgument, "alignment: " + a.error().message());
  r.alignment = *a;
  if (!cfg.uid_ram_quota.empty()) {
    auto u = parse_size(cfg.uid_ram_quota, r.ram);
    if (!u) return fail(Code::kInvalidArgument, "uid_ram_quota: " + u.error().message());
    r.uid_ram_quota = *u;
  }
  if (!cfg.uid_nvme_quota.empty()) {
    // A percentage is of the NVMe tier, whose size is known once it is open (make_state).
    const bool share = cfg.uid_nvme_quota.find('%') != std::string::npos;
    auto u = parse_size(cfg.uid_nvme_quota, uint64_t{0});
    if (!u) return fail(Code::kInvalidArgument, "uid_nvme_quota: " + u.error().message());
    r.uid_nvme_quota = share ? 0 : *u;
  }
  if (!cfg.uid_pinned_quota.empty()) {
    auto u = parse_size(cfg.uid_pinned_quota, r.ram);
    if (!u) return fail(Code::kInvalidArgument, "uid_pinned_quota: " + u.error().message());
    r.uid_pinned_quota = *u;
  }
  if (cfg.max_reply_bytes_per_uid < cfg.max_reply_bytes_per_connection)
    return fail(Code::kInvalidArgument, "max_reply_bytes_per_uid (" +
                                            format_size(cfg.max_reply_bytes_per_uid) +
                                            ") is less than max_reply_bytes_per_connection (" +
                                            format_size(cfg.max_reply_bytes_per_connection) + ")");
  return r;
}

std::string describe_limits(const Config& cfg, const ResolvedSizes& r) {
  auto size_or = [](uint64_t v, uint64_t unlimited) {
    return v == unlimited ? std::string("unlimited") : format_size(v);
  };
  std::string out;
  out += "  max_pools_per_uid " + std::to_string(cfg.max_pools_per_uid) + "\n";
  out += "  uid_ram_quota " + size_or(r.uid_ram_quota, 0) + "\n";
  const bool nvme_share = cfg.uid_nvme_quota.find('%') != std::string::npos;
  out += "  uid_nvme_quota " +
         (nvme_share ? cfg.uid_nvme_quota + " of the NVMe tier" : size_or(r.uid_nvme_quota, 0)) + "\n";
  out += "  uid_pinned_quota " + size_or(r.uid_pinned_quota, UINT64_MAX) + "\n";
  out += "  max_connections_per_uid " + std::to_string(cfg.max_connections_per_uid) + "\n";
  out += "  max_reply_bytes_per_connection " + format_size(cfg.max_reply_bytes_per_connection) + "\n";
  out += "  max_reply_bytes_per_uid " + format_size(cfg.max_reply_bytes_per_uid) + "\n";
  out += "  max_waiters_per_client " + std::to_string(cfg.max_waiters_per_client) + "\n";
  out += "  max_leases_per_client " + std::to_string(cfg.max_leases_per_client) + "\n";
  out += "  metrics_http_per_pool " + std::string(cfg.metrics_http_per_pool ? "true" : "false") + "\n";
  return out;
}

Result<uint64_t> read_mem_total() {
  std::ifstream f("/proc/meminfo");
  if (!f) return fail(Status::from_errno(errno, "open /proc/meminfo"));
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  return fail(Code::kInternal, "no MemTotal in /proc/meminfo");
}

std::string resolve_socket(const Config& cfg) {
  if (!cfg.socket.empty()) return cfg.socket;
  if (const char* e = std::getenv("TIERD_SOCKET"); e && *e) return e;
  return "/run/tierd/tierd.sock";
}

}  // namespace tier::daemon
