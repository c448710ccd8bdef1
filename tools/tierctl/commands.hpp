// tierctl's commands. Each takes a connected client, prints its result to stdout (a table or,
// with --json, one JSON document) and returns a Status; main() turns a failure into exit code 1
// and a one-line "tierctl: Code: message" on stderr.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tier/client.hpp"

namespace tier::ctl {

struct Output {
  bool json = false;
};

struct PutOptions {
  uint64_t ram_quota = 0;  // for a pool put creates; 0 = the daemon's default
  int32_t wait_ms = 5000;  // how long to wait for a conflicting lease
};

[[nodiscard]] Status cmd_status(Client& c, const Output& o);
[[nodiscard]] Status cmd_topo(Client& c, const Output& o);
[[nodiscard]] Status cmd_pools(Client& c, const Output& o);
[[nodiscard]] Status cmd_tensors(Client& c, const Output& o, const std::string& pool);
[[nodiscard]] Status cmd_put(Client& c, const Output& o, const std::string& pool, const std::string& name,
                             const std::string& file, const PutOptions& p);
[[nodiscard]] Status cmd_get(Client& c, const Output& o, const std::string& pool, const std::string& name,
                             const std::string& file, int32_t wait_ms);
[[nodiscard]] Status cmd_rm(Client& c, const Output& o, const std::string& pool, const std::string& name);
[[nodiscard]] Status cmd_evict(Client& c, const Output& o, const std::string& pool, const std::string& name);
[[nodiscard]] Status cmd_prefetch(Client& c, const Output& o, const std::string& pool,
                                  const std::string& name);
[[nodiscard]] Status cmd_snapshot(Client& c, const Output& o, const std::string& pool,
                                  const SnapshotOptions& opts);
[[nodiscard]] Status cmd_snapshots(Client& c, const Output& o, const std::string& pool);
[[nodiscard]] Status cmd_restore(Client& c, const Output& o, const std::string& pool, uint64_t snapshot_id);
// Asks "drop pool ...? [y/N]" on a terminal unless `yes`; off a terminal it drops (scripts).
[[nodiscard]] Status cmd_drop(Client& c, const Output& o, const std::string& pool, bool yes);
[[nodiscard]] Status cmd_metrics(Client& c, const Output& o);
struct TopOptions {
  double interval_s = 2;  // between frames; the loop sleeps this long whatever stdin is
  bool once = false;      // one frame, no clearing, no keyboard
  int pools = 10;         // rows of the top-pools table
};
// Live view (tools/tierctl/top.cpp). On a terminal: the alternate screen, frames clipped to the
// window, 'q' quits. Off a terminal: frames one after another (with --json one JSON object per
// line), every interval_s, until SIGINT/SIGTERM or a write error.
[[nodiscard]] Status cmd_top(Client& c, const Output& o, const TopOptions& t);

// The --json documents of one node status and one pool, shared by `status`, `pools` and `top`.
[[nodiscard]] nlohmann::json status_json(const NodeStatus& s, const std::string& socket);
[[nodiscard]] nlohmann::json pool_json(const PoolInfo& p);

// The user name of `uid`, or its number when it has none (tables show names, --json numbers).
[[nodiscard]] std::string owner_name(uint32_t uid);

}  // namespace tier::ctl
