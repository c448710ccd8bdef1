// Activation checkpointing (--checkpoint-activations, --offload-checkpoints): the fp32
// gradients, losses and parameters are bit for bit those of the run that keeps every block's
// activations, with 1 and 2 ranks, the state resident or in tierd; the activation buffers
// shrink by what activation_floats() says; and a --resume does not need the checkpoints.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "nvme/test_util.hpp"
#include "run_helper.hpp"
#include "spilling_daemon.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"
#include "trainer/trainer.hpp"

using tier::test::run_trainer;
using tier::test::TrainRun;

namespace {

// 3 blocks: the shared activation buffer holds block 3's after the forward, so a backward that
// did not recompute would use them for blocks 2 and 1. Validation every 2 steps runs the
// checkpointed forward alone too.
constexpr int kLayers = 3, kBatch = 4, kSeq = 16, kDim = 32, kHeads = 4, kSteps = 4;
const std::string kModel = "--model tiny --layers 3 --steps 4 --batch 4 --lr 3e-3 --seed 5 --val-every 2";
const std::string kCkpt = " --checkpoint-activations";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `args` with --dump into a directory of its own; the run and that directory.
struct DumpedRun {
  tier::nvme::testing::TempDir dir;
  TrainRun run;
};
void run_dumped(DumpedRun& out, int ranks, const std::string& args) {
  REQUIRE(!out.dir.path().empty());
  out.run =
      run_trainer(ranks, args + " --dump " + out.dir.path() + " --dump-steps " + std::to_string(kSteps));
  INFO(out.run.stderr_text);
  REQUIRE(out.run.exit_code == 0);
  REQUIRE(out.run.losses.size() == static_cast<size_t>(kSteps));
}

// Every loss and validation loss equal, and the parameters and summed gradient of every
// dumped step equal byte for byte (params.s: what step s computed with, so params.4 holds the
// result of 3 updates).
void require_identical(const DumpedRun& ref, const DumpedRun& got) {
  CHECK(got.run.losses == ref.run.losses);
  CHECK(got.run.val_losses == ref.run.val_losses);
  for (int s = 1; s <= kSteps; ++s)
    for (const char* what : {"params", "grads"}) {
      const std::string name = std::string(what) + "." + std::to_string(s) + ".bin";
      const std::string a = read_file(ref.dir.sub(name)), b = read_file(got.dir.sub(name));
      INFO(name);
      REQUIRE(!a.empty());
      CHECK(a.size() == b.size());
      CHECK(a == b);
    }
}

// The activation bytes per rank the run reports ("activations ... (N bytes) per rank").
long long activation_bytes(const TrainRun& r) {
  std::smatch m;
  const std::regex re("activations [^(]*\\(([0-9]+) bytes\\) per rank");
  INFO(r.stderr_text);
  REQUIRE(std::regex_search(r.stderr_text, m, re));
  return std::stoll(m[1].str());
}

long long expected_bytes(int ranks, bool checkpoint, bool offload) {
  tier::train::Dims d;
  d.B = kBatch / ranks;
  d.T = kSeq;
  d.C = kDim;
  d.NH = kHeads;
  d.V = 256;
  d.max_T = kSeq;
  const size_t bytes = tier::train::activation_floats(d, kLayers, checkpoint, offload) * sizeof(float);
  return static_cast<long long>(bytes);
}

}  // namespace

TEST_CASE("tier-train --checkpoint-activations: bit-identical gradients, losses and parameters, less memory",
          "[trainer][mpi][checkpoint]") {
  const int ranks = GENERATE(1, 2);
  CAPTURE(ranks);
  DumpedRun ref, got;
  run_dumped(ref, ranks, kModel);
  run_dumped(got, ranks, kModel + kCkpt);
  require_identical(ref, got);

  // The buffers hold what activation_floats() counts: one block's activations instead of 3.
  const long long plain = activation_bytes(ref.run), ckpt = activation_bytes(got.run);
  CHECK(plain == expected_bytes(ranks, false, false));
  CHECK(ckpt == expected_bytes(ranks, true, false));
  tier::train::Dims d{kBatch / ranks, kSeq, kDim, kHeads, 256, kSeq};
  CHECK(plain - ckpt ==
        static_cast<long long>((kLayers - 1) * tier::train::block_acts_floats(d) * sizeof(float)));
}

TEST_CASE(
    "tier-train --offload-checkpoints: block inputs in tierd, bit-identical to keeping every activation",
    "[trainer][mpi][tier][checkpoint]") {
  const int ranks = GENERATE(1, 2);
  CAPTURE(ranks);
  tier::test::TestDaemon daemon;
  REQUIRE(daemon.running());
  const std::string tier = kModel + " --state tier --socket " + daemon.socket();
  const std::string job = "ck" + std::to_string(ranks);
  DumpedRun ref, got;
  run_dumped(ref, ranks, tier + " --job plain" + std::to_string(ranks));
  run_dumped(got, ranks, tier + " --job " + job + kCkpt + " --offload-checkpoints");
  require_identical(ref, got);

  // On the device: two [B,T,C] buffers of the residual stream instead of L + 1.
  const long long ckpt = activation_bytes(got.run);
  CHECK(ckpt == expected_bytes(ranks, true, true));
  CHECK(expected_bytes(ranks, true, false) - ckpt ==
        static_cast<long long>((kLayers - 1) * (kBatch / ranks) * kSeq * kDim * sizeof(float)));

  // In the pool: one [B,T,C] tensor per block and rank, named apart from the state.
  auto c = tier::Client::connect(daemon.socket());
  REQUIRE(c.has_value());
  auto ts = (*c)->list_tensors(job);
  REQUIRE(ts.has_value());
  std::map<std::string, uint64_t> ckpts;
  for (const auto& t : *ts)
    if (t.name.ends_with(".ckpt")) ckpts[t.name] = t.size;
  std::map<std::string, uint64_t> want;
  for (int r = 0; r < ranks; ++r)
    for (int l = 1; l <= kLayers; ++l)
      want["r" + std::to_string(r) + ".l" + std::to_string(l) + ".ckpt"] =
          static_cast<uint64_t>(kBatch / ranks) * kSeq * kDim * sizeof(float);
  CHECK(ckpts == want);
  // Neither run sent tierd a request it refused (a stale checkpoint deleted blindly would be).
  auto st = (*c)->status();
  REQUIRE(st.has_value());
  CHECK(st->errors == 0);
}

TEST_CASE("tier-train --offload-checkpoints with the pool on NVMe: bit-identical",
          "[trainer][mpi][tier][nvme][checkpoint]") {
  // A RAM quota below the state (as in zero3_test's NVMe case): checkpoints and shards spill
  // and come back; the checkpoints' overwrite leases and discards must not lose a byte.
  const tier::test::SpillingDaemon spill;
  REQUIRE(spill.running());
  const std::string model =
      "--layers 4 --dim 128 --heads 4 --seq 16 --steps 4 --batch 4 --lr 3e-3 --seed 3 --val-every -1" +
      spill.tier_args();
  DumpedRun ref, got;
  run_dumped(ref, 1, model + " --job plain");
  run_dumped(got, 1, model + " --job ck" + kCkpt + " --offload-checkpoints");
  require_identical(ref, got);
}

TEST_CASE("tier-train --resume after a kill does not need the offloaded checkpoints",
          "[trainer][mpi][tier][restart][checkpoint]") {
  // A run with offloaded checkpoints killed in a backward resumes without checkpointing: the
  // losses are the uninterrupted run's, and the resumed run deletes the checkpoint tensors.
  tier::test::TestDaemon daemon;
  REQUIRE(daemon.running());
  const std::string base =
      "--model tiny --steps 6 --batch 4 --lr 3e-3 --seed 3 --val-every -1 --state tier --socket " +
      daemon.socket();
  const TrainRun ref = run_trainer(2, base + " --job ref");
  INFO(ref.stderr_text);
  REQUIRE(ref.exit_code == 0);
  REQUIRE(ref.losses.size() == 6);
  const TrainRun a =
      run_trainer(2, base + " --job crash" + kCkpt + " --offload-checkpoints --fault-kill 4:backward:1");
  INFO(a.stderr_text);
  REQUIRE(a.exit_code != 0);
  const TrainRun b = run_trainer(2, base + " --job crash --resume");
  INFO(b.stderr_text);
  REQUIRE(b.exit_code == 0);
  REQUIRE(!b.steps.empty());
  CHECK(b.steps.front() <= 4);
  CHECK(b.steps.back() == 6);
  for (const TrainRun* r : {&a, &b})
    for (size_t i = 0; i < r->steps.size(); ++i) {
      INFO("step " << r->steps[i]);
      CHECK(r->losses[i] == ref.losses[static_cast<size_t>(r->steps[i] - 1)]);
    }
  auto c = tier::Client::connect(daemon.socket());
  REQUIRE(c.has_value());
  auto ts = (*c)->list_tensors("crash");
  REQUIRE(ts.has_value());
  for (const auto& t : *ts) CHECK_FALSE(t.name.ends_with(".ckpt"));
}
