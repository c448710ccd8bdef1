// The README's client example (docs/examples/client_example.cpp) is compiled by this build and
// run here against a real tierd, its socket passed the documented way: $TIERD_SOCKET.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "support/daemon_fixture.hpp"

TEST_CASE("the README client example runs against tierd") {
  tier::test::TestDaemon d;
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setenv("TIERD_SOCKET", d.socket().c_str(), 1);
    std::string exe = tier::test::bin_path("client_example");
    execl(exe.c_str(), exe.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
}
