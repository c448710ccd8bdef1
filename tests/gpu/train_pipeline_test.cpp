// tier-train's passes through the NCCL layer pipeline (--collectives nccl: trainer/cuda/
// pipeline_pass.hpp) against the CPU backend on the `tiny` model: a few steps of train() in
// this process (1 rank; resident state and state in a tierd; fp32 and --precision bf16), and 2
// ranks of the tier-train binary under mpirun when the machine has two GPUs. Skips visibly
// without a device.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../trainer/run_helper.hpp"  // kMpirun
#include "gpu_support.hpp"
#include "support/daemon_fixture.hpp"
#include "trainer/comm.hpp"
#include "trainer/cpu/cpu_backend.hpp"
#include "trainer/cuda/cuda_backend.hpp"
#include "trainer/cuda/gpu_optimizer.hpp"
#include "trainer/cuda/pipeline_pass.hpp"
#include "trainer/data.hpp"
#include "trainer/model.hpp"
#include "trainer/state.hpp"
#include "trainer/trainer.hpp"

using namespace tier::train;

namespace {

constexpr int kSteps = 5;

TrainOptions tiny_options() {
  TrainOptions o;
  o.model = *preset("tiny");
  o.steps = kSteps;
  o.batch = 4;
  o.seed = 7;
  o.adamw.lr = 3e-3f;
  o.val_every = -1;
  return o;
}

// The "loss" of every JSON step line train() wrote to `f`.
std::vector<double> losses_of(std::FILE* f) {
  std::vector<double> out;
  if (std::fseek(f, 0, SEEK_SET) != 0) return out;  // no losses: the caller's checks fail
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (const char* p = std::strstr(line, "\"loss\":")) out.push_back(std::strtod(p + 7, nullptr));
  return out;
}

// A training text of its own (a minimal image may lack /usr/share/common-licenses, the
// trainer's default): 64 KiB of deterministic sentences, written once per process and removed
// at its exit.
struct DataFile {
  std::string path = "/tmp/tier-gpu-train-data-" + std::to_string(::getpid()) + ".txt";
  bool ok = false;
  DataFile() {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return;
    const char* words[] = {"tier", "arena", "shard", "layer", "gather", "device", "host", "copy"};
    uint64_t x = 12345;
    for (int i = 0; i < 12000; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::fprintf(f, "%s%s", words[(x >> 33) % 8], (x >> 40) % 9 == 0 ? ".\n" : " ");
    }
    ok = std::fclose(f) == 0;
  }
  ~DataFile() { std::remove(path.c_str()); }
};
const std::string& data_file() {
  static const DataFile f;
  REQUIRE(f.ok);
  return f.path;
}

// Per-step losses of train() with `be` (and `stream` when not null) over `store`.
std::vector<double> run(TrainOptions o, Comm& comm, Backend& be, ShardStore& store, LayerStream* stream) {
  auto data = Dataset::load(data_file(), o.model.seq);
  REQUIRE(data.has_value());
  o.stream = stream;
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  auto r = train(o, *data, comm, be, store, out);
  INFO((r ? std::string("ok") : r.error().to_string()));
  REQUIRE(r.has_value());
  std::vector<double> l = losses_of(out);
  std::fclose(out);
  REQUIRE(l.size() == static_cast<size_t>(o.steps));
  return l;
}

// The same with the state in pool `pool` of the tierd at `socket`, through the NCCL layer
// pipeline or the host path.
std::vector<double> run_in_tierd(const TrainOptions& o, Comm& comm, Backend& be, const std::string& socket,
                                 const std::string& pool, bool pipeline) {
  TierStoreOptions to;
  to.socket = socket;
  to.pool = pool;
  auto store = make_tier_store(to);
  INFO((store ? std::string("ok") : store.error().to_string()));
  REQUIRE(store.has_value());
  std::unique_ptr<LayerStream> ls;
  if (pipeline) {
    auto l = cuda::make_pipeline_stream(be, comm);
    REQUIRE(l.has_value());
    ls = std::move(*l);
  }
  std::vector<double> got = run(o, comm, be, **store, ls.get());
  ls.reset();  // before the store: its stager is bound to the store's client
  return got;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("step " << i + 1 << ": " << got[i] << " vs " << want[i]);
    CHECK(std::isfinite(got[i]));
    CHECK(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]));
  }
}

// The CUDA backend on device 0: fp32 GEMMs when `exact`, else bf16 tensor-core GEMMs.
std::unique_ptr<Backend> cuda_backend(bool exact) {
  std::string err;
  auto be = cuda::make_cuda_backend({.device = 0, .exact_gemm = exact}, &err);
  INFO(err);
  REQUIRE(be != nullptr);
  return be;
}

std::unique_ptr<Comm> one_rank() {
  int argc = 0;
  char** argv = nullptr;
  auto c = Comm::create(&argc, &argv);
  REQUIRE(c.has_value());
  REQUIRE((*c)->size() == 1);
  return std::move(*c);
}

// The cases that keep the state in tierd: one on a temporary socket, and the one-rank comm.
struct OneRankWithDaemon {
  tier::test::TestDaemon daemon;
  std::unique_ptr<Comm> comm = one_rank();
};

}  // namespace

TEST_CASE("the pipeline stream refuses a backend that is not CUDA (everywhere)", "[gpu][trainer]") {
  auto comm = one_rank();
  auto cpu = make_cpu_backend();
  auto ls = cuda::make_pipeline_stream(*cpu, *comm);
  REQUIRE_FALSE(ls.has_value());
  CHECK(ls.error().code() == tier::Code::kInvalidArgument);
  CHECK(ls.error().message().find("--backend cuda") != std::string::npos);
}

TEST_CASE("1 rank of tiny through the layer pipeline matches the CPU backend", "[gpu][trainer]") {
  if (!tier::test::have_cuda_device()) return;
  auto comm = one_rank();
  const TrainOptions o = tiny_options();
  std::vector<double> want;
  {
    auto cpu = make_cpu_backend();
    auto store = make_resident_store();
    want = run(o, *comm, *cpu, *store, nullptr);
  }
  REQUIRE(want.back() < want.front());

  for (const bool exact : {true, false}) {
    DYNAMIC_SECTION((exact ? "fp32 GEMMs" : "bf16 GEMMs")) {
      auto be = cuda_backend(exact);
      // The host path on the same backend: the pipeline changes only how the bytes move.
      std::vector<double> host;
      {
        auto store = make_resident_store();
        host = run(o, *comm, *be, *store, nullptr);
      }
      for (const int prefetch : {1, 3}) {  // depth 2, and 4 (layer 0 twice in flight)
        INFO("--prefetch " << prefetch);
        TrainOptions op = o;
        op.prefetch = prefetch;
        auto store = make_resident_store();
        auto ls = cuda::make_pipeline_stream(*be, *comm);
        INFO((ls ? std::string("ok") : ls.error().to_string()));
        REQUIRE(ls.has_value());
        const std::vector<double> got = run(op, *comm, *be, *store, ls->get());
        ls->reset();  // before the store: it registered the store's memory
        check_close(got, want, exact ? 2e-3 : 3e-2);
        // Not bit-identical: the backend's gradient kernels sum with atomics, in any order.
        check_close(got, host, 1e-4);
      }
      CHECK(cuda::backend_error(*be).empty());
    }
  }
}

TEST_CASE_METHOD(OneRankWithDaemon, "1 rank of tiny through the layer pipeline with the state in tierd",
                 "[gpu][trainer]") {
  if (!tier::test::have_cuda_device()) return;
  REQUIRE(daemon.running());
  TrainOptions o = tiny_options();
  o.buffers = 2;
  std::vector<double> want;
  {
    auto cpu = make_cpu_backend();
    auto store = make_resident_store();
    want = run(o, *comm, *cpu, *store, nullptr);
  }
  auto be = cuda_backend(true);
  check_close(run_in_tierd(o, *comm, *be, daemon.socket(), "gpu-pipeline", true), want, 2e-3);
}

TEST_CASE_METHOD(OneRankWithDaemon,
                 "tier-train --checkpoint-activations on the GPU: host path, pipeline, offloaded to tierd",
                 "[gpu][trainer][checkpoint]") {
  if (!tier::test::have_cuda_device()) return;
  REQUIRE(daemon.running());
  TrainOptions o = tiny_options();
  o.model.layers = 3;  // blocks 1 and 2 would use block 3's activations if nothing recomputed
  o.buffers = 2;
  auto be = cuda_backend(true);
  std::vector<double> want;  // every block's activations kept, host path
  {
    auto store = make_resident_store();
    want = run(o, *comm, *be, *store, nullptr);
  }
  TrainOptions oc = o;
  oc.checkpoint_activations = true;
  // Not bit-identical to `want`: the backend's gradient kernels sum with atomics, in any order.
  {
    auto store = make_resident_store();
    check_close(run(oc, *comm, *be, *store, nullptr), want, 1e-4);
  }
  {
    auto store = make_resident_store();
    auto ls = cuda::make_pipeline_stream(*be, *comm);
    REQUIRE(ls.has_value());
    const std::vector<double> got = run(oc, *comm, *be, *store, ls->get());
    ls->reset();  // before the store: it registered the store's memory
    check_close(got, want, 1e-4);
  }
  oc.offload_checkpoints = true;
  for (const bool pipeline : {false, true}) {
    INFO((pipeline ? "pipeline" : "host path"));
    check_close(run_in_tierd(oc, *comm, *be, daemon.socket(), "gpu-checkpoint", pipeline), want, 1e-4);
  }
  CHECK(cuda::backend_error(*be).empty());
}

// --precision bf16 --checkpoint-activations, as the seed's runs train, through each GPU path:
// the host path (bf16 uploads widened on the device), the NCCL pipeline (bf16 gathers and
// reduce-scatters), and the GPU AdamW writing the bf16 working copy, with the state in tierd.
// Each against the CPU backend's bf16 run (same bf16 state and rounding; fp32 GEMMs on both, so
// only the gradient kernels' summation order differs) and the CPU's fp32 curve.
TEST_CASE_METHOD(OneRankWithDaemon,
                 "tier-train --precision bf16 --checkpoint-activations on the GPU follows the CPU",
                 "[gpu][trainer][bf16]") {
  if (!tier::test::have_cuda_device()) return;
  REQUIRE(daemon.running());
  TrainOptions o = tiny_options();
  o.buffers = 2;
  o.checkpoint_activations = true;
  std::vector<double> fp32, bf16;
  {
    auto cpu = make_cpu_backend();
    auto store = make_resident_store();
    fp32 = run(o, *comm, *cpu, *store, nullptr);
    o.precision = Precision::kBf16;
    auto store16 = make_resident_store();
    bf16 = run(o, *comm, *cpu, *store16, nullptr);
  }
  check_close(bf16, fp32, 1e-2);
  auto be = cuda_backend(true);
  std::string err;
  auto gpu_opt = cuda::make_gpu_optimizer(*be, &err);
  INFO(err);
  REQUIRE(gpu_opt != nullptr);
  for (const bool pipeline : {false, true})
    for (const bool gpu_adamw : {false, true}) {
      INFO((pipeline ? "pipeline" : "host path") << (gpu_adamw ? ", GPU AdamW" : ", CPU AdamW"));
      TrainOptions og = o;
      og.optimizer = gpu_adamw ? gpu_opt.get() : nullptr;
      const std::string pool = std::string("gpu-bf16-") + (pipeline ? "p" : "h") + (gpu_adamw ? "g" : "c");
      const std::vector<double> got = run_in_tierd(og, *comm, *be, daemon.socket(), pool, pipeline);
      check_close(got, bf16, 2e-3);
      check_close(got, fp32, 1e-2);
    }
  CHECK(cuda::backend_error(*be).empty());
  // bf16 tensor-core GEMMs: the pipeline hands the backend the gathered bf16 layers and its
  // blocks run bf16 x bf16 GEMMs from them (no fp32 copy); the host path widens each layer and
  // runs the fp32-parameter GEMMs, which round the same operands to bf16 inside cuBLAS. Other
  // GEMM kernels, so not the 1e-4 of the same kernels: 2e-3 (a flipped bf16 rounding is 2^-9).
  auto tc = cuda_backend(false);
  REQUIRE(tc->bf16_params());
  const std::vector<double> host = run_in_tierd(o, *comm, *tc, daemon.socket(), "gpu-bf16-tc-h", false);
  const std::vector<double> direct = run_in_tierd(o, *comm, *tc, daemon.socket(), "gpu-bf16-tc-p", true);
  check_close(direct, host, 2e-3);
  check_close(direct, bf16, 3e-2);
  CHECK(cuda::backend_error(*tc).empty());
}

TEST_CASE("2 ranks of tier-train --collectives nccl match 1 CPU rank", "[gpu][trainer][mpi]") {
  if (!tier::test::have_cuda_device()) return;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    WARN("fewer than 2 CUDA devices: skipping the 2-rank NCCL run (NCCL needs one GPU per rank)");
    return;
  }
  const std::string bin = tier::test::bin_path("tier-train");
  const std::string args = " --threads 1 --model tiny --steps 5 --batch 4 --lr 3e-3 --seed 7 --val-every -1";
  auto losses = [](const std::string& cmd) {
    std::vector<double> out;
    std::FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char line[4096];
    while (std::fgets(line, sizeof line, p) != nullptr)
      if (const char* q = std::strstr(line, "\"loss\":")) out.push_back(std::strtod(q + 7, nullptr));
    CHECK(pclose(p) == 0);
    return out;
  };
  // fp32, then bf16 (--backend cuda's default: bf16 all-gathers and reduce-scatters in NCCL).
  const std::string cpu = bin + args + " --backend cpu";
  const std::string nccl = std::string(tier::test::kMpirun) + " -np 2 -x OMP_NUM_THREADS=1 " + bin + args +
                           " --backend cuda --collectives nccl";
  for (const char* precision : {" --precision fp32", ""}) {
    const std::string p = precision;
    INFO("precision:" << (p.empty() ? " the default (bf16)" : p));
    const auto want = losses(cpu + (p.empty() ? " --precision bf16" : p));
    REQUIRE(want.size() == 5);
    const auto got = losses(nccl + p);
    check_close(got, want, 3e-2);
  }
}
