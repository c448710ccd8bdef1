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

// What the command line said: the options, and which subcommand was given.
struct Args {
  std::string socket;
  bool json = false;
  int timeout_ms = 0;
  std::string pool, name, file;
  tier::ctl::PutOptions put_opts;
  std::string quota_text;
  int32_t get_wait = 5000;
  tier::SnapshotOptions snap_opts;
  uint64_t restore_id = 0;
  bool drop_yes = false;
  tier::ctl::TopOptions top_opts;
  CLI::App *status = nullptr, *topo = nullptr, *pools = nullptr, *tensors = nullptr, *put = nullptr,
           *get = nullptr, *rm = nullptr, *evict = nullptr, *prefetch = nullptr, *snapshot = nullptr,
           *snapshots = nullptr, *restore = nullptr, *drop = nullptr, *metrics = nullptr, *top = nullptr;
};

const auto kWaitRange = CLI::Range(0, 86400000).description("0 to 86400000 ms");

// A subcommand on POOL (its first argument); with `tensor_help`, on tensor NAME of it as well
// (required unless `name_optional`).
CLI::App* pool_command(CLI::App& app, Args& a, const char* name, const char* what,
                       const char* pool_help = "pool name", const char* tensor_help = nullptr,
                       bool name_optional = false) {
  CLI::App* c = app.add_subcommand(name, what);
  c->add_option("POOL", a.pool, pool_help)->required();
  if (tensor_help) {
    CLI::Option* n = c->add_option("NAME", a.name, tensor_help);
    if (!name_optional) n->required();
  }
  return c;
}

// The commands that read and write tensors.
void add_tensor_commands(CLI::App& app, Args& a) {
  a.status = app.add_subcommand("status",
                                "node summary: daemon, clients, pools, leases, RAM and NVMe tiers, counters");
  a.topo = app.add_subcommand(
      "topo", "NUMA nodes with memory and CPUs, and the nearest node of each GPU and NVMe device");
  a.pools = app.add_subcommand("pools", "list pools with owner, tensor count, RAM and NVMe use and quota");
  a.tensors = pool_command(app, a, "tensors",
                           "list the tensors of POOL with size, dtype, shape, NUMA node, tiers and leases");

  a.put = pool_command(app, a, "put",
                       "store FILE as tensor NAME of POOL; creates the pool (default quota) and the "
                       "tensor when missing; an existing tensor must have the file's size",
                       "pool name ([A-Za-z0-9._-], created when missing)",
                       "tensor name (created when missing, size = file size)");
  a.put
      ->add_option("FILE", a.file, "file to copy into the tensor; - (or a pipe) reads stdin to its end first")
      ->required();
  a.put->add_option("--ram-quota", a.quota_text,
                    "RAM quota of the pool when put creates it, e.g. 4G (default: the daemon's)");
  a.put->add_option("--wait-ms", a.put_opts.wait_ms, "wait this long for a conflicting lease (default 5000)")
      ->check(kWaitRange);

  a.get = pool_command(app, a, "get", "write tensor NAME of POOL to FILE (created or truncated)", "pool name",
                       "tensor name");
  a.get
      ->add_option("FILE", a.file,
                   "output file (created or truncated); - writes to stdout, the summary to stderr")
      ->required();
  a.get->add_option("--wait-ms", a.get_wait, "wait this long for a conflicting write lease (default 5000)")
      ->check(kWaitRange);

  a.rm = pool_command(app, a, "rm", "delete tensor NAME of POOL", "pool name", "tensor name");
  a.evict = pool_command(app, a, "evict",
                         "write back to NVMe and drop from RAM tensor NAME, or every unleased tensor of POOL",
                         "pool name", "tensor name (default: the whole pool)", /*name_optional=*/true);
  a.prefetch = pool_command(app, a, "prefetch", "queue tensor NAME of POOL to be brought back into RAM",
                            "pool name", "tensor name");
}

// The commands on whole pools (snapshots, restore, drop) and the monitoring ones.
void add_pool_commands(CLI::App& app, Args& a) {
  a.snapshot = pool_command(app, a, "snapshot",
                            "make a consistent, durable copy of POOL on NVMe; returns once durable");
  a.snapshot->add_option("--tag", a.snap_opts.tag,
                         "a label of yours, e.g. a training step (listed by 'snapshots')");
  a.snapshot
      ->add_option("--keep", a.snap_opts.keep,
                   "durable snapshots of POOL kept once this one is durable (default 1)")
      ->check(CLI::Range(1, 16).description("1 to 16"));
  a.snapshots =
      pool_command(app, a, "snapshots",
                   "list POOL's durable snapshots, and whether a reboot left it a mix of points in time");
  a.restore = pool_command(app, a, "restore",
                           "roll POOL back to snapshot ID: its tensors as of then, newer tensors "
                           "and snapshots deleted (fails while leased)");
  a.restore->add_option("ID", a.restore_id, "snapshot id (see 'tierctl snapshots POOL')")->required();
  a.drop = pool_command(app, a, "drop",
                        "delete POOL with all its tensors, RAM and NVMe (fails while leased); "
                        "asks first when run on a terminal");
  a.drop->add_flag("--yes,-y", a.drop_yes, "do not ask for confirmation");

  a.metrics = app.add_subcommand("metrics", "print every counter and gauge as Prometheus text");

  a.top = app.add_subcommand("top",
                             "live view: RAM/NVMe use per node, NVMe bandwidth, top pools by RAM (q quits)");
  a.top
      ->add_option("--interval", a.top_opts.interval_s, "seconds between refreshes, at least 0.1 (default 2)")
      ->check(CLI::Range(0.1, 86400.0).description("0.1 to 86400 s"));
  a.top->add_flag("--once", a.top_opts.once,
                  "print one frame and exit (no screen clearing); with --json one JSON object");
  a.top->add_option("--pools", a.top_opts.pools, "how many pools to show (default 10)")
      ->check(CLI::Range(0, 1000000).description("0 to 1000000"));
}

// Parses argv into `a`: -1 to go on, else the exit code (help, version: 0; usage errors: 2,
// with the message on stderr).
int parse(CLI::App& app, Args& a, int argc, char** argv) {
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
  if (!a.quota_text.empty()) {
    auto q = tier::parse_size(a.quota_text);
    if (!q) {
      std::fprintf(stderr, "tierctl: --ram-quota: %s\n", q.error().message().c_str());
      return 2;
    }
    a.put_opts.ram_quota = *q;
  }
  return -1;
}

// Runs the subcommand that was given.
tier::Status run(const Args& a, tier::Client& c, tier::ctl::Output& out) {
  using namespace tier::ctl;
  if (*a.status) return cmd_status(c, out);
  if (*a.topo) return cmd_topo(c, out);
  if (*a.pools) return cmd_pools(c, out);
  if (*a.tensors) return cmd_tensors(c, out, a.pool);
  if (*a.put) return cmd_put(c, out, a.pool, a.name, a.file, a.put_opts);
  if (*a.get) return cmd_get(c, out, a.pool, a.name, a.file, a.get_wait);
  if (*a.rm) return cmd_rm(c, out, a.pool, a.name);
  if (*a.evict) return cmd_evict(c, out, a.pool, a.name);
  if (*a.prefetch) return cmd_prefetch(c, out, a.pool, a.name);
  if (*a.snapshot) return cmd_snapshot(c, out, a.pool, a.snap_opts);
  if (*a.snapshots) return cmd_snapshots(c, out, a.pool);
  if (*a.restore) return cmd_restore(c, out, a.pool, a.restore_id);
  if (*a.drop) return cmd_drop(c, out, a.pool, a.drop_yes);
  if (*a.metrics) return cmd_metrics(c, out);
  if (*a.top) return cmd_top(c, out, a.top_opts);
  return tier::Status();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tierctl: inspect and drive the tierd memory-tier daemon on this node", "tierctl"};
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // --json and --socket also work after the command
  app.set_version_flag("--version", std::string("tierctl ") + TIER_VERSION);

  Args a;
  app.add_option("--socket", a.socket,
                 "tierd control socket (default: $TIERD_SOCKET or /run/tierd/tierd.sock)");
  app.add_flag("--json", a.json, "print one JSON document instead of tables");
  app.add_option("--connect-timeout", a.timeout_ms, "keep retrying to connect for this many ms (default 0)")
      ->check(CLI::NonNegativeNumber);
  add_tensor_commands(app, a);
  add_pool_commands(app, a);
  for (auto* sc : app.get_subcommands({}))
    sc->footer("Run 'tierctl --help' for the socket, --json and exit codes.");
  if (int rc = parse(app, a, argc, argv); rc >= 0) return rc;

  auto client = tier::Client::connect(
      a.socket, {.client_name = "tierctl", .connect_timeout = std::chrono::milliseconds(a.timeout_ms)});
  if (!client) return fail_with(client.error());
  tier::ctl::Output out{a.json};
  tier::Status st;
  try {
    st = run(a, **client, out);
  } catch (const std::exception& e) {  // bad_alloc, or JSON of invalid UTF-8 from the daemon
    st = tier::Status(tier::Code::kInternal, e.what());
  }
  if (!st.is_ok()) return fail_with(st);
  return 0;
}
