// tierctl: inspect and drive a running tierd from the shell.
//
// Exit codes (docs in --help): 0 ok; 1 the request failed (one line "tierctl: Code: message" on
// stderr); 2 usage error (CLI11's message and a pointer to --help on stderr).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "tier/client.hpp"
#include "base/sizes.hpp"

namespace {

constexpr const char* kFooter = R"(
Socket: --socket PATH, else $TIERD_SOCKET, else /run/tierd/tierd.sock.
Sizes are printed in powers of 1024 (KiB, MiB, GiB); --json prints exact byte counts.

Exit status:
  0  success
  1  the daemon refused or failed the request, or it is unreachable; one line on stderr,
     e.g. "tierctl: NotFound: no pool named 'x'"
  2  usage error (unknown command, missing or extra argument)

Examples:
  tierctl status                          node summary: RAM and NVMe tiers, counters
  tierctl put job1 w0 weights.bin         store a file as tensor w0 of pool job1
  tierctl get job1 w0 copy.bin            read it back
  gzip -dc w.gz | tierctl put job1 w1 -   store a pipe's bytes; get job1 w1 - | sha256sum
  tierctl --json tensors job1 | jq .      machine-readable listing
  tierctl metrics | grep tier_ram         Prometheus text exposition
  tierctl top                             live view, refreshed every 2 s (q quits)
  tierctl top --once --json               one JSON object: node status and top pools)";

// The first word of argv that is not an option or an option's value: the command the user
// typed, for the "unknown command" message CLI11 cannot give (it says "A subcommand is required").
std::string typed_command(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" || a == "--connect-timeout") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    return a;
  }
  return {};
}

int fail_with(const tier::Status& st) {
  std::string line = st.to_string();
  for (char& ch : line)
    if (ch == '\n' || ch == '\r') ch = ' ';  // the contract is one line on stderr
  std::fprintf(stderr, "tierctl: %s\n", line.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierctl: inspect and drive the tierd memory-tier daemon on this node", "tierctl"};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // --json and --socket also work after the command
  app.set_version_flag("--version", std::string("tierctl ") + TIER_VERSION);

  std::string socket;
  bool json = false;
  app.add_option("--socket", socket,
                 "tierd control socket (default: $TIERD_SOCKET or /run/tierd/tierd.sock)");
  app.add_flag("--json", json, "print one JSON document instead of tables");
  int timeout_ms = 0;
  app.add_option("--connect-timeout", timeout_ms, "keep retrying to connect for this many ms (default 0)")
      ->check(CLI::NonNegativeNumber);

  std::string pool, name, file;
  tier::ctl::PutOptions put_opts;
  std::string quota_text;

  auto* status = app.add_subcommand(
      "status", "node summary: daemon, clients, pools, leases, RAM and NVMe tiers, counters");
  auto* topo = app.add_subcommand(
      "topo", "NUMA nodes with memory and CPUs, and the nearest node of each GPU and NVMe device");
  auto* pools =
      app.add_subcommand("pools", "list pools with owner, tensor count, RAM and NVMe use and quota");

  auto* tensors = app.add_subcommand(
      "tensors", "list the tensors of POOL with size, dtype, shape, NUMA node, tiers and leases");
  tensors->add_option("POOL", pool, "pool name")->required();

  auto* put =
      app.add_subcommand("put",
                         "store FILE as tensor NAME of POOL; creates the pool (default quota) and the tensor "
                         "when missing; an existing tensor must have the file's size");
  put->add_option("POOL", pool, "pool name ([A-Za-z0-9._-], created when missing)")->required();
  put->add_option("NAME", name, "tensor name (created when missing, size = file size)")->required();
  put->add_option("FILE", file, "file to copy into the tensor; - (or a pipe) reads stdin to its end first")
      ->required();
  put->add_option("--ram-quota", quota_text,
                  "RAM quota of the pool when put creates it, e.g. 4G (default: the daemon's)");
  put->add_option("--wait-ms", put_opts.wait_ms, "wait this long for a conflicting lease (default 5000)")
      ->check(CLI::Range(0, 86400000).description("0 to 86400000 ms"));

  int32_t get_wait = 5000;
  auto* get = app.add_subcommand("get", "write tensor NAME of POOL to FILE (created or truncated)");
  get->add_option("POOL", pool, "pool name")->required();
  get->add_option("NAME", name, "tensor name")->required();
  get->add_option("FILE", file,
                  "output file (created or truncated); - writes to stdout, the summary to stderr")
      ->required();
  get->add_option("--wait-ms", get_wait, "wait this long for a conflicting write lease (default 5000)")
      ->check(CLI::Range(0, 86400000).description("0 to 86400000 ms"));

  auto* rm = app.add_subcommand("rm", "delete tensor NAME of POOL");
  rm->add_option("POOL", pool, "pool name")->required();
  rm->add_option("NAME", name, "tensor name")->required();

  auto* evict = app.add_subcommand(
      "evict", "write back to NVMe and drop from RAM tensor NAME, or every unleased tensor of POOL");
  evict->add_option("POOL", pool, "pool name")->required();
  evict->add_option("NAME", name, "tensor name (default: the whole pool)");

  auto* prefetch = app.add_subcommand("prefetch", "queue tensor NAME of POOL to be brought back into RAM");
  prefetch->add_option("POOL", pool, "pool name")->required();
  prefetch->add_option("NAME", name, "tensor name")->required();

  auto* snapshot =
      app.add_subcommand("snapshot", "make a consistent, durable copy of POOL on NVMe; returns once durable");
  snapshot->add_option("POOL", pool, "pool name")->required();
  tier::SnapshotOptions snap_opts;
  snapshot->add_option("--tag", snap_opts.tag,
                       "a label of yours, e.g. a training step (listed by 'snapshots')");
  snapshot
      ->add_option("--keep", snap_opts.keep,
                   "durable snapshots of POOL kept once this one is durable (default 1)")
      ->check(CLI::Range(1, 16).description("1 to 16"));

  auto* snapshots = app.add_subcommand(
      "snapshots", "list POOL's durable snapshots, and whether a reboot left it a mix of points in time");
  snapshots->add_option("POOL", pool, "pool name")->required();

  uint64_t restore_id = 0;
  auto* restore = app.add_subcommand("restore",
                                     "roll POOL back to snapshot ID: its tensors as of then, newer tensors "
                                     "and snapshots deleted (fails while leased)");
  restore->add_option("POOL", pool, "pool name")->required();
  restore->add_option("ID", restore_id, "snapshot id (see 'tierctl snapshots POOL')")->required();

  bool drop_yes = false;
  auto* drop = app.add_subcommand("drop",
                                  "delete POOL with all its tensors, RAM and NVMe (fails while leased); "
                                  "asks first when run on a terminal");
  drop->add_option("POOL", pool, "pool name")->required();
  drop->add_flag("--yes,-y", drop_yes, "do not ask for confirmation");

  auto* metrics = app.add_subcommand("metrics", "print every counter and gauge as Prometheus text");

  tier::ctl::TopOptions top_opts;
  auto* top = app.add_subcommand(
      "top", "live view: RAM/NVMe use per node, NVMe bandwidth, top pools by RAM (q quits)");
  top->add_option("--interval", top_opts.interval_s, "seconds between refreshes, at least 0.1 (default 2)")
      ->check(CLI::Range(0.1, 86400.0).description("0.1 to 86400 s"));
  top->add_flag("--once", top_opts.once,
                "print one frame and exit (no screen clearing); with --json one JSON object");
  top->add_option("--pools", top_opts.pools, "how many pools to show (default 10)")
      ->check(CLI::Range(0, 1000000).description("0 to 1000000"));

  for (auto* sc : app.get_subcommands({}))
    sc->footer("Run 'tierctl --help' for the socket, --json and exit codes.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) { return app.exit(e); } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) { return app.exit(e); } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string typed = typed_command(argc, argv);
    bool known = false;
    for (auto* sc : app.get_subcommands({})) known = known || sc->get_name() == typed;
    if (!typed.empty() && !known)
      std::fprintf(stderr, "tierctl: unknown command '%s'\nRun 'tierctl --help' for the commands.\n",
                   typed.c_str());
    else std::fprintf(stderr, "tierctl: %s\nRun 'tierctl --help' for usage.\n", e.what());
    return 2;
  }
  if (!quota_text.empty()) {
    auto q = tier::parse_size(quota_text);
    if (!q) {
      std::fprintf(stderr, "tierctl: --ram-quota: %s\n", q.error().message().c_str());
      return 2;
    }
    put_opts.ram_quota = *q;
  }

  auto client = tier::Client::connect(
      socket, {.client_name = "tierctl", .connect_timeout = std::chrono::milliseconds(timeout_ms)});
  if (!client) return fail_with(client.error());
  tier::Client& c = **client;
  tier::ctl::Output out{json};
  using namespace tier::ctl;

  tier::Status st;
  try {
    if (*status) st = cmd_status(c, out);
    else if (*topo) st = cmd_topo(c, out);
    else if (*pools) st = cmd_pools(c, out);
    else if (*tensors) st = cmd_tensors(c, out, pool);
    else if (*put) st = cmd_put(c, out, pool, name, file, put_opts);
    else if (*get) st = cmd_get(c, out, pool, name, file, get_wait);
    else if (*rm) st = cmd_rm(c, out, pool, name);
    else if (*evict) st = cmd_evict(c, out, pool, name);
    else if (*prefetch) st = cmd_prefetch(c, out, pool, name);
    else if (*snapshot) st = cmd_snapshot(c, out, pool, snap_opts);
    else if (*snapshots) st = cmd_snapshots(c, out, pool);
    else if (*restore) st = cmd_restore(c, out, pool, restore_id);
    else if (*drop) st = cmd_drop(c, out, pool, drop_yes);
    else if (*metrics) st = cmd_metrics(c, out);
    else if (*top) st = cmd_top(c, out, top_opts);
  } catch (const std::exception& e) {  // bad_alloc, or JSON of invalid UTF-8 from the daemon
    st = tier::Status(tier::Code::kInternal, e.what());
  }
  if (!st.is_ok()) return fail_with(st);
  return 0;
}
