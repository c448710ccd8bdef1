#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/config.hpp"
#include "core/toml_text.hpp"
#include "tier/types.hpp"
#include "base/sizes.hpp"

using namespace tier;
using namespace tier::daemon;

TEST_CASE("config: defaults from empty text") {
  auto c = parse_config("");
  REQUIRE(c);
  CHECK(c->state_dir == "/var/lib/tierd");
  CHECK(c->ram == "50%");
  CHECK(c->hugepages == HugePages::kNone);
  CHECK(c->alignment == "2M");
  CHECK(c->nvme.empty());
  CHECK(c->watchdog);
  CHECK_FALSE(c->remove_arenas_on_exit);
}

TEST_CASE("config: every key") {
  auto c = parse_config(R"(
socket = "/tmp/x.sock"
state_dir = "/tmp/state"
ram = "64G"
pool_quota = 1073741824
nvme_pool_quota = "10%"
alignment = "4K"
hugepages = "2M"
hugetlbfs_mount = "/dev/hugepages"
topology = "synthetic:pack:2 numa:1 core:1 pu:1"
nvme = [ { path = "/mnt/a", numa_node = 1 }, { path = "/mnt/b" } ]
admin_group = "wheel"
watchdog = false
status_interval_ms = 1000
max_clients = 10
max_leases_per_client = 99
remove_arenas_on_exit = true
log_level = "debug"
nvme_hash_threads = 8
nvme_flush_behind = "16M"
)");
  REQUIRE(c);
  CHECK(c->socket == "/tmp/x.sock");
  CHECK(c->state_dir == "/tmp/state");
  CHECK(c->ram == "64G");
  CHECK(c->pool_quota == "1073741824");
  CHECK(c->alignment == "4K");
  CHECK(c->hugepages == HugePages::k2M);
  CHECK(c->topology == "synthetic:pack:2 numa:1 core:1 pu:1");
  REQUIRE(c->nvme.size() == 2);
  CHECK(c->nvme[0].path == "/mnt/a");
  CHECK(c->nvme[0].numa_node == 1);
  CHECK(c->nvme[1].numa_node == -1);
  CHECK(c->admin_group == "wheel");
  CHECK_FALSE(c->watchdog);
  CHECK(c->status_interval_ms == 1000);
  CHECK(c->max_clients == 10);
  CHECK(c->max_leases_per_client == 99);
  CHECK(c->remove_arenas_on_exit);
  CHECK(c->log_level == "debug");
  CHECK(c->nvme_hash_threads == 8);
  CHECK(c->nvme_flush_behind == 16u << 20);
}

TEST_CASE("config: errors name the problem") {
  auto expect_err = [](std::string_view text, std::string_view needle) {
    auto c = parse_config(text);
    REQUIRE_FALSE(c);
    CHECK(c.error().code() == Code::kInvalidArgument);
    INFO(c.error().message());
    CHECK(c.error().message().find(needle) != std::string::npos);
  };
  expect_err("rma = \"1G\"", "unknown config key 'rma'");
  expect_err("ram = \"12Q\"", "ram");
  expect_err("ram = -5", "ram");
  expect_err("ram = \"200%\"", "ram");
  expect_err("hugepages = \"4M\"", "hugepages");
  expect_err("watchdog = 1", "watchdog");
  expect_err("socket = 3", "socket");
  expect_err("alignment = \"3K\"", "power of two");
  expect_err("alignment = \"2G\"", "power of two");
  expect_err("nvme = \"/mnt/a\"", "nvme");
  expect_err("nvme = [ { numa_node = 0 } ]", "needs a path");
  expect_err("nvme = [ { path = \"/a\", speed = 3 } ]", "nvme.speed");
  expect_err("status_interval_ms = 5", "status_interval_ms");
  expect_err("log_level = \"loud\"", "log_level");
  expect_err("nvme_hash_threads = -1", "nvme_hash_threads");
  expect_err("nvme_hash_threads = 257", "nvme_hash_threads");
  expect_err("nvme_flush_behind = \"10%\"", "nvme_flush_behind");
  expect_err("nvme_flush_behind = -1", "nvme_flush_behind");
  expect_err("nvme_flush_behind = \"fast\"", "nvme_flush_behind");
  expect_err("state_dir = \"\"", "state_dir");
  expect_err("max_pools_per_uid = 0", "max_pools_per_uid");
  expect_err("max_reply_bytes_per_connection = \"10%\"", "max_reply_bytes_per_connection");
  expect_err("max_reply_bytes_per_uid = \"1K\"", "max_reply_bytes_per_uid");
  expect_err("metrics_http_per_pool = 1", "metrics_http_per_pool");
  expect_err("ram = \"1G\"\nram = \"2G\"", "line 2");
  expect_err("snapshot_free_floor = \"lots\"", "snapshot_free_floor");
  expect_err("journal_reserve = -1", "journal_reserve");
  expect_err("[section]\nx = 1", "unknown config key 'section'");
  expect_err("ram = \"1G", "syntax error");
}

// toml++ 3.3.0 reaches TOML_UNREACHABLE on code points U+00A1..U+0499 outside strings (issue 33,
// found by fuzz_generator): such text is refused, naming its line, before toml++ sees it.
TEST_CASE("config: non-ASCII text outside strings and comments is refused before parsing") {
  for (std::string_view text : {"\xd1\x89 = 1", "ram = \"1G\"\nra\xd1\x89m = 1", "ram = 1\xd1\x89",
                                "[a \xd1\x89]", "nvme = [ { path = \"/a\" \xc2\xa1} ]"}) {
    INFO(text);
    auto c = parse_config(text);
    REQUIRE_FALSE(c);
    CHECK(c.error().code() == Code::kInvalidArgument);
    CHECK(c.error().message().find("outside a quoted string or comment") != std::string::npos);
  }
  auto c = parse_config("ram = \"1G\"\n\n  x\xd1\x89 = 2");
  REQUIRE_FALSE(c);
  CHECK(c.error().message().find("line 3") != std::string::npos);
  // Strings and comments may hold UTF-8, also across multi-line strings and escapes.
  auto ok = parse_config(
      "# \xd1\x89 comment\nstate_dir = \"/var/lib/t\xd1\x89\" # \xc2\xa1\n"
      "socket = '/run/\xd1\x89'\n");
  INFO((ok ? std::string() : ok.error().message()));
  REQUIRE(ok);
  CHECK(ok->state_dir == "/var/lib/t\xd1\x89");
  using tier::toml_text::text_problem;
  CHECK_FALSE(text_problem("a = \"\"\"x\n\xd1\x89 \\\" \"\"\"\"\"\nb = 1"));
  CHECK_FALSE(text_problem("a = '''x\n\xd1\x89'''\nb = \"\\\"\xd1\x89\""));
  CHECK(text_problem("a = \"\"\"x\"\"\" \xd1\x89"));  // after the string closed
  CHECK(text_problem("a = \"x\\\"\" \xd1\x89"));      // \" inside, then the close
  CHECK(text_problem("a = \"\xd1\""));                // truncated UTF-8
  CHECK(text_problem("a = \"\xc0\x80\""));            // overlong
  CHECK(text_problem("a = \"\xed\xa0\x80\""));        // a surrogate
  CHECK(text_problem("a = \"x\n\xd1\x89"));           // an unterminated string ends at its line
  // A quote in the middle of a bare value opens no string: toml++ reads on past it (found by
  // fuzz_generator, fuzz/corpus/fuzz_generator/quote-mid-value).
  CHECK(text_problem("a = r\"\xef\xbb\xbe\""));
  CHECK(text_problem(std::string_view("a=-r=r\0\0\0\"b\xef\xbb\xbe\"", 15)));
  CHECK(text_problem("a = \"x\"\"\xd1\x89\""));  // a quote right after a string
  // Where TOML lets a string begin it may still hold UTF-8: keys, dotted keys, arrays, tables.
  CHECK_FALSE(
      text_problem("\"\xd1\x89\" = 1\na.\"\xd1\x89\" = [ \"\xd1\x89\",'\xd1\x89' ]\nt = {k=\"\xd1\x89\"}"));
  CHECK_FALSE(text_problem("[\"\xd1\x89\"]\nx = [\n  \"\xd1\x89\",\n]"));
}

TEST_CASE("config: the shipped example parses and equals the defaults") {
  std::ifstream f(std::string(TIER_SOURCE_DIR) + "/daemon/tierd.toml.example");
  REQUIRE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  auto c = parse_config(ss.str());
  REQUIRE(c);
  Config d;
  CHECK(c->state_dir == d.state_dir);
  CHECK(c->ram == d.ram);
  CHECK(c->pool_quota == d.pool_quota);
  CHECK(c->alignment == d.alignment);
  CHECK(c->max_leases_per_client == d.max_leases_per_client);
  CHECK(c->nvme_hash_threads == d.nvme_hash_threads);
  CHECK(c->nvme_flush_behind == d.nvme_flush_behind);
  CHECK(c->max_pools_per_uid == d.max_pools_per_uid);
  CHECK(c->uid_pinned_quota == d.uid_pinned_quota);
  CHECK(c->uid_ram_quota == d.uid_ram_quota);
  CHECK(c->uid_nvme_quota == d.uid_nvme_quota);
  CHECK(c->max_reply_bytes_per_connection == d.max_reply_bytes_per_connection);
  CHECK(c->max_reply_bytes_per_uid == d.max_reply_bytes_per_uid);
  CHECK(c->metrics_http_per_pool == d.metrics_http_per_pool);
  CHECK(c->snapshot_free_floor == d.snapshot_free_floor);
  CHECK(c->journal_reserve == d.journal_reserve);
  // The commented nvme example is itself valid.
  std::string uncommented = ss.str();
  for (std::string from : {"# nvme = [", "#   { path = \"/mnt/nvme0/tierd\", numa_node = 0 },",
                           "#   { path = \"/mnt/nvme1/tierd\", numa_node = 1 },", "# ]"}) {
    auto pos = uncommented.find(from);
    REQUIRE(pos != std::string::npos);
    uncommented.erase(pos, 2);
  }
  auto c2 = parse_config(uncommented);
  REQUIRE(c2);
  CHECK(c2->nvme.size() == 2);
}

TEST_CASE("config: command-line overrides and size resolution") {
  Config c;
  Overrides o;
  o.ram = "25%";
  o.state_dir = "/tmp/s";
  o.hugepages = "1G";
  o.nvme_dirs = {"/tmp"};
  o.topology = "synthetic:numa:2 core:1 pu:1";
  REQUIRE(apply_overrides(c, o));
  CHECK(c.ram == "25%");
  CHECK(c.hugepages == HugePages::k1G);
  REQUIRE(c.nvme.size() == 1);
  Overrides bad;
  bad.ram = "lots";
  CHECK_FALSE(apply_overrides(c, bad));
  Overrides bad2;
  bad2.hugepages = "3M";
  CHECK_FALSE(apply_overrides(c, bad2));

  auto r = resolve_sizes(c, 8ull << 30);
  REQUIRE(r);
  CHECK(r->ram == 2ull << 30);
  CHECK(r->pool_quota == 2ull << 30);  // 100% of the tier
  CHECK(r->alignment == 2ull << 20);
  CHECK(r->uid_ram_quota == 1536ull << 20);  // 75% of the tier by default
  CHECK(r->uid_nvme_quota == 0);             // a share of the NVMe tier: resolved by make_state
  c.uid_nvme_quota = "1T";
  CHECK(resolve_sizes(c, 8ull << 30)->uid_nvme_quota == 1ull << 40);
  c.uid_nvme_quota = "lots";
  CHECK_FALSE(resolve_sizes(c, 8ull << 30));
  c.uid_nvme_quota = "75%";
  c.ram = "16G";
  CHECK_FALSE(resolve_sizes(c, 8ull << 30));  // more than the machine
  c.ram = "1.5G";
  c.pool_quota = "50%";
  r = resolve_sizes(c, 8ull << 30);
  REQUIRE(r);
  CHECK(r->ram == 1536ull << 20);
  CHECK(r->pool_quota == 768ull << 20);
  CHECK(read_mem_total().value_or(0) > 0);
}

TEST_CASE("config: sizes") {
  CHECK(parse_size("4096").value() == 4096);
  CHECK(parse_size("512M").value() == 512ull << 20);
  CHECK(parse_size("64G").value() == 64ull << 30);
  CHECK(parse_size("1.5T").value() == 3ull << 39);
  CHECK(parse_size("80%", 1000).value() == 800);
  CHECK_FALSE(parse_size("80%"));
  CHECK_FALSE(parse_size("1.5"));
  CHECK_FALSE(parse_size("G"));
}

TEST_CASE("config: paths and the socket fallback") {
  Config c;
  c.state_dir = (std::filesystem::temp_directory_path() / "tierd-config-test-state").string();
  c.nvme = {{"/nonexistent/nvme", -1}};
  auto st = check_paths(c);
  REQUIRE_FALSE(st);
  CHECK(st.message().find("/nonexistent/nvme") != std::string::npos);
  c.nvme = {{"/tmp", -1}};
  CHECK(check_paths(c));
  std::filesystem::remove_all(c.state_dir);
  c.topology = "/nonexistent.xml";
  CHECK_FALSE(check_paths(c));
  c.socket = "/x/y.sock";
  CHECK(resolve_socket(c) == "/x/y.sock");
  c.socket.clear();
  setenv("TIERD_SOCKET", "/env.sock", 1);
  CHECK(resolve_socket(c) == "/env.sock");
  unsetenv("TIERD_SOCKET");
  CHECK(resolve_socket(c) == "/run/tierd/tierd.sock");
}
