// RequestHandler: introspection (Status, Topo, Metrics, the systemd status line).
#include "rpc/request_handler.hpp"

#include <fmt/format.h>

#include "base/log.hpp"
#include "rpc/request_util.hpp"
#include "base/sizes.hpp"

namespace tier::daemon {

using namespace tier::wire;

StatusRep RequestHandler::status() const {
  StatusRep r;
  r.daemon_version = kDaemonVersion;
  r.uptime_ms = ms_since(state_.started);
  r.clients = state_.clients;
  r.pools = static_cast<uint32_t>(state_.catalog.pool_count());
  r.leases = state_.leases.live();
  for (const auto& n : state_.ram->nodes())
    r.ram.push_back(NodeTierW{n.node, n.capacity, n.charged(), 0, n.tensors});  // pinned pages are used
  copy_counters(r, state_.counters);
  if (state_.tiering) {
    const NvmeTier::Figures f = state_.tiering->figures();
    for (const auto& d : f.dirs)
      r.nvme.push_back(NvmeTierW{d.path, d.numa_node, d.backend, d.capacity, d.used});
    for (auto& n : r.ram) n.dirty = f.dirty_by_node.contains(n.node) ? f.dirty_by_node.at(n.node) : 0;
    r.bytes_read = f.bytes_read;
    r.bytes_written = f.bytes_written;
    copy_cache_counters(r, state_.tiering->stats());
  }
  return r;
}

TopoRep RequestHandler::topo() const {
  TopoRep r;
  r.source = state_.topology.source;
  for (const auto& n : state_.topology.nodes) r.nodes.push_back(TopoNodeW{n.id, n.memory, n.cpus});
  for (const auto& d : state_.topology.gpus) r.gpus.push_back(TopoDevW{d.index, d.name, d.pci, d.numa_node});
  for (const auto& d : state_.topology.nvme) r.nvme.push_back(TopoDevW{d.index, d.name, d.pci, d.numa_node});
  return r;
}

std::string RequestHandler::http_metrics_text() const {
  if (state_.config.metrics_http_per_pool) return metrics_text();
  // A viewer that may see no pool: the daemon-wide series only.
  return metrics_text(nullptr, [](const Pool&) { return false; });
}

std::string RequestHandler::metrics_text(const Session* viewer) const {
  if (!viewer) return metrics_text(nullptr, {});
  return metrics_text(viewer, [&](const Pool& p) { return may_see(creds(*viewer), p, state_.admin_gid); });
}

std::string RequestHandler::metrics_text(const Session*,
                                         const std::function<bool(const Pool&)>& visible) const {
  StatusRep st = status();
  MetricsInput in;
  in.status = &st;
  in.lease_waits = state_.counters.lease_waits;
  in.lease_timeouts = state_.counters.lease_timeouts;
  in.leases_granted = state_.counters.leases_granted;
  in.lease_latency = &leases_.latency();
  in.catalog = &state_.catalog;
  in.arena_repairs = [this](const Pool& p) { return state_.ram->arena_repairs(p.id); };
  in.visible = visible;
  if (state_.tiering) in.nvme_quota = [&](const Pool& p) { return state_.tiering->nvme_quota(p); };
  if (state_.tiering)
    for (const auto& d : state_.tiering->engine().stats().dirs)
      in.nvme_io.push_back({d.path, d.in_flight, d.queue_depth, d.bytes_read, d.bytes_written});
  std::string o = render_metrics(in);
  if (state_.tiering) o += tier_metrics_text();
  return o;
}

std::string RequestHandler::status_line() const {
  return fmt::format("RAM {} of {} used, {} pools, {} clients, {} leases", format_size(state_.ram->charged()),
                     format_size(state_.ram->capacity()), state_.catalog.pool_count(), state_.clients,
                     state_.leases.live());
}

void RequestHandler::on_status(Session&, const Header& h, std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(Empty, req);
  (void)req;
  reply_ok(h, status(), out);
}

void RequestHandler::on_topo(Session&, const Header& h, std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE(Empty, req);
  (void)req;
  reply_ok(h, topo(), out);
}

void RequestHandler::on_metrics(Session& s, const Header& h, std::span<const std::byte> payload, Reply& out) {
  // Pages of at most kMaxStringBytes, cut at line ends; an empty payload asks for page 0.
  MetricsReq req;
  if (!payload.empty()) {
    auto r = decode<MetricsReq>(payload);
    if (!r) return reply_err(h, r.error(), out);
    req = *r;
  }
  TextRep rep;
  rep.text = metrics_page(metrics_text(&s), req.page, kMaxStringBytes, rep.more);
  reply_ok(h, rep, out);
}

void RequestHandler::on_nvme_only(Session&, const Header& h, std::span<const std::byte>, Reply& out) {
  reply_err(h, Status(Code::kUnsupported, "the NVMe tier is not configured"), out);
}

}  // namespace tier::daemon
