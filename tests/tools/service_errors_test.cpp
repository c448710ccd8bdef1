// Start-up failures an operator meets under systemd say what was refused and what to change:
// a metrics port that cannot be bound names the errno (not a guess), an NVMe directory on a
// read-only mount (ProtectSystem=strict without ReadWritePaths=) names the directive, and a
// configuration error is one line at error priority (<3> under journald). --check-config
// writes nothing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "run_binary.hpp"
#include "support/daemon_fixture.hpp"

using tier::test::bin_path;
using tier::test::run_binary;

namespace {

// A temporary directory with a state dir, removed on scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/tier-svcerr.XXXXXX";
    REQUIRE(::mkdtemp(tmpl));
    path = tmpl;
    std::filesystem::create_directory(path + "/state");
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::vector<std::string> daemon_args() const {
    return {"--foreground", "--socket", path + "/tierd.sock",     "--state-dir", path + "/state",
            "--ram",        "64M",      "--remove-arenas-on-exit"};
  }
};

}  // namespace

TEST_CASE("a metrics port that is taken is reported with its errno") {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof sa;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  TempDir t;
  std::string cfg = t.path + "/m.toml";
  std::ofstream(cfg) << "metrics_listen = \"127.0.0.1:" << ntohs(sa.sin_port) << "\"\n";
  auto args = t.daemon_args();
  args.insert(args.begin(), {"--config", cfg});
  auto r = run_binary(bin_path("tierd"), args, {}, 30);
  ::close(fd);
  CHECK(r.rc != 0);
  INFO(r.err);
  CHECK(r.err.find("metrics_listen: cannot bind 127.0.0.1:") != std::string::npos);
  CHECK(r.err.find("Address already in use") != std::string::npos);
}

TEST_CASE("an NVMe directory on a read-only mount names ReadWritePaths=") {
  TempDir t;
  std::string nvme = t.path + "/nvme";
  std::filesystem::create_directory(nvme);
  // A private mount namespace with the directory bind-mounted read-only: what systemd's
  // ProtectSystem=strict does to every path not in ReadWritePaths=.
  std::string cmd = "mount --make-rprivate / && mount --bind -o ro " + nvme + " " + nvme + " && exec " +
                    bin_path("tierd") + " --nvme-dir " + nvme;
  for (const auto& a : t.daemon_args()) cmd += " " + a;
  auto r = run_binary("/usr/bin/unshare", {"--mount", "sh", "-c", cmd}, {}, 30);
  CHECK(r.rc != 0);
  INFO(r.err);
  CHECK(r.err.find("Read-only file system") != std::string::npos);
  CHECK(r.err.find("list " + nvme + " in ReadWritePaths=") != std::string::npos);
}

namespace {
size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("a configuration error is logged once, at error priority under journald") {
  TempDir t;
  std::string cfg = t.path + "/bad.toml";
  std::ofstream(cfg) << "bogus_key = 1\n";
  auto args = t.daemon_args();
  args.insert(args.begin(), {"--config", cfg});
  // systemd sets JOURNAL_STREAM when stderr is the journal; <N> prefixes are its priorities.
  auto j = run_binary(bin_path("tierd"), args, {"JOURNAL_STREAM=8:12345"}, 30);
  CHECK(j.rc == 2);
  INFO(j.err);
  CHECK(j.err.rfind("<3>", 0) == 0);
  CHECK(count(j.err, "unknown config key 'bogus_key'") == 1);
  auto plain = run_binary(bin_path("tierd"), args, {}, 30);
  CHECK(plain.rc == 2);
  INFO(plain.err);
  CHECK(plain.err.rfind("tierd: error: ", 0) == 0);
  CHECK(count(plain.err, "unknown config key 'bogus_key'") == 1);
}

TEST_CASE("tierd --check-config creates nothing on disk") {
  TempDir t;
  std::string state = t.path + "/not-yet/state";
  auto ok = run_binary(bin_path("tierd"), {"--check-config", "--state-dir", state, "--ram", "64M"}, {}, 30);
  INFO(ok.err);
  CHECK(ok.rc == 0);
  CHECK_FALSE(std::filesystem::exists(t.path + "/not-yet"));
  // A state dir that could not be created is still refused.
  std::ofstream(t.path + "/file") << "x";
  auto bad = run_binary(bin_path("tierd"),
                        {"--check-config", "--state-dir", t.path + "/file/state", "--ram", "64M"}, {}, 30);
  CHECK(bad.rc == 2);
  CHECK(bad.err.find("cannot create state dir") != std::string::npos);
}
