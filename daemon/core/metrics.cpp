#include "core/metrics.hpp"

#include <fmt/format.h>

namespace tier::daemon {

std::string label_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

namespace {

std::string esc(const std::string& s) { return label_escape(s); }
// The node label of an NVMe directory: its NUMA node, or "unknown" when the topology does not
// place the device (numa_node -1), which reads as a node number in queries.
std::string node_label(int32_t node) { return node < 0 ? "unknown" : std::to_string(node); }

struct Out {
  std::string s;
  void family(const char* name, const char* type, const char* help) {
    s += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void one(const char* name, const char* type, const char* help, uint64_t v) {
    family(name, type, help);
    s += fmt::format("{} {}\n", name, v);
  }
};

}  // namespace

std::string render_metrics(const MetricsInput& in) {
  const wire::StatusRep& st = *in.status;
  Out o;
  o.family("tierd_info", "gauge", "tierd version (value 1).");
  o.s += fmt::format("tierd_info{{version=\"{}\"}} 1\n", esc(st.daemon_version));
  o.one("tierd_uptime_seconds", "gauge", "Seconds since tierd started.", st.uptime_ms / 1000);
  o.one("tierd_clients", "gauge", "Connected clients.", st.clients);
  o.one("tierd_pools", "gauge", "Pools.", st.pools);
  o.one("tierd_leases", "gauge", "Leases held.", st.leases);
  o.one("tierd_requests_total", "counter", "Control requests served.", st.requests);
  o.one("tierd_errors_total", "counter",
        "Requests answered with an error (leases that waited until their deadline count in "
        "tierd_lease_timeouts_total instead).",
        st.errors);
  o.one("tierd_leases_granted_total", "counter", "Tensor leases granted.", in.leases_granted);
  o.one("tierd_lease_waits_total", "counter", "Lease requests that waited for a conflicting lease.",
        in.lease_waits);
  o.one("tierd_lease_timeouts_total", "counter", "Lease waits that timed out.", in.lease_timeouts);
  o.one("tierd_hits_total", "counter", "Leased tensors found in RAM.", st.hits);
  o.one("tierd_misses_total", "counter", "Leased tensors that had to be read from NVMe.", st.misses);
  o.one("tierd_stalls_total", "counter", "Lease requests that could not be answered at once.", st.stalls);
  o.one("tierd_evictions_total", "counter", "Tensors evicted from RAM to NVMe.", st.evictions);
  o.one("tierd_prefetches_total", "counter", "Tensors prefetched from NVMe.", st.prefetches);
  o.one("tierd_nvme_read_bytes_total", "counter", "Bytes read from the NVMe tier.", st.bytes_read);
  o.one("tierd_nvme_written_bytes_total", "counter", "Bytes written to the NVMe tier.", st.bytes_written);

  auto per_node = [&](const char* name, const char* help, auto get) {
    o.family(name, "gauge", help);
    for (const auto& n : st.ram)
      o.s += fmt::format("{}{{tier=\"ram\",node=\"{}\"}} {}\n", name, n.node, get(n));
  };
  per_node("tierd_ram_capacity_bytes", "RAM tier capacity per NUMA node.",
           [](const wire::NodeTierW& n) { return n.capacity; });
  per_node("tierd_ram_used_bytes", "RAM tier bytes allocated per NUMA node.",
           [](const wire::NodeTierW& n) { return n.used; });
  per_node("tierd_ram_dirty_bytes", "RAM tier bytes not yet written to NVMe per NUMA node.",
           [](const wire::NodeTierW& n) { return n.dirty; });
  per_node("tierd_ram_tensors", "Tensors in RAM per NUMA node.",
           [](const wire::NodeTierW& n) { return n.tensors; });

  auto per_dir = [&](const char* name, const char* help, auto get) {
    o.family(name, "gauge", help);
    for (const auto& d : st.nvme)
      o.s += fmt::format("{}{{tier=\"nvme\",path=\"{}\",node=\"{}\",backend=\"{}\"}} {}\n", name, esc(d.path),
                         node_label(d.numa_node), esc(d.backend), get(d));
  };
  per_dir("tierd_nvme_capacity_bytes", "NVMe tier capacity per directory.",
          [](const wire::NvmeTierW& d) { return d.capacity; });
  per_dir("tierd_nvme_used_bytes", "NVMe tier bytes used per directory.",
          [](const wire::NvmeTierW& d) { return d.used; });

  if (!in.nvme_io.empty()) {
    auto per_io = [&](const char* name, const char* type, const char* help, auto get) {
      o.family(name, type, help);
      for (const auto& d : in.nvme_io)
        o.s += fmt::format("{}{{tier=\"nvme\",path=\"{}\"}} {}\n", name, esc(d.path), get(d));
    };
    using Io = MetricsInput::NvmeIo;
    per_io("tierd_nvme_io_in_flight", "gauge", "NVMe requests in flight now per directory.",
           [](const Io& d) { return d.in_flight; });
    per_io("tierd_nvme_io_queue_depth", "gauge",
           "NVMe queue depth per directory (the most requests in flight).",
           [](const Io& d) { return d.queue_depth; });
    per_io("tierd_nvme_dir_read_bytes_total", "counter", "Device bytes read per NVMe directory.",
           [](const Io& d) { return d.bytes_read; });
    per_io("tierd_nvme_dir_written_bytes_total", "counter", "Device bytes written per NVMe directory.",
           [](const Io& d) { return d.bytes_written; });
  }

  if (const LatencyHistogram* h = in.lease_latency) {
    o.family("tierd_lease_latency_seconds", "histogram",
             "Lease requests answered at once: receipt to reply, in the daemon.");
    uint64_t cum = 0;
    for (size_t i = 0; i < LatencyHistogram::kBoundsUs.size(); ++i) {
      cum += h->counts()[i];
      o.s += fmt::format("tierd_lease_latency_seconds_bucket{{le=\"{}\"}} {}\n",
                         LatencyHistogram::kBoundsUs[i] / 1e6, cum);
    }
    o.s += fmt::format("tierd_lease_latency_seconds_bucket{{le=\"+Inf\"}} {}\n", h->total());
    o.s += fmt::format("tierd_lease_latency_seconds_sum {}\n", static_cast<double>(h->sum_ns()) / 1e9);
    o.s += fmt::format("tierd_lease_latency_seconds_count {}\n", h->total());
  }

  if (Catalog* cat = in.catalog) {
    std::vector<const Pool*> pools;
    for (const auto& [name, id] : cat->pool_names())
      if (const Pool* p = cat->find_pool(id); p && (!in.visible || in.visible(*p))) pools.push_back(p);
    auto per_pool = [&](const char* name, const char* help, const auto& get) {
      o.family(name, "gauge", help);
      for (const Pool* p : pools)
        o.s += fmt::format("{}{{pool=\"{}\",uid=\"{}\"}} {}\n", name, esc(p->name), p->owner_uid, get(*p));
    };
    per_pool("tierd_pool_ram_quota_bytes", "RAM quota per pool.", [](const Pool& p) { return p.ram_quota; });
    per_pool("tierd_pool_ram_used_bytes", "RAM allocated per pool.",
             [](const Pool& p) { return p.ram_charged(); });
    per_pool("tierd_pool_nvme_quota_bytes",
             "NVMe quota per pool (effective: the default where none was set).",
             [&](const Pool& p) { return in.nvme_quota ? in.nvme_quota(p) : p.nvme_quota; });
    per_pool("tierd_pool_nvme_used_bytes", "NVMe bytes used per pool.",
             [](const Pool& p) { return p.nvme_used; });
    per_pool("tierd_pool_tensors", "Tensors per pool.",
             [](const Pool& p) { return static_cast<uint64_t>(p.tensors.size()); });
    per_pool("tierd_pool_leases", "Leases held per pool.", [](const Pool& p) { return p.leases; });
    if (in.arena_repairs)
      per_pool("tierd_pool_arena_repairs",
               "Faults in the pool's arenas repaired since start: an arena truncated through a "
               "tenant's fd (the truncated bytes read as zeros).",
               in.arena_repairs);
  }
  return std::move(o.s);
}

std::string metrics_page(const std::string& text, uint32_t page, size_t max_bytes, bool& more) {
  size_t pos = 0;
  for (uint32_t i = 0;; ++i) {
    size_t end = pos + max_bytes;
    if (end >= text.size()) {
      more = false;
      return i == page ? text.substr(pos) : std::string();
    }
    size_t nl = text.rfind('\n', end - 1);
    if (nl != std::string::npos && nl >= pos) end = nl + 1;
    if (i == page) {
      more = true;
      return text.substr(pos, end - pos);
    }
    pos = end;
  }
}

}  // namespace tier::daemon
