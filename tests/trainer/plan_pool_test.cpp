// One memory model for --plan and the run: a run with --state tier puts in its job's pool, byte
// for byte and tensor for tensor, what `--plan --json` prints for the same options.
#include <catch2/catch.hpp>

#include <string>

#include "run_helper.hpp"
#include "support/daemon_fixture.hpp"
#include "tier/client.hpp"

using tier::test::run_trainer;

namespace {

struct Case {
  std::string name;
  int ranks;
  int batch;              // global; the plan's micro-batch is batch / ranks
  std::string model;      // model options, the same for the plan and the run
  std::string run_extra;  // options of both (buffers, checkpointing, attention)
};

tier::PoolInfo pool_of(const std::string& socket, const std::string& job) {
  auto c = tier::Client::connect(socket);
  REQUIRE(c);
  auto pools = (*c)->list_pools();
  REQUIRE(pools);
  for (const auto& p : *pools)
    if (p.name == job) return p;
  FAIL("no pool " << job);
  return {};
}

}  // namespace

TEST_CASE("what --plan prints for a configuration is what its run puts in tierd's pool",
          "[trainer][plan][tier]") {
  tier::test::TestDaemon daemon;
  REQUIRE(daemon.running());
  // Shapes whose layers are not multiples of 16 * R floats, so the shards are padded, and
  // shards that are not multiples of tierd's 4 KiB granule.
  const std::string odd = "--layers 3 --dim 72 --heads 3 --seq 40";
  const std::vector<Case> cases = {
      {"small1", 1, 4, "--model small", ""},
      {"small2", 2, 4, "--model small", ""},
      {"odd2", 2, 2, odd, ""},
      {"odd3single", 3, 3, odd, "--buffers 1"},
      {"ckpt2", 2, 4, "--model small", "--checkpoint-activations --offload-checkpoints"},
      {"ckptodd1", 1, 2, odd, "--checkpoint-activations --offload-checkpoints --attention reference"},
      // bf16: 2-byte param and grad shards (not multiples of a 4 KiB granule) and fp32 masters.
      {"bf16small2", 2, 4, "--model small", "--precision bf16"},
      {"bf16odd3", 3, 3, odd, "--precision bf16"},
      {"bf16odd2single", 2, 2, odd, "--precision bf16 --buffers 1"},
      {"bf16ckpt2", 2, 2, odd, "--precision bf16 --checkpoint-activations --offload-checkpoints"},
  };
  for (const Case& c : cases) {
    INFO("case " << c.name);
    const std::string both = c.model + " --state tier " + c.run_extra;
    const nlohmann::json plan =
        tier::test::plan_json(both + " --nodes 1 --gpus-per-node " + std::to_string(c.ranks) +
                              " --micro-batch " + std::to_string(c.batch / c.ranks));
    REQUIRE(!plan.is_discarded());
    REQUIRE(plan.contains("pool_bytes"));
    const auto& node = plan["pool_bytes"]["per_node"];
    INFO(plan.dump());

    const auto r =
        run_trainer(c.ranks, both + " --socket " + daemon.socket() + " --job " + c.name +
                                 " --steps 2 --batch " + std::to_string(c.batch) + " --val-every -1");
    INFO(r.stderr_text);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.losses.size() == 2);

    const tier::PoolInfo pool = pool_of(daemon.socket(), c.name);
    CHECK(pool.ram_used == node["total"].get<uint64_t>());
    CHECK(pool.nvme_used == 0);
    CHECK(pool.tensor_count == node["tensors"].get<uint64_t>());
    // The plan's node figure is its ranks' figures and one marker.
    const auto& rank = plan["pool_bytes"]["per_rank"];
    CHECK(node["total"].get<uint64_t>() ==
          rank["total"].get<uint64_t>() * static_cast<uint64_t>(c.ranks) + node["marker"].get<uint64_t>());
    CHECK(plan["state_bytes"]["per_node"].get<double>() == static_cast<double>(pool.ram_used));
  }
}

TEST_CASE("the plan names the trainer it plans and derives the state from it", "[trainer][plan]") {
  const nlohmann::json one =
      tier::test::plan_json("--model small --state tier --buffers 1 --gpus-per-node 1");
  const nlohmann::json two = tier::test::plan_json("--model small --state tier --gpus-per-node 1");
  REQUIRE(!one.is_discarded());
  REQUIRE(!two.is_discarded());
  CHECK(one["precision"] == "fp32");
  CHECK(one["buffers"] == 1);
  CHECK(two["buffers"] == 2);
  // fp32: param, m, v per copy and one grad, 4 bytes each: 16 B/param single, 28 double.
  CHECK(one["state_bytes"]["per_param"].get<double>() == Approx(16.0).epsilon(0.01));
  CHECK(two["state_bytes"]["per_param"].get<double>() == Approx(28.0).epsilon(0.01));
  CHECK(two["pool_bytes"]["per_node"]["moments"].get<uint64_t>() ==
        2 * one["pool_bytes"]["per_node"]["moments"].get<uint64_t>());
  CHECK(two["pool_bytes"]["per_node"]["masters"].get<uint64_t>() == 0);
}

TEST_CASE("tier-train --plan --precision bf16: bf16 params and grads, fp32 masters and moments",
          "[trainer][plan]") {
  const std::string small = "--model small --state tier --gpus-per-node 1 --precision bf16";
  const nlohmann::json one = tier::test::plan_json(small + " --buffers 1");
  const nlohmann::json two = tier::test::plan_json(small);
  const nlohmann::json fp32 = tier::test::plan_json("--model small --state tier --gpus-per-node 1");
  REQUIRE(!one.is_discarded());
  REQUIRE(!two.is_discarded());
  REQUIRE(!fp32.is_discarded());
  CHECK(two["precision"] == "bf16");
  // bf16 param 2 + fp32 master 4 + m 4 + v 4 per copy, and a bf16 grad 2: 16 B/param single,
  // 30 double (fp32: 28).
  CHECK(one["state_bytes"]["per_param"].get<double>() == Approx(16.0).epsilon(0.01));
  CHECK(two["state_bytes"]["per_param"].get<double>() == Approx(30.0).epsilon(0.01));
  const auto& b = two["pool_bytes"]["per_node"];
  const auto& f = fp32["pool_bytes"]["per_node"];
  CHECK(b["moments"] == f["moments"]);
  CHECK(b["masters"] == f["params"]);  // the fp32 params, now the master copy
  CHECK(b["params"].get<uint64_t>() < f["params"].get<uint64_t>());
  CHECK(b["grads"].get<uint64_t>() < f["grads"].get<uint64_t>());
  // The collectives move half the bytes.
  const nlohmann::json net16 = tier::test::plan_json("--model small --gpus-per-node 8 --precision bf16");
  const nlohmann::json net32 = tier::test::plan_json("--model small --gpus-per-node 8");
  REQUIRE(!net16.is_discarded());
  REQUIRE(!net32.is_discarded());
  CHECK(net32["step_s"]["network"].get<double>() > 0);
  CHECK(net16["step_s"]["network"].get<double>() == Approx(net32["step_s"]["network"].get<double>() / 2));
}
