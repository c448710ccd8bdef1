// tierctl's commands. Each takes a connected client, prints its result to stdout (a table or,
// with --json, one JSON document) and returns a Status; main() turns a failure into exit code 1
// and a one-line "tierctl: Code: message" on stderr.
#pragma once

#include <string>

#include "tier/client.hpp"

namespace tier::ctl {

struct Output {
  bool json = false;
};

struct PutOptions {
  uint64_t ram_quota = 0;   // for a pool put creates; 0 = the daemon's default
  int32_t wait_ms = 5000;   // how long to wait for a conflicting lease
};

[[nodiscard]] Status cmd_status(Client& c, const Output& o);
[[nodiscard]] Status cmd_topo(Client& c, const Output& o);
[[nodiscard]] Status cmd_pools(Client& c, const Output& o);
[[nodiscard]] Status cmd_tensors(Client& c, const Output& o, const std::string& pool);
[[nodiscard]] Status cmd_put(Client& c, const Output& o, const std::string& pool,
                             const std::string& name, const std::string& file, const PutOptions& p);
[[nodiscard]] Status cmd_get(Client& c, const Output& o, const std::string& pool,
                             const std::string& name, const std::string& file, int32_t wait_ms);
[[nodiscard]] Status cmd_rm(Client& c, const Output& o, const std::string& pool, const std::string& name);
[[nodiscard]] Status cmd_evict(Client& c, const Output& o, const std::string& pool, const std::string& name);
[[nodiscard]] Status cmd_prefetch(Client& c, const Output& o, const std::string& pool,
                                  const std::string& name);
[[nodiscard]] Status cmd_snapshot(Client& c, const Output& o, const std::string& pool);
[[nodiscard]] Status cmd_drop(Client& c, const Output& o, const std::string& pool);
[[nodiscard]] Status cmd_metrics(Client& c, const Output& o);
// Live view (tools/tierctl/top.cpp); `once`: one frame, no clearing, no keyboard.
[[nodiscard]] Status cmd_top(Client& c, double interval_s, bool once, size_t top_n);

}  // namespace tier::ctl
