// The NVMe tier's requests (Prefetch, Evict, PlanSet) and its poll hook. Kept apart from
// request_handler.cpp: these only translate between the wire and the NvmeTier.
#include <fmt/format.h>

#include "base/log.hpp"
#include "rpc/request_handler.hpp"
#include "rpc/request_util.hpp"

namespace tier::daemon {

using namespace tier::wire;

namespace {

void reply_empty(const Header& h, Reply& out) {
  Status st = encode_reply(h.type, h.request_id, Status::ok(), Empty{}, out.bytes);
  (void)st;  // an empty body always fits
}

}  // namespace

Status RequestHandler::resolve_in_pool(const Pool& pool, std::span<const uint64_t> ids) {
  scratch_tensors_.clear();
  if (ids.size() > kMaxBatch)
    return Status(Code::kInvalidArgument, "at most " + std::to_string(kMaxBatch) + " tensors per request");
  for (uint64_t id : ids) {
    Tensor* t = state_.catalog.find_tensor(id);
    if (!t || t->pool_id != pool.id)
      return Status(Code::kNotFound,
                    "no tensor with id " + std::to_string(id) + " in pool '" + pool.name + "'");
    scratch_tensors_.push_back(t);
  }
  return Status::ok();
}

void RequestHandler::on_prefetch(Session& s, const Header& h, std::span<const std::byte> payload,
                                 Reply& out) {
  if (!state_.tiering) return on_nvme_only(s, h, payload, out);
  TIER_DECODE_IN_POOL(TensorIdsReq, req, p, kUse);
  if (Status st = resolve_in_pool(p, req.tensor_ids); !st) return reply_err(h, st, out);
  if (Status st = state_.tiering->prefetch(p, scratch_tensors_); !st) return reply_err(h, st, out);
  reply_empty(h, out);
}

void RequestHandler::on_evict(Session& s, const Header& h, std::span<const std::byte> payload, Reply& out) {
  if (!state_.tiering) return on_nvme_only(s, h, payload, out);
  TIER_DECODE_IN_POOL(TensorIdsReq, req, p, kUse);
  bool whole_pool = req.tensor_ids.empty();
  if (whole_pool) {
    scratch_tensors_.clear();
    for (auto& [id, t] : p.tensors) scratch_tensors_.push_back(&t);
  } else if (Status st = resolve_in_pool(p, req.tensor_ids); !st) {
    return reply_err(h, st, out);
  }
  std::vector<Tensor*> tensors = scratch_tensors_;  // the tier may wait for I/O meanwhile
  size_t skipped = 0;
  Status st = state_.tiering->evict(p, tensors, skipped);
  if (!st) return reply_err(h, st, out);
  // Named tensors that are leased are an error the caller should see; a whole-pool eviction
  // skips them (and says so in the log).
  if (skipped > 0 && !whole_pool)
    return reply_err(
        h, Status(Code::kBusy, std::to_string(skipped) + " of the tensors are leased and stay in RAM"), out);
  if (skipped > 0) log_info("evict pool '{}': {} leased tensors stay in RAM", p.name, skipped);
  reply_empty(h, out);
  retry_waiters();  // write-backs may have completed fetches of waiting leases meanwhile
}

void RequestHandler::on_discard(Session& s, const Header& h, std::span<const std::byte> payload, Reply& out) {
  TIER_DECODE_IN_POOL(TensorIdsReq, req, p, kUse);
  if (req.tensor_ids.empty())
    return reply_err(h, Status(Code::kInvalidArgument, "discard names no tensors"), out);
  if (Status st = resolve_in_pool(p, req.tensor_ids); !st) return reply_err(h, st, out);
  // Without an NVMe tier the RAM copy is the only one and nothing is ever written back: the
  // hint has nothing to save.
  if (state_.tiering) state_.tiering->discard(scratch_tensors_);
  reply_empty(h, out);
}

void RequestHandler::on_plan_set(Session& s, const Header& h, std::span<const std::byte> payload,
                                 Reply& out) {
  if (!state_.tiering) return on_nvme_only(s, h, payload, out);
  TIER_DECODE_IN_POOL(PlanSetReq, req, p, kUse);
  for (uint64_t id : req.tensor_ids) {
    Tensor* t = state_.catalog.find_tensor(id);
    if (!t || t->pool_id != p.id)
      return reply_err(h,
                       Status(Code::kNotFound, "plan names tensor id " + std::to_string(id) +
                                                   ", which is not in pool '" + p.name + "'"),
                       out);
  }
  if (req.tensor_ids.size() > state_.config.max_plan_uses)
    return reply_err(h,
                     Status(Code::kResourceExhausted,
                            "plan of " + std::to_string(req.tensor_ids.size()) + " uses; the limit is " +
                                std::to_string(state_.config.max_plan_uses) + " (max_plan_uses)"),
                     out);
  if (!req.overwrite.empty() && req.overwrite.size() != req.tensor_ids.size())
    return reply_err(
        h,
        Status(Code::kInvalidArgument, "plan has " + std::to_string(req.tensor_ids.size()) + " uses but " +
                                           std::to_string(req.overwrite.size()) + " overwrite flags"),
        out);
  if (Status st =
          state_.tiering->set_plan(s.id, p, std::move(req.tensor_ids), req.budget, std::move(req.overwrite));
      !st)
    return reply_err(h, st, out);
  reply_empty(h, out);
}

// Tiering metrics beyond the status counters (which render_metrics already exports).
std::string RequestHandler::tier_metrics_text() const {
  const TierStats& t = state_.tiering->stats();
  std::string o;
  auto metric = [&](const char* name, const char* help, uint64_t v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  o += fmt::format(
      "# HELP tierd_stall_seconds_total Time lease requests waited for NVMe I/O.\n"
      "# TYPE tierd_stall_seconds_total counter\ntierd_stall_seconds_total {:.6f}\n",
      static_cast<double>(t.stall_us) / 1e6);
  metric("tierd_writebacks_total", "Write-backs to NVMe completed.", t.writebacks);
  metric("tierd_fetches_total", "Fetches from NVMe completed.", t.fetches);
  metric("tierd_fetch_errors_total", "Fetches that failed (I/O error or checksum mismatch).", t.fetch_errors);
  o += "# HELP tierd_nvme_registered_buffers 1 when the arenas are io_uring fixed buffers for this directory "
       "(prefault = true).\n"
       "# TYPE tierd_nvme_registered_buffers gauge\n";
  const nvme::EngineStats es = state_.tiering->engine().stats();
  uint64_t syncs = 0;
  for (const auto& d : es.dirs) {
    o += fmt::format("tierd_nvme_registered_buffers{{path=\"{}\"}} {}\n", label_escape(d.path),
                     d.registered_buffers ? 1 : 0);
    syncs += d.syncs;
  }
  metric("tierd_nvme_syncs_total", "fdatasyncs of NVMe data files completed (spills' and write-behind).",
         syncs);
  metric("tierd_nvme_flush_behind_syncs_total",
         "Write-behind fdatasyncs issued while spills streamed (nvme_flush_behind).", es.behind_syncs);
  metric("tierd_cleaned_bytes_total",
         "Bytes written back ahead of need while the NVMe device was idle (ram_dirty_background).",
         t.cleaned_bytes);
  metric("tierd_discarded_bytes_total", "RAM copies made clean by Discard requests (write-backs saved).",
         t.discarded_bytes);
  metric("tierd_fetches_skipped_total",
         "Overwrite leases on tensors only on NVMe, placed in RAM without a read.", t.fetches_skipped);
  metric("tierd_writeback_errors_total", "Write-backs that failed.", t.writeback_errors);
  metric("tierd_nvme_checksum_failures_total", "Extents whose checksum did not match.", es.checksum_failures);
  return o;
}

void RequestHandler::tier_poll() {
  if (!state_.tiering) return;
  if (state_.tiering->poll() && state_.leases.waiter_count() > 0) retry_waiters();
}

}  // namespace tier::daemon
