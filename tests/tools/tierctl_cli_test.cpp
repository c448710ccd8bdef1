// tierctl's command-line behaviour as operators meet it: `top` off a terminal (it must sleep
// between frames, whatever stdin is), `top --once --json`, --version, the unknown-command
// message, refused option values, the exit code of a missing input file, `drop --yes`, and owners
// shown by name.
#include <pwd.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "run_binary.hpp"
#include "support/daemon_fixture.hpp"

using nlohmann::json;
using tier::test::bin_path;
using tier::test::run_binary;
using tier::test::RunResult;
using tier::test::TestDaemon;

namespace {

RunResult ctl(const TestDaemon& d, std::vector<std::string> args, int timeout_s = 60) {
  args.insert(args.begin(), {"--socket", d.socket()});
  return run_binary(bin_path("tierctl"), args, {}, timeout_s);
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

void put_small(const TestDaemon& d, const std::string& pool, const std::string& name) {
  std::string path = d.dir() + "/in-" + name;
  std::ofstream(path) << "four";
  REQUIRE(ctl(d, {"put", pool, name, path}).rc == 0);
}

}  // namespace

TEST_CASE("tierctl top off a terminal draws one frame per interval, with stdin at EOF") {
  TestDaemon d;
  // run_binary gives the child /dev/null as stdin and files as stdout: no terminal anywhere.
  // Killed after 2 s, a 0.5 s interval allows at most 5 frames; a loop that treats a readable
  // EOF as a key press draws thousands.
  auto r = ctl(d, {"top", "--interval", "0.5"}, /*timeout_s=*/2);
  size_t frames = count(r.out, "RAM tier");
  INFO("frames: " << frames << ", bytes: " << r.out.size());
  CHECK(frames >= 1);
  CHECK(frames <= 5);
  CHECK(r.out.find("\x1b[") == std::string::npos);  // no screen control codes into a file
}

// Runs `shell_cmd` on a pseudo-terminal (util-linux script(1)), stdin from `input`.
RunResult on_terminal(const std::string& shell_cmd, const std::string& input, int timeout_s) {
  return run_binary("/bin/sh", {"-c", "printf '" + input + "' | script -qec \"" + shell_cmd + "\" /dev/null"},
                    {}, timeout_s);
}

TEST_CASE("tierctl top on a terminal: the alternate screen, frames clipped to the window") {
  TestDaemon d;
  put_small(d, "a-pool-with-a-rather-long-name", "t");
  auto r = on_terminal(
      "stty cols 40 rows 12; " + bin_path("tierctl") + " --socket " + d.socket() + " top --interval 0.5", "",
      /*timeout_s=*/2);
  CHECK(r.out.find("\x1b[?1049h") != std::string::npos);  // entered the alternate screen
  size_t frames = count(r.out, "\x1b[H\x1b[2J");
  CHECK(frames >= 1);
  CHECK(frames <= 5);
  // Every line of every frame fits the 40 columns (UTF-8 counted by code point).
  std::istringstream lines(r.out);
  std::string line;
  size_t widest = 0;
  while (std::getline(lines, line)) {
    size_t at = line.rfind("\x1b[2J");
    std::string text = at == std::string::npos ? line : line.substr(at + 4);
    size_t cols = 0;
    for (char ch : text)
      if ((static_cast<unsigned char>(ch) & 0xC0) != 0x80 && ch != '\r') ++cols;
    widest = std::max(widest, cols);
  }
  CHECK(widest <= 40);
}

TEST_CASE("tierctl drop asks on a terminal and keeps the pool unless the answer is y") {
  TestDaemon d;
  put_small(d, "kept", "t");
  const std::string drop = bin_path("tierctl") + " --socket " + d.socket() + " drop kept";
  auto no = on_terminal(drop, "n\\n", 10);
  CHECK(no.out.find("[y/N]") != std::string::npos);
  CHECK(json::parse(ctl(d, {"--json", "pools"}).out)["pools"].size() == 1);
  auto yes = on_terminal(drop, "y\\n", 10);
  CHECK(json::parse(ctl(d, {"--json", "pools"}).out)["pools"].empty());
}

TEST_CASE("tierctl top --json prints JSON objects: one with --once, one per frame without") {
  TestDaemon d;
  put_small(d, "alpha", "t");
  auto once = ctl(d, {"top", "--once", "--json"});
  REQUIRE(once.rc == 0);
  json j = json::parse(once.out);  // throws unless the whole output is one document
  CHECK(j["status"]["pools"] == 1);
  REQUIRE(j["top_pools"].size() == 1);
  CHECK(j["top_pools"][0]["name"] == "alpha");
  CHECK(j["top_pools"][0]["owner_uid"].is_number());

  auto stream = ctl(d, {"top", "--json", "--interval", "0.3"}, /*timeout_s=*/1);
  std::istringstream lines(stream.out);
  std::string line;
  size_t objects = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    CHECK(json::parse(line).contains("status"));
    ++objects;
  }
  CHECK(objects >= 1);
  CHECK(objects <= 4);
}

TEST_CASE("tierctl --version, unknown commands and refused option values") {
  TestDaemon d;
  auto v = run_binary(bin_path("tierctl"), {"--version"});
  CHECK(v.rc == 0);
  CHECK(v.out.rfind("tierctl ", 0) == 0);

  auto bogus = ctl(d, {"bogus"});
  CHECK(bogus.rc == 2);
  CHECK(bogus.err.find("unknown command 'bogus'") != std::string::npos);

  for (std::vector<std::string> args : {std::vector<std::string>{"top", "--interval", "0"},
                                        {"top", "--pools", "-1"},
                                        {"get", "--wait-ms", "-5", "p", "t", "/dev/null"},
                                        {"put", "--wait-ms", "-5", "p", "t", "/dev/null"}}) {
    auto r = ctl(d, args);
    INFO(args[0] << " " << args[1] << " " << args[2] << ": " << r.err);
    CHECK(r.rc == 2);
    CHECK(r.err.find("not in range") != std::string::npos);
  }
}

TEST_CASE("tierctl put of a missing file fails with exit 1 and creates nothing") {
  TestDaemon d;
  auto r = ctl(d, {"put", "p", "n", d.dir() + "/no-such-file"});
  CHECK(r.rc == 1);
  CHECK(r.err.rfind("tierctl: NotFound: ", 0) == 0);
  CHECK(json::parse(ctl(d, {"--json", "pools"}).out)["pools"].empty());
}

TEST_CASE("tierctl put reads a pipe or - (stdin), get - writes to stdout") {
  TestDaemon d;
  std::string data(300000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 1000);
  std::string in = d.dir() + "/in.bin";
  std::ofstream(in, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  const std::string ctl_cmd = bin_path("tierctl") + " --socket " + d.socket();
  // A pipe: its size is not known up front.
  auto piped = run_binary("/bin/sh", {"-c", "cat " + in + " | " + ctl_cmd + " put pipes t -"});
  INFO(piped.err);
  REQUIRE(piped.rc == 0);
  CHECK(piped.out.find("stdin") != std::string::npos);
  // get - : the bytes alone on stdout, the summary on stderr.
  auto got = ctl(d, {"get", "pipes", "t", "-"});
  REQUIRE(got.rc == 0);
  CHECK(got.out == data);
  CHECK(got.err.find("pipes/t") != std::string::npos);
  // A pipe given by name (not a regular file) is read to its end too.
  auto named = run_binary("/bin/sh", {"-c", "cat " + in + " | " + ctl_cmd + " put pipes u /dev/stdin"});
  INFO(named.err);
  REQUIRE(named.rc == 0);
  CHECK(ctl(d, {"get", "pipes", "u", "-"}).out == data);
  // An empty pipe is refused and leaves nothing behind.
  auto empty = run_binary("/bin/sh", {"-c", ": | " + ctl_cmd + " put pipes e -"});
  CHECK(empty.rc == 1);
  CHECK(empty.err.find("empty") != std::string::npos);
}

TEST_CASE("tierctl pools shows owners by name and --json keeps the uid") {
  TestDaemon d;
  put_small(d, "mine", "t");
  auto table = ctl(d, {"pools"});
  REQUIRE(table.rc == 0);
  const passwd* pw = ::getpwuid(::geteuid());
  REQUIRE(pw != nullptr);
  CHECK(table.out.find(std::string("  ") + pw->pw_name + "  ") != std::string::npos);
  json j = json::parse(ctl(d, {"--json", "pools"}).out);
  CHECK(j["pools"][0]["owner_uid"] == ::geteuid());
}

TEST_CASE("tierctl drop --yes drops without asking") {
  TestDaemon d;
  put_small(d, "gone", "t");
  auto r = ctl(d, {"drop", "--yes", "gone"});
  CHECK(r.rc == 0);
  CHECK(json::parse(ctl(d, {"--json", "pools"}).out)["pools"].empty());
}
