// tier-bench <ram|rpc|nvme|load|catalog|all>: every figure measured side by side with its baseline in
// one run, printed as one JSON object per line on stdout (see suites.hpp for the keys).
// Exit status: 0 ok, 1 a suite failed (message on stderr), 2 usage.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>

#include "suites.hpp"
#include "base/sizes.hpp"

namespace {

constexpr const char* kFooter = R"(
Suites:
  ram   read/write of 1 MiB .. 1 GiB tensors through a held lease, and lease + copy + release,
        vs memcpy between private buffers (GB/s)
  rpc   lease latency and lease+release cycle vs a raw SOCK_SEQPACKET ping-pong of the same
        message sizes (us); lease_batch of 256 tensors per second (leases/s)
  nvme  spill and fetch vs raw io_uring O_DIRECT on --dir
  load  many clients at once (--clients, --seconds)
  catalog  --tensors N (default 1000000) tiny tensors created into one pool by --clients
        clients, vs a 10k-tensor pool: create rate, lease and open latency vs a 1k-tensor pool,
        paged list, drop, tierd RSS per tensor; --keep (with --socket) leaves the pools
  all   every suite in this order (nvme only when --dir is given; not catalog)

Without --socket, tier-bench starts a private tierd (the binary next to tier-bench) on a
temporary socket and state directory, and stops it at the end.

Output: one JSON object per line on stdout:
  {"name":"ram.read.held","bytes":1048576,"value":11.2,"unit":"GB/s","baseline":11.5,"ratio":0.97}
ratio = value / baseline. Without --json a readable table also goes to stderr.)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tier::bench;
  CLI::App app{"tier-bench: tierd benchmarks, each against its baseline in the same run", "tier-bench"};
  app.footer(kFooter);
  BenchOptions o;
  std::string suite;
  app.add_option("SUITE", suite, "ram, rpc, nvme, load, catalog or all")
      ->required()
      ->check(CLI::IsMember({"ram", "rpc", "nvme", "load", "catalog", "all"}));
  app.add_flag("--json", o.json, "JSON lines only (no table on stderr)");
  app.add_option("--socket", o.socket, "use this running tierd instead of starting a private one");
  app.add_option("--dir", o.dir, "directory on the NVMe device under test (nvme suite)");
  app.add_option("--clients", o.clients, "concurrent clients (load and catalog suites, default 64)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seconds", o.seconds, "duration (load suite, default 10)")->check(CLI::PositiveNumber);
  app.add_option("--tensors", o.tensors, "tensors in the big pool (catalog suite, default 1000000)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--keep", o.keep, "leave the catalog suite's pools in the daemon (needs --socket)");
  std::vector<std::string> sizes;
  app.add_option("--sizes", sizes, "nvme suite: tensor sizes of the spill/fetch figures (e.g. 1M,1G)")
      ->delimiter(',');
  app.add_option("--samples", o.samples, "nvme suite: samples per spill/fetch figure (default 3)")
      ->check(CLI::PositiveNumber);
  CLI::Option* only_bandwidth = app.add_flag("--only-bandwidth", o.only_bandwidth,
                                             "nvme suite: spill/fetch figures only (no daemon plan)");
  app.add_option("--stripe-dir", o.stripe_dirs,
                 "nvme suite: another directory (device) the engine stripes over; repeatable. The raw "
                 "ceiling stays that of --dir alone, so the ratio shows the scaling");
  app.add_flag("--no-fresh", o.no_fresh,
               "nvme suite: skip the fresh-tier figures (each needs a new data file)");
  app.add_flag("--no-prepare", o.no_prepare,
               "nvme suite: do not prepare data files (spills write into unwritten extents, as before)");
  app.add_flag("--no-ceiling", o.no_ceiling,
               "nvme suite: measure the engine only, without the raw ceiling's loops between its "
               "samples (for tools/bench-deepnvme, which measures the ceiling as a side of its own)")
      ->needs(only_bandwidth);
  std::string flush_behind;
  app.add_option("--flush-behind", flush_behind,
                 "nvme suite: the engine's write-behind flush interval (bytes, e.g. 64M; 0 = off; "
                 "default: the engine's)");
  app.add_option("--queue-depth", o.queue_depth,
                 "nvme suite: the engine's requests in flight per directory (default: tierd's, 32)")
      ->check(CLI::Range(1u, 4096u));
  std::string request_size;
  app.add_option(
      "--request-size", request_size,
      "nvme suite: the engine's bytes per request, 4 KiB multiples up to 64M (default: tierd's, 1M)");
  app.add_flag("--quick", o.quick, "fewer sizes and repetitions (for tests; figures are noisier)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "tier-bench: %s\nRun 'tier-bench --help' for usage.\n", e.what());
    return 2;
  }
  // A size in whole 4 KiB pages, at most `max`; says why not (then nullopt).
  auto pages = [](const char* option, const std::string& text, uint64_t max) -> std::optional<uint64_t> {
    auto v = tier::parse_size(text);
    if (v && *v > 0 && *v % 4096 == 0 && *v <= max) return *v;
    std::fprintf(stderr, "tier-bench: %s: '%s' is not a size in 4 KiB multiples%s\n", option, text.c_str(),
                 max == UINT64_MAX ? "" : (" up to " + tier::format_size(max)).c_str());
    return std::nullopt;
  };
  for (const std::string& text : sizes) {
    auto v = pages("--sizes", text, UINT64_MAX);
    if (!v) return 2;
    o.sizes.push_back(*v);
  }
  if (!flush_behind.empty()) {
    auto v = tier::parse_size(flush_behind);
    if (!v) {
      std::fprintf(stderr, "tier-bench: --flush-behind: '%s' is not a size\n", flush_behind.c_str());
      return 2;
    }
    o.flush_behind = static_cast<int64_t>(*v);
  }
  if (!request_size.empty()) {
    auto v = pages("--request-size", request_size, uint64_t{64} << 20);
    if (!v) return 2;
    o.request_size = static_cast<uint32_t>(*v);
  }
  try {
    if (suite == "ram") return run_ram(o);
    if (suite == "rpc") return run_rpc(o);
    if (suite == "nvme") return run_nvme(o);
    if (suite == "load") return run_load(o);
    if (suite == "catalog") return run_catalog(o);
    int rc = 0;
    rc |= run_ram(o);
    rc |= run_rpc(o);
    if (o.dir.empty()) std::fprintf(stderr, "tier-bench: nvme suite skipped (needs --dir)\n");
    else rc |= run_nvme(o);
    rc |= run_load(o);
    return rc ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tier-bench: %s\n", e.what());
    return 1;
  }
}
