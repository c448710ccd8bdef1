// tierd: the per-node memory-tier daemon. Configuration: tierd.toml.example; internals: docs/daemon.md.
//
// Exit codes: 0 clean stop (or a valid --check-config), 1 runtime error, 2 usage or
// configuration error (one line on stderr naming the problem).
#include <CLI/CLI.hpp>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "core/config.hpp"
#include "base/log.hpp"
#include "ram/arena.hpp"
#include "server/server.hpp"
#include "daemon/daemon.hpp"
#include "base/sizes.hpp"

using namespace tier;
using namespace tier::daemon;

namespace {

// A bad option or configuration: one line at error priority (<3> under journald).
int usage_error(const std::string& msg) {
  log_error("{}", msg);
  return 2;
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
// Sanitizer builds (TIER_SANITIZE): hwloc's PCI discovery plugin (libpciaccess, loaded with
// dlopen and unloaded after the load) leaks about 1 KiB once per topology load, which would
// turn every clean exit into exit code 1. The plugin is gone when LeakSanitizer reports, so
// only a full (slow) unwind shows the libhwloc frame the suppression matches.
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }
extern "C" const char* __lsan_default_suppressions() { return "leak:libhwloc.so\n"; }
#endif

int main(int argc, char** argv) {
  // The stop signals are read from a signalfd by the event loop (Server::run). A
  // process-directed signal goes to any thread that does not block it, and threads inherit
  // the mask of their creator: blocked here, before the NVMe engine's threads start, so none
  // of them takes the default action (an unclean exit on systemctl stop, arenas left behind).
  const sigset_t stop = stop_signals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  init_logging();
  CLI::App app{"tierd: host RAM (NUMA-aware) and local NVMe as one memory tier for training state"};
  app.set_version_flag("--version", std::string("tierd ") + kDaemonVersion);
  std::string config_path;
  Overrides ov;
  std::string socket, state_dir, ram, pool_quota, hugepages, topo_xml, topo_synth;
  bool foreground = false, check_config = false, remove_on_exit = false, cleanup = false;
  app.add_option("--config", config_path, "TOML configuration file")->check(CLI::ExistingFile);
  app.add_option("--socket", socket, "control socket (default $TIERD_SOCKET, else /run/tierd/tierd.sock)");
  app.add_option("--state-dir", state_dir, "state directory (default /var/lib/tierd)");
  app.add_option("--ram", ram, "RAM tier size: 64G, 1.5T or 80% of MemTotal");
  app.add_option("--nvme-dir", ov.nvme_dirs, "an NVMe tier directory (repeatable)");
  app.add_flag("--foreground", foreground,
               "stay in the foreground (tierd never forks; accepted for unit files)");
  app.add_flag("--check-config", check_config, "validate the configuration and exit");
  auto* xml_opt =
      app.add_option("--topology-xml", topo_xml, "use an hwloc XML topology instead of this machine's");
  auto* synth_opt = app.add_option("--topology-synthetic", topo_synth,
                                   "use an hwloc synthetic topology, e.g. \"pack:2 numa:1 core:4 pu:1\"");
  app.add_option("--hugepages", hugepages, "huge pages for arenas: none, 2M or 1G");
  app.add_option("--pool-quota", pool_quota, "default RAM quota of a pool: a size or % of the RAM tier");
  app.add_flag("--remove-arenas-on-exit", remove_on_exit,
               "unlink this daemon's arenas on a clean exit (tests)");
  app.add_flag("--cleanup-arenas", cleanup,
               "unlink every arena of this state dir and exit (tierd must not be running)");
  xml_opt->excludes(synth_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) { return app.exit(e); } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  (void)foreground;

  Config cfg;
  if (!config_path.empty()) {
    auto c = load_config(config_path);
    if (!c) return usage_error(c.error().message());
    cfg = std::move(*c);
  }
  if (!socket.empty()) ov.socket = socket;
  if (!state_dir.empty()) ov.state_dir = state_dir;
  if (!ram.empty()) ov.ram = ram;
  if (!pool_quota.empty()) ov.pool_quota = pool_quota;
  if (!hugepages.empty()) ov.hugepages = hugepages;
  if (!topo_xml.empty()) ov.topology = topo_xml;
  if (!topo_synth.empty()) ov.topology = "synthetic:" + topo_synth;
  if (remove_on_exit) ov.remove_arenas_on_exit = true;
  if (Status st = apply_overrides(cfg, ov); !st) return usage_error(st.message());
  if (cfg.log_level == "debug") set_log_level(LogLevel::kDebug);
  else if (cfg.log_level == "warning") set_log_level(LogLevel::kWarning);
  else if (cfg.log_level == "error") set_log_level(LogLevel::kError);

  if (cleanup) {
    size_t n = remove_arenas(arena_prefix(cfg.state_dir), cfg.hugetlbfs_mount);
    std::printf("removed %zu arenas of %s\n", n, cfg.state_dir.c_str());
    return 0;
  }
  // The same checks the start makes, so that --check-config accepts only what starts.
  if (Status st = check_socket_path(resolve_socket(cfg)); !st) return usage_error(st.message());
  if (Status st = check_paths(cfg, !check_config); !st) return usage_error(st.message());
  auto mem = read_mem_total();
  if (!mem) {
    log_error("{}", mem.error().message());
    return 1;
  }
  auto sizes = resolve_sizes(cfg, *mem);
  if (!sizes) return usage_error(sizes.error().message());
  if (Status shm = check_shm_capacity(sizes->ram, cfg.hugepages); !shm) return usage_error(shm.message());
  if (check_config) {
    // Topology is part of the configuration: load it too.
    auto topo = make_topology_source(cfg.topology)->load();
    if (!topo) return usage_error(topo.error().message());
    if (Status hs = check_hugepages(cfg.hugepages, cfg.hugetlbfs_mount); !hs)
      return usage_error(hs.message());
    std::printf(
        "configuration ok: socket %s, state dir %s, RAM tier %s over %zu NUMA nodes, "
        "%zu NVMe dirs\n",
        resolve_socket(cfg).c_str(), cfg.state_dir.c_str(), format_size(sizes->ram).c_str(),
        topo->nodes.size(), cfg.nvme.size());
    std::printf("tenant limits:\n%s", describe_limits(cfg, *sizes).c_str());
    return 0;
  }
  std::string sock = resolve_socket(cfg);
  auto state = make_state(std::move(cfg), *sizes);
  if (!state) {
    log_error("{}", state.error().message());
    return state.error().code() == Code::kInvalidArgument ? 2 : 1;
  }
  // Journal replay, arena re-attach (restart) or snapshot restore (reboot). A damaged journal
  // is a refusal to start, never a silent loss.
  if (Status st = open_durability(**state); !st) {
    log_error("cannot recover the catalog: {}", st.message());
    return 1;
  }
  if ((*state)->tiering) {
    if (Status st = (*state)->tiering->adopt_catalog(); !st) {
      log_error("{}", st.message());
      return 1;
    }
  }
  Server server(**state, sock);
  if (Status st = server.listen(); !st) {
    log_error("{}", st.message());
    return 1;
  }
  if (Status st = server.run(); !st) {
    log_error("{}", st.message());
    return 1;
  }
  return 0;
}
