// Prometheus exposition: `tierctl metrics` (paged over the socket) and the optional HTTP
// listener on 127.0.0.1 both serve well-formed text with HELP/TYPE for every family and a
// series per pool; `tierctl top --once` prints one frame.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "run_binary.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

using tier::test::bin_path;
using tier::test::run_binary;
using tier::test::TestDaemon;

namespace {

// Checks the text format line by line; returns the samples by series (name{labels}).
std::map<std::string, double> parse_exposition(const std::string& text) {
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|\+Inf|NaN)$)");
  static const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$)");
  static const std::regex type(
      R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$)");
  std::map<std::string, double> out;
  std::set<std::string> helped, typed;
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    INFO("line: " << line);
    if (line.empty()) continue;
    if (std::regex_match(line, m, help)) {
      CHECK(helped.insert(m[1]).second);
      continue;
    }
    if (std::regex_match(line, m, type)) {
      CHECK(typed.insert(m[1]).second);
      types[m[1]] = m[2];
      continue;
    }
    REQUIRE(std::regex_match(line, m, sample));
    std::string name = m[1];
    std::string family = name;
    if (!typed.count(family))
      for (const char* suf : {"_bucket", "_sum", "_count"})
        if (family.size() > std::strlen(suf) && family.ends_with(suf) &&
            types[family.substr(0, family.size() - std::strlen(suf))] == "histogram")
          family = family.substr(0, family.size() - std::strlen(suf));
    CHECK(typed.count(family) == 1);  // TYPE (and HELP) precede the family's samples
    CHECK(helped.count(family) == 1);
    out[name + m[2].str()] = std::stod(m[3].str() == "+Inf" ? "inf" : m[3].str());
  }
  CHECK(helped == typed);
  return out;
}

std::string http_get(int port, const std::string& path) {
  int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return {};
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::write(s, req.data(), req.size());
  std::string resp;
  char buf[8192];
  ssize_t n;
  while ((n = ::read(s, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
  ::close(s);
  return resp;
}

}  // namespace

TEST_CASE("metrics over the socket (paged) and over HTTP on 127.0.0.1 parse as Prometheus text") {
  char tmpl[] = "/tmp/tier-metrics.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string cfg = std::string(tmpl) + "/m.toml";
  std::ofstream(cfg)
      << "metrics_listen = \"127.0.0.1:0\"\nstatus_interval_ms = 100\nremove_arenas_on_exit = true\n"
      << "metrics_http_per_pool = true\n";  // off by default: see the next case
  TestDaemon d(tier::test::DaemonOptions::with_config(cfg));
  // Enough pools that the text is several 4 KiB pages.
  {
    auto c = tier::Client::connect(d.socket());
    REQUIRE(c);
    for (int i = 0; i < 60; ++i) {
      std::string name = "metrics-pool-" + std::to_string(i);
      REQUIRE((*c)->create_pool(name, {.ram_quota = 4 << 20}));
      auto t = (*c)->create_tensor(name, {.name = "t", .size = 8192, .shape = {}, .placement = {}});
      REQUIRE(t);
      auto l = (*c)->lease(t->id, tier::LeaseMode::kRead);
      REQUIRE(l);
    }
  }
  auto r = run_binary(bin_path("tierctl"), {"--socket", d.socket(), "metrics"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.size() > 3 * 4096);
  auto sock = parse_exposition(r.out);
  CHECK(sock.at("tierd_pools") == 60);
  CHECK(sock.at("tierd_pool_tensors{pool=\"metrics-pool-59\",uid=\"0\"}") == 1);
  CHECK(sock.at("tierd_pool_ram_used_bytes{pool=\"metrics-pool-0\",uid=\"0\"}") == 8192);
  CHECK(sock.at("tierd_ram_capacity_bytes{tier=\"ram\",node=\"0\"}") > 0);
  CHECK(sock.at("tierd_lease_latency_seconds_count") == 60);
  CHECK(sock.at("tierd_lease_latency_seconds_bucket{le=\"+Inf\"}") == 60);

  // The HTTP listener: its port (0 = any) is in the log line.
  std::smatch m;
  std::string log = d.log();
  REQUIRE(std::regex_search(log, m, std::regex(R"(http://127\.0\.0\.1:([0-9]+)/metrics)")));
  int port = std::stoi(m[1]);
  std::string resp;
  for (int i = 0; i < 50; ++i) {  // published on the next tick (100 ms)
    resp = http_get(port, "/metrics");
    if (resp.find("metrics-pool-59") != std::string::npos) break;
    ::usleep(50000);
  }
  REQUIRE(resp.rfind("HTTP/1.", 0) == 0);
  CHECK(resp.find(" 200 ") != std::string::npos);
  CHECK(resp.find("text/plain; version=0.0.4") != std::string::npos);
  auto body = resp.substr(resp.find("\r\n\r\n") + 4);
  auto http = parse_exposition(body);
  CHECK(http.at("tierd_pools") == 60);
  CHECK(http.at("tierd_pool_ram_used_bytes{pool=\"metrics-pool-59\",uid=\"0\"}") == 8192);
  CHECK(http_get(port, "/nope").find(" 404 ") != std::string::npos);
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

TEST_CASE("the metrics HTTP endpoint names no pool unless metrics_http_per_pool is on") {
  char tmpl[] = "/tmp/tier-metrics.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string cfg = std::string(tmpl) + "/m.toml";
  std::ofstream(cfg)
      << "metrics_listen = \"127.0.0.1:0\"\nstatus_interval_ms = 100\nremove_arenas_on_exit = true\n";
  TestDaemon d(tier::test::DaemonOptions::with_config(cfg));
  {
    auto c = tier::Client::connect(d.socket());
    REQUIRE(c);
    REQUIRE((*c)->create_pool("secret-pool-name", {.ram_quota = 4 << 20}));
  }
  std::smatch m;
  std::string log = d.log();
  REQUIRE(std::regex_search(log, m, std::regex(R"(http://127\.0\.0\.1:([0-9]+)/metrics)")));
  int port = std::stoi(m[1]);
  std::string resp;
  for (int i = 0; i < 50; ++i) {  // published on the next tick (100 ms)
    resp = http_get(port, "/metrics");
    if (resp.find("tierd_pools 1") != std::string::npos) break;
    ::usleep(50000);
  }
  auto http = parse_exposition(resp.substr(resp.find("\r\n\r\n") + 4));
  CHECK(http.at("tierd_pools") == 1);  // daemon-wide series stay
  CHECK(resp.find("secret-pool-name") == std::string::npos);
  CHECK(resp.find("pool=") == std::string::npos);
  // The socket's Metrics still shows the owner its pools.
  auto r = run_binary(bin_path("tierctl"), {"--socket", d.socket(), "metrics"});
  CHECK(r.out.find("tierd_pool_ram_quota_bytes{pool=\"secret-pool-name\",uid=\"0\"}") != std::string::npos);
  std::error_code ec;
  std::filesystem::remove_all(tmpl, ec);
}

TEST_CASE("metrics_listen refuses a non-loopback address") {
  char tmpl[] = "/tmp/tier-metrics.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  std::string dir = tmpl, cfg = dir + "/m.toml";
  std::ofstream(cfg) << "metrics_listen = \"0.0.0.0:9464\"\n";
  auto r = run_binary(bin_path("tierd"), {"--config", cfg, "--check-config"}, {}, 30);
  CHECK(r.rc == 2);
  CHECK(r.err.find("only loopback") != std::string::npos);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST_CASE("tierctl top --once prints one frame with tiers and the top pools") {
  TestDaemon d;
  auto c = tier::Client::connect(d.socket());
  REQUIRE(c);
  REQUIRE((*c)->create_pool("big", {.ram_quota = 8 << 20}));
  REQUIRE((*c)->create_pool("small", {.ram_quota = 8 << 20}));
  REQUIRE((*c)->create_tensor("big", {.name = "a", .size = 1 << 20, .shape = {}, .placement = {}}));
  REQUIRE((*c)->create_tensor("small", {.name = "a", .size = 4096, .shape = {}, .placement = {}}));
  auto r = run_binary(bin_path("tierctl"), {"--socket", d.socket(), "top", "--once"});
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("\x1b[2J") == std::string::npos);  // --once does not clear the screen
  CHECK(r.out.find("RAM tier") != std::string::npos);
  CHECK(r.out.find("NVMe tier") != std::string::npos);
  CHECK(r.out.find("Bandwidth") != std::string::npos);
  auto big = r.out.find("big"), small = r.out.find("small");
  REQUIRE(big != std::string::npos);
  REQUIRE(small != std::string::npos);
  CHECK(big < small);  // ordered by RAM use
  CHECK(r.out.find("1.00 MiB") != std::string::npos);
  CHECK(run_binary(bin_path("tierctl"), {"--socket", d.socket(), "top", "--interval", "0"}).rc == 2);
}
