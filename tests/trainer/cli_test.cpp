// tier-train's --collectives flag: its validation (clear message, exit status 2) and the host
// path it selects for the CPU backend. Runs on any machine; the NCCL path itself is covered by
// tests/gpu/train_pipeline_test.cpp on a GPU. Also: the OpenMP wait policy and the OpenBLAS
// kernels tier-train picks.
#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "run_helper.hpp"
#include "support/daemon_fixture.hpp"

using tier::test::run_trainer;
using tier::test::TrainRun;

namespace {

const std::string kTiny = "--model tiny --steps 2 --batch 4 --val-every -1";

// Sets (or, with null, unsets) one environment variable for its lifetime; restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* had = std::getenv(name);
    if (had != nullptr) saved_ = had;
    had_ = had != nullptr;
    set(value);
  }
  ~ScopedEnv() { set(had_ ? saved_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* value) {
    if (value != nullptr) ::setenv(name_, value, 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

void expect_refused(const TrainRun& r, const std::string& says) {
  INFO(r.stderr_text);
  CHECK(r.exit_code == 2);
  CHECK(r.losses.empty());
  CHECK(r.stderr_text.find(says) != std::string::npos);
}

}  // namespace

TEST_CASE("tier-train refuses --collectives nccl with the CPU backend", "[trainer][cli]") {
  expect_refused(run_trainer(1, kTiny + " --collectives nccl"), "--collectives nccl needs --backend cuda");
  expect_refused(run_trainer(1, kTiny + " --backend cpu --collectives nccl"),
                 "--collectives nccl needs --backend cuda");
}

TEST_CASE("tier-train refuses an unknown --collectives value", "[trainer][cli]") {
  expect_refused(run_trainer(1, kTiny + " --collectives mpi"),
                 "--collectives must be auto, nccl or host, not 'mpi'");
}

TEST_CASE("tier-train refuses --collectives nccl in a build without NCCL", "[trainer][cli]") {
#if defined(TIER_TEST_TRAINER_HAS_NCCL)
  // This build has NCCL: the flag passes validation and needs a GPU (tests/gpu covers it).
  SUCCEED("built with NCCL");
#else
  expect_refused(run_trainer(1, kTiny + " --backend cuda --collectives nccl"),
                 "--collectives nccl: this build has no NCCL");
#endif
}

TEST_CASE("the CPU backend trains on the host path with --collectives auto and host", "[trainer][cli]") {
  for (const char* c : {"", " --collectives auto", " --collectives host"}) {
    const TrainRun r = run_trainer(1, kTiny + c);
    INFO(c << ": " << r.stderr_text);
    CHECK(r.exit_code == 0);
    CHECK(r.losses.size() == 2);
    CHECK(r.stderr_text.find("collectives host (MPI)") != std::string::npos);
  }
}

// A diverged run fails with the step that diverged, never prints a step line with a NaN (a
// JSON reader would drop it) and exits non-zero: at lr 1e30 the first update blows the
// weights up, so a later step's loss is not finite.
TEST_CASE("tier-train fails the run on a loss that is not finite", "[trainer][cli]") {
  const TrainRun r = run_trainer(1, "--model tiny --steps 4 --batch 2 --lr 1e30 --warmup 1 --val-every -1");
  INFO(r.stderr_text);
  CHECK(r.exit_code != 0);
  CHECK(r.stderr_text.find("is not finite") != std::string::npos);
  CHECK(r.losses.size() < 4);
  for (double l : r.losses) CHECK(std::isfinite(l));
}

TEST_CASE("tier-train refuses an unknown --attention value", "[trainer][cli][attention]") {
  expect_refused(run_trainer(1, kTiny + " --attention fast"),
                 "--attention must be flash or reference, not 'fast'");
}

// --attention flash (the default) and --attention reference compute the same model, so a few
// training steps give the same losses up to fp32 rounding. T = 160 spans three flash tiles
// (the last one partial); 4 steps at a high rate so the parameters move between steps.
TEST_CASE("tier-train --attention flash trains to the losses of --attention reference",
          "[trainer][cli][attention]") {
  const std::string run =
      "--layers 2 --dim 64 --heads 4 --seq 160 --batch 2 --steps 4 --lr 3e-3 --warmup 1 "
      "--val-every -1";
  const TrainRun flash = run_trainer(1, run);  // flash is the default
  const TrainRun ref = run_trainer(1, run + " --attention reference");
  INFO(flash.stderr_text << ref.stderr_text);
  REQUIRE(flash.exit_code == 0);
  REQUIRE(ref.exit_code == 0);
  CHECK(flash.stderr_text.find("attention flash") != std::string::npos);
  CHECK(ref.stderr_text.find("attention reference") != std::string::npos);
  REQUIRE(flash.losses.size() == 4);
  REQUIRE(ref.losses.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    INFO("step " << i + 1 << ": flash " << flash.losses[i] << ", reference " << ref.losses[i]);
    // Relative 1e-5 allows for fp32 rounding through 4 steps; measured: equal to the 9 digits
    // printed.
    CHECK(std::abs(flash.losses[i] - ref.losses[i]) <= 1e-5 * std::abs(ref.losses[i]));
  }
  CHECK(flash.losses[3] < flash.losses[0]);
}

TEST_CASE("tier-train --help documents --collectives", "[trainer][cli]") {
  std::FILE* p = popen((tier::test::bin_path("tier-train") + " --help").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) text += buf;
  CHECK(pclose(p) == 0);
  CHECK(text.find("--collectives") != std::string::npos);
  CHECK(text.find("nccl") != std::string::npos);
}

TEST_CASE("tier-train waits passively in OpenMP unless OMP_WAIT_POLICY is set", "[trainer][cli]") {
  // libgomp shows its settings with OMP_DISPLAY_ENV=verbose each time it loads: passive waiting
  // is a spin count of 0. Unset, tier-train re-executes itself once with the policy set, so the
  // second listing says 0; a policy the caller set is kept (one listing, spinning).
  // A kernel choice of the caller's own: the OpenBLAS kernels then never re-execute tier-train.
  ScopedEnv blas("OPENBLAS_CORETYPE", "Prescott");
  ScopedEnv display("OMP_DISPLAY_ENV", "verbose");
  ScopedEnv policy("OMP_WAIT_POLICY", nullptr);
  const TrainRun unset = run_trainer(1, "--help");
  policy.set("active");
  const TrainRun active = run_trainer(1, "--help");

  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  INFO(unset.stderr_text);
  CHECK(unset.exit_code == 0);
  CHECK(count(unset.stderr_text, "GOMP_SPINCOUNT") == 2);
  CHECK(count(unset.stderr_text, "GOMP_SPINCOUNT = '0'") == 1);
  INFO(active.stderr_text);
  CHECK(active.exit_code == 0);
  CHECK(count(active.stderr_text, "GOMP_SPINCOUNT") == 1);
  CHECK(count(active.stderr_text, "GOMP_SPINCOUNT = '0'") == 0);
}

TEST_CASE("tier-train runs OpenBLAS kernels for the CPU's vector width unless OPENBLAS_CORETYPE is set",
          "[trainer][cli]") {
  // The banner names the kernel set the run used. OpenBLAS falls back to generic SSE3 kernels
  // on a CPU newer than the library (0.3.21 on an Emerald Rapids VM: "Prescott"); tier-train
  // then re-executes itself with the set the CPU runs. A caller's OPENBLAS_CORETYPE is kept.
  ScopedEnv blas("OPENBLAS_CORETYPE", nullptr);
  ScopedEnv gemm("TIER_CPU_GEMM", "openblas");  // the GEMMs in OpenBLAS, not oneDNN
  const TrainRun chosen = run_trainer(1, kTiny);
  blas.set("Prescott");
  const TrainRun kept = run_trainer(1, kTiny);

  auto kernels = [](const std::string& text) {
    const std::string tag = "(OpenBLAS ";
    const size_t at = text.find(tag);
    if (at == std::string::npos) return std::string();
    const size_t end = text.find(' ', at + tag.size());
    return text.substr(at + tag.size(), end - at - tag.size());
  };
  INFO(chosen.stderr_text);
  REQUIRE(chosen.exit_code == 0);
  CHECK(chosen.losses.size() == 2);
  const std::string k = kernels(chosen.stderr_text);
  CHECK(!k.empty());
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    for (const char* generic : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Barcelona"})
      CHECK(k != generic);
  } else {
    WARN("this CPU has no AVX2+FMA: any kernel set is right for it");
  }
#endif
  INFO(kept.stderr_text);
  REQUIRE(kept.exit_code == 0);
  CHECK(kernels(kept.stderr_text) == "Prescott");
  // Same model, seed and data: the kernels change rounding only.
  REQUIRE(kept.losses.size() == chosen.losses.size());
  for (size_t i = 0; i < kept.losses.size(); ++i)
    CHECK(kept.losses[i] == Approx(chosen.losses[i]).epsilon(1e-4));
}

TEST_CASE("tier-train's CPU GEMMs run in oneDNN where it loads, in OpenBLAS when asked, same losses",
          "[trainer][cli]") {
  ScopedEnv gemm("TIER_CPU_GEMM", nullptr);
  const TrainRun chosen = run_trainer(1, kTiny);
  gemm.set("openblas");
  const TrainRun openblas = run_trainer(1, kTiny);
  gemm.set("mkl");
  const TrainRun unknown = run_trainer(1, kTiny);
  INFO(chosen.stderr_text);
  REQUIRE(chosen.exit_code == 0);
  void* dnnl = ::dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  CHECK((chosen.stderr_text.find("GEMMs)") != std::string::npos) ==
        (dnnl != nullptr));  // "(oneDNN 2.6.3 GEMMs)"
  if (dnnl != nullptr) ::dlclose(dnnl);
  INFO(openblas.stderr_text);
  REQUIRE(openblas.exit_code == 0);
  CHECK(openblas.stderr_text.find("(OpenBLAS ") != std::string::npos);
  INFO(unknown.stderr_text);
  REQUIRE(unknown.exit_code == 0);
  CHECK(unknown.stderr_text.find("TIER_CPU_GEMM=mkl is neither openblas nor onednn") != std::string::npos);
  // Same model, seed and data: the library changes rounding only.
  REQUIRE(openblas.losses.size() == chosen.losses.size());
  for (size_t i = 0; i < chosen.losses.size(); ++i)
    CHECK(openblas.losses[i] == Approx(chosen.losses[i]).epsilon(1e-4));
}

TEST_CASE("tier-train refuses --offload-checkpoints without checkpointing or tierd",
          "[trainer][cli][checkpoint]") {
  expect_refused(run_trainer(1, kTiny + " --offload-checkpoints --state tier"),
                 "--offload-checkpoints needs --checkpoint-activations");
  expect_refused(run_trainer(1, kTiny + " --checkpoint-activations --offload-checkpoints"),
                 "--offload-checkpoints needs --state tier");
}
