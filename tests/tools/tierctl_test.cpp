// tierctl as a user runs it: the real binary against a real tierd, checking output, --json,
// exit codes 0/1/2 and the one-line error on stderr.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "run_binary.hpp"
#include "support/daemon_fixture.hpp"
#include "tierctl_run.hpp"

using nlohmann::json;
using tier::test::bin_path;
using tier::test::ctl;
using tier::test::read_text;
using tier::test::run_binary;
using tier::test::RunResult;
using tier::test::TestDaemon;
using tier::test::write_random_file;

namespace {

size_t lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_CASE("tierctl put then get round-trips a file bit-exact") {
  TestDaemon d;
  std::string in = d.dir() + "/in.bin", out = d.dir() + "/out.bin";
  std::string data = write_random_file(in, 3 * 1024 * 1024 + 5, 1);
  auto put = ctl(d, {"put", "job", "w0", in});
  INFO(put.err);
  REQUIRE(put.rc == 0);
  CHECK(put.out.find("job/w0") != std::string::npos);
  auto get = ctl(d, {"get", "job", "w0", out});
  INFO(get.err);
  REQUIRE(get.rc == 0);
  CHECK(read_text(out) == data);

  // A second put of the same size overwrites in place.
  std::string data2 = write_random_file(in, data.size(), 2);
  REQUIRE(ctl(d, {"put", "job", "w0", in}).rc == 0);
  REQUIRE(ctl(d, {"get", "job", "w0", out}).rc == 0);
  CHECK(read_text(out) == data2);

  auto pools = ctl(d, {"pools"});
  REQUIRE(pools.rc == 0);
  CHECK(pools.out.find("job") != std::string::npos);
  CHECK(pools.out.find("NAME") != std::string::npos);
  auto tensors = ctl(d, {"tensors", "job"});
  REQUIRE(tensors.rc == 0);
  CHECK(tensors.out.find("w0") != std::string::npos);
  CHECK(tensors.out.find("3.00 MiB") != std::string::npos);  // human-readable size
}

TEST_CASE("tierctl --json prints one parseable document per command") {
  TestDaemon d;
  std::string in = d.dir() + "/in.bin";
  write_random_file(in, 4096, 3);
  auto put = ctl(d, {"--json", "put", "job", "w0", in});
  REQUIRE(put.rc == 0);
  json p = json::parse(put.out);
  CHECK(p["bytes"] == 4096);
  CHECK(p["created"] == true);

  json st = json::parse(ctl(d, {"--json", "status"}).out);
  CHECK(st.contains("daemon_version"));
  CHECK(st["pools"] == 1);
  REQUIRE(st["ram"].is_array());
  CHECK(st["ram"][0]["capacity"].get<uint64_t>() > 0);

  json topo = json::parse(ctl(d, {"--json", "topo"}).out);
  REQUIRE(topo["nodes"].is_array());
  CHECK(topo["nodes"].size() >= 1);

  json pools = json::parse(ctl(d, {"--json", "pools"}).out);
  REQUIRE(pools["pools"].size() == 1);
  CHECK(pools["pools"][0]["name"] == "job");
  CHECK(pools["pools"][0]["tensors"] == 1);

  // --json also works after the command.
  json ts = json::parse(ctl(d, {"tensors", "job", "--json"}).out);
  REQUIRE(ts["tensors"].size() == 1);
  CHECK(ts["tensors"][0]["name"] == "w0");
  CHECK(ts["tensors"][0]["size"] == 4096);

  auto get = ctl(d, {"--json", "get", "job", "w0", d.dir() + "/o"});
  REQUIRE(get.rc == 0);
  CHECK(json::parse(get.out)["bytes"] == 4096);

  auto m = ctl(d, {"--json", "metrics"});
  if (m.rc == 0) CHECK(json::parse(m.out)["text"].is_string());
  else CHECK(lines(m.err) == 1);

  REQUIRE(ctl(d, {"--json", "drop", "job"}).rc == 0);
  CHECK(json::parse(ctl(d, {"--json", "pools"}).out)["pools"].empty());
}

TEST_CASE("tierctl exit codes: 1 with one line on stderr for failures, 2 for usage") {
  TestDaemon d;
  auto missing_pool = ctl(d, {"tensors", "nope"});
  CHECK(missing_pool.rc == 1);
  CHECK(missing_pool.err.rfind("tierctl: NotFound: ", 0) == 0);
  CHECK(lines(missing_pool.err) == 1);
  CHECK(missing_pool.out.empty());

  auto missing_tensor = ctl(d, {"get", "nope", "x", d.dir() + "/o"});
  CHECK(missing_tensor.rc == 1);
  CHECK(lines(missing_tensor.err) == 1);

  std::string big = d.dir() + "/big", small = d.dir() + "/small";
  write_random_file(big, 8192, 4);
  write_random_file(small, 100, 5);
  REQUIRE(ctl(d, {"put", "job", "t", big}).rc == 0);
  auto mismatch = ctl(d, {"put", "job", "t", small});
  CHECK(mismatch.rc == 1);
  CHECK(mismatch.err.rfind("tierctl: InvalidArgument: ", 0) == 0);
  CHECK(mismatch.err.find("8192") != std::string::npos);
  CHECK(lines(mismatch.err) == 1);

  auto unreachable = run_binary(bin_path("tierctl"), {"--socket", d.dir() + "/nothing.sock", "status"});
  CHECK(unreachable.rc == 1);
  CHECK(unreachable.err.rfind("tierctl: Unavailable: ", 0) == 0);
  CHECK(lines(unreachable.err) == 1);

  CHECK(ctl(d, {}).rc == 2);                                            // no command
  CHECK(ctl(d, {"frobnicate"}).rc == 2);                                // unknown command
  CHECK(ctl(d, {"tensors"}).rc == 2);                                   // missing POOL
  CHECK(ctl(d, {"drop", "a", "b"}).rc == 2);                            // extra argument
  CHECK(ctl(d, {"put", "p", "n", d.dir() + "/no-such-file"}).rc == 1);  // a failure, not a usage error
  CHECK(ctl(d, {"status"}).rc == 0);
}

TEST_CASE("tierctl --help documents every command and the exit codes") {
  auto h = run_binary(bin_path("tierctl"), {"--help"});
  CHECK(h.rc == 0);
  for (const char* cmd : {"status", "topo", "pools", "tensors", "put", "get", "evict", "prefetch", "snapshot",
                          "drop", "metrics", "--socket", "--json", "TIERD_SOCKET", "Exit status"})
    CHECK(h.out.find(cmd) != std::string::npos);
  auto sub = run_binary(bin_path("tierctl"), {"put", "--help"});
  CHECK(sub.rc == 0);
  CHECK(sub.out.find("POOL") != std::string::npos);
}
