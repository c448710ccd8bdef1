// tier-train: a thin ZeRO-3 trainer whose sharded state lives in tierd (or, as the baseline,
// in private memory). See docs/trainer.md.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "tier/types.hpp"
#include "trainer/bench.hpp"
#include "trainer/check.hpp"
#include "trainer/comm.hpp"
#include "trainer/cpu/blas_kernels.hpp"
#include "trainer/cpu/cpu_backend.hpp"
#include "trainer/cpu/gemm_library.hpp"
#include "trainer/plan.hpp"
#include "trainer/trainer.hpp"

using namespace tier::train;

#ifdef TIER_TRAIN_HAVE_CUDA
namespace tier::train {
std::unique_ptr<Backend> make_cuda_backend(int local_rank, std::string* pci);  // trainer/cuda/
}
#ifdef TIER_HAVE_NCCL
#include "trainer/cuda/gpu_optimizer.hpp"
#include "trainer/cuda/pipeline_pass.hpp"
#include "wire/sizes.hpp"
#endif
#endif

namespace {

// Settings that the libraries read when they are loaded, before main, so tier-train sets them
// and re-executes itself once (same pid and otherwise the same environment, so mpirun and srun
// ranks are unaffected; before MPI is initialized and before any thread of ours exists):
// - OMP_WAIT_POLICY=passive. The trainer's kernels run on OpenMP threads and its GEMMs on
//   OpenBLAS's own threads, in turns on the same cores. By default libgomp spins after each
//   parallel region, so its threads hold the cores while OpenBLAS (and tierd, and the update
//   thread) want them; passive waiting made steps 12-15% faster on a 2-vCPU VM.
// - OPENBLAS_CORETYPE, when OpenBLAS fell back to generic kernels on a CPU newer than the
//   library (trainer/cpu/blas_kernels.hpp): 2.2x faster CPU steps there.
// A variable the caller set (to anything) is kept. See docs/benchmarks.md.
void tune_library_settings(char** argv) {
  bool changed = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr)
    changed = ::setenv("OMP_WAIT_POLICY", "passive", 1) == 0 || changed;
  if (const char* k = better_blas_kernels(); k != nullptr)
    changed = ::setenv("OPENBLAS_CORETYPE", k, 1) == 0 || changed;
  if (changed) ::execv("/proc/self/exe", argv);  // returns only on failure: go on as loaded
}

[[noreturn]] void die(Comm* comm, const std::string& msg, int code = 1) {
  std::fprintf(stderr, "tier-train: %s\n", msg.c_str());
  std::fflush(stderr);
  // Other ranks may be blocked in a collective: take the whole job down.
  if (comm != nullptr && comm->size() > 1) std::_Exit(code);
  std::exit(code);
}

// What the command line says, beyond TrainOptions and PlanOptions.
struct Cli {
  std::string model_name = "small", data_path, state = "resident", job = "tier-train", socket,
              backend = "cpu", optimizer = "cpu", ram_quota, nvme_quota, collectives = "auto", fault_kill,
              attention = "flash", precision;  // precision "": the backend's default
  int layers = 0, dim = 0, heads = 0, seq = 0, vocab = 0, threads = 0, buffers = 0;
  bool do_plan = false, json = false, bench_opt = false, bench_att = false, force_mpi = false,
       overlap_optimizer = false, profile = false;
};

// The model, the data and the optimizer's schedule.
void add_model_options(CLI::App& app, Cli& c, TrainOptions& o) {
  app.add_option("--model", c.model_name, "preset: tiny, small, 124M, 350M, 1.3B, 2.7B, 6.7B, 13B, 175B")
      ->capture_default_str();
  app.add_option("--layers", c.layers, "transformer blocks (overrides the preset)");
  app.add_option("--dim", c.dim, "model width (overrides the preset)");
  app.add_option("--heads", c.heads, "attention heads (overrides the preset)");
  app.add_option("--seq", c.seq, "sequence length (overrides the preset)");
  app.add_option("--vocab", c.vocab, "vocabulary size (default 256: bytes)");
  app.add_option("--data", c.data_path, "training text (default: /usr/share/common-licenses)");
  app.add_option("--steps", o.steps, "optimizer steps")->capture_default_str();
  app.add_option("--seed", o.seed, "seed of init and data order")->capture_default_str();
  app.add_option("--batch", o.batch, "global batch: sequences per step, split across ranks")
      ->capture_default_str();
  app.add_option("--lr", o.adamw.lr, "peak learning rate")->capture_default_str();
  app.add_option("--weight-decay", o.adamw.weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--beta1", o.adamw.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", o.adamw.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--adam-eps", o.adamw.eps, "AdamW epsilon")->capture_default_str();
  app.add_option("--warmup", o.warmup, "warmup steps (0: max(steps/10, min(100, steps/2)))");
  app.add_option("--grad-clip", o.grad_clip, "clip the global gradient norm (0: off)")->capture_default_str();
  app.add_option("--val-every", o.val_every, "validation loss every N steps (0: at the end, -1: never)");
  app.add_option("--val-seqs", o.val_seqs, "validation sequences (default: --batch)");
}

// Where the step computes and how its layers move.
void add_compute_options(CLI::App& app, Cli& c, TrainOptions& o) {
  app.add_option("--backend", c.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--optimizer", c.optimizer,
                 "cpu (AdamW over the tier on this CPU) or gpu (fused AdamW on the GPU; --backend cuda)")
      ->capture_default_str();
  app.add_option("--collectives", c.collectives,
                 "how layers are gathered and gradients reduce-scattered: nccl (on the GPU: "
                 "shards straight from the tier to the device, NCCL, the layer pipeline; needs "
                 "--backend cuda and a build with NCCL), host (MPI on the host, staged uploads; with "
                 "--backend cuda the slow baseline: each upload holds the host thread until its H2D "
                 "is done and each download waits for all enqueued compute, so the host never "
                 "runs ahead of the GPU), "
                 "auto (nccl with --backend cuda in a build with NCCL, else host)")
      ->capture_default_str();
  app.add_option("--attention", c.attention,
                 "flash (tiled, online softmax: activations linear in --seq) or reference (the "
                 "materialized [B,NH,T,T] probabilities; docs/trainer.md, Attention)")
      ->capture_default_str();
  app.add_option("--prefetch", o.prefetch, "layers gathered ahead of compute")->capture_default_str();
  app.add_flag("--checkpoint-activations", o.checkpoint_activations,
               "keep only each block's input in the forward and recompute the block's forward "
               "before its backward (one more forward per step; the same gradients)");
  app.add_flag("--offload-checkpoints", o.offload_checkpoints,
               "with --checkpoint-activations and --state tier: keep the block inputs in the job's "
               "tierd pool, one tensor per block, instead of device memory");
  app.add_option("--threads", c.threads, "compute threads per rank (default: cores / local ranks)");
  app.add_flag("--mpi", c.force_mpi, "initialize MPI even when not started by mpirun/srun");
  app.add_flag("--overlap-optimizer", c.overlap_optimizer,
               "run the CPU AdamW of a step beside the next step's pass (faster with the state "
               "in RAM; on NVMe faster with prefaulted arenas, slower with sparse ones)");
}

// Where the sharded state lives, and restarts.
void add_state_options(CLI::App& app, Cli& c, TrainOptions& o) {
  app.add_option("--state", c.state, "resident (private memory) or tier (tierd)")->capture_default_str();
  app.add_option("--job", c.job, "tierd pool of this job")->capture_default_str();
  app.add_option("--socket", c.socket, "tierd socket (default: $TIERD_SOCKET or /run/tierd/tierd.sock)");
  app.add_option("--ram-quota", c.ram_quota, "RAM quota of the job's pool (e.g. 2G)");
  app.add_option("--nvme-quota", c.nvme_quota, "NVMe quota of the job's pool");
  app.add_option("--buffers", c.buffers, "1 or 2 copies of param/m/v (default: 2 for tier, 1 resident)");
  app.add_flag("--resume", o.resume, "continue the job from the state in tierd");
  app.add_flag("--reshard", o.reshard,
               "with --resume: the job's state was committed by another rank count; re-slice it "
               "from tierd across this run's ranks");
  app.add_option("--snapshot-every", o.snapshot_every,
                 "--state tier: after every N-th committed step, a durable snapshot of each node's pool "
                 "(a consistent cut; a --resume after a node reboot rolls every node back to the newest "
                 "cut all of them hold). 0: none")
      ->check(CLI::NonNegativeNumber);
}

// Other modes (plan, benchmarks) and testing aids.
void add_tool_options(CLI::App& app, Cli& c, TrainOptions& o) {
  app.add_flag("--plan", c.do_plan, "print memory per tier and the bandwidth bound; train nothing");
  app.add_flag("--json", c.json, "--plan: one JSON object");
  app.add_flag("--bench-optimizer", c.bench_opt, "benchmark the AdamW step against a scalar loop");
  app.add_flag("--bench-attention", c.bench_att,
               "benchmark the CPU flash attention against the reference (forward + backward, "
               "T = 256 and 1024)");
  app.add_option("--fault-kill", c.fault_kill,
                 "testing: STEP:POINT:RANK kills that rank (SIGKILL) at forward, backward, "
                 "optimizer, precommit, postcommit, discarded (after the dead buffer's "
                 "discard) or snapshot (after --snapshot-every's cut) of that step")
      ->group("testing");
  app.add_option("--dump", o.dump_dir,
                 "write the parameters each of the first --dump-steps steps computes with "
                 "(DIR/params.STEP.bin) and its gradient summed over ranks, before clipping "
                 "(DIR/grads.STEP.bin): float32, every layer's flat buffer in layer order "
                 "(docs/trainer.md); DIR must exist");
  app.add_option("--dump-steps", o.dump_steps, "steps --dump writes")->capture_default_str();
  app.add_flag("--profile", c.profile,
               "--backend cpu: print the step's split into GEMMs, attention, LayerNorm, GELU, "
               "other kernels and the optimizer, and the GEMMs' GFLOP/s against OpenBLAS sgemm "
               "on the fc shape measured after the run (docs/benchmarks.md)");
}

// The preset with the explicit shapes over it, and the --fault-kill point.
void apply_model_options(const Cli& c, TrainOptions& o) {
  auto pm = preset(c.model_name);
  if (!pm) die(nullptr, pm.error().message(), 2);
  ModelConfig m = *pm;
  if (c.layers || c.dim || c.heads || c.seq || c.vocab) m.name = "custom";
  if (c.layers) m.layers = c.layers;
  if (c.dim) m.dim = c.dim;
  if (c.heads) m.heads = c.heads;
  if (c.seq) m.seq = c.seq;
  if (c.vocab) m.vocab = c.vocab;
  if (auto s = validate(m); !s) die(nullptr, s.message(), 2);
  o.model = m;
  if (c.attention == "flash") o.attention = Attention::kFlash;
  else if (c.attention == "reference") o.attention = Attention::kReference;
  else die(nullptr, fmt::format("--attention must be flash or reference, not '{}'", c.attention), 2);
  if (!c.fault_kill.empty()) {
    const auto a = c.fault_kill.find(':'), b = c.fault_kill.rfind(':');
    if (a == std::string::npos || a == b) die(nullptr, "--fault-kill wants STEP:POINT:RANK", 2);
    o.fault_step = std::atoll(c.fault_kill.substr(0, a).c_str());
    o.fault_point = c.fault_kill.substr(a + 1, b - a - 1);
    o.fault_rank = std::atoi(c.fault_kill.substr(b + 1).c_str());
  }
}

// "auto" resolved; exits on a choice this build or backend cannot make.
std::string resolve_collectives(const Cli& c) {
#if defined(TIER_TRAIN_HAVE_CUDA) && defined(TIER_HAVE_NCCL)
  constexpr bool have_nccl = true;
#else
  constexpr bool have_nccl = false;
#endif
  if (c.collectives == "auto") return c.backend == "cuda" && have_nccl ? "nccl" : "host";
  if (c.collectives == "nccl") {
    if (c.backend != "cuda")
      die(nullptr,
          fmt::format("--collectives nccl needs --backend cuda (not '{}'); use "
                      "--collectives host or auto",
                      c.backend),
          2);
    if (!have_nccl) die(nullptr, "--collectives nccl: this build has no NCCL (CUDA and NCCL are needed)", 2);
    return "nccl";
  }
  if (c.collectives != "host")
    die(nullptr, fmt::format("--collectives must be auto, nccl or host, not '{}'", c.collectives), 2);
  return "host";
}

// --plan: the run these same options start, on paper.
int print_plan(const Cli& c, const TrainOptions& o, PlanOptions po) {
  po.model = o.model;
  po.prefetch = o.prefetch;
  po.buffers = c.buffers > 0 ? c.buffers : c.state == "tier" ? 2 : 1;
  po.flash_attention = o.attention == Attention::kFlash;
  po.checkpointing = o.checkpoint_activations;
  po.offload_checkpoints = o.offload_checkpoints;
  // The layer pipeline is what --backend cuda runs unless --collectives host says otherwise
  // (planned the same in a build without NCCL, which could not run it).
  po.device_pipeline = c.backend == "cuda" && c.collectives != "host";
  auto p = make_plan(po);
  if (!p) die(nullptr, p.error().message(), 2);
  std::fputs((c.json ? plan_json(*p) : plan_text(*p)).c_str(), stdout);
  return 0;
}

std::unique_ptr<Backend> open_backend(const Cli& c, Comm& comm, TrainOptions& o) {
  if (c.backend == "cpu") return make_cpu_backend();
  if (c.backend == "cuda") {
#ifdef TIER_TRAIN_HAVE_CUDA
    auto be = make_cuda_backend(comm.local_rank(), &o.gpu_pci);  // says why on stderr when it returns null
    if (!be) die(&comm, "--backend cuda: the CUDA backend could not start (above)", 2);
    return be;
#else
    (void)o;
    die(&comm, "--backend cuda: this build has no CUDA backend", 2);
#endif
  }
  die(&comm, fmt::format("--backend must be cpu or cuda, not '{}'", c.backend), 2);
}

std::unique_ptr<OffloadOptimizer> open_optimizer(const Cli& c, Comm& comm, Backend& be) {
  if (c.optimizer == "cpu") return nullptr;
  if (c.optimizer != "gpu")
    die(&comm, fmt::format("--optimizer must be cpu or gpu, not '{}'", c.optimizer), 2);
  std::string err = "this build has no GPU optimizer (needs CUDA and NCCL)";
  std::unique_ptr<OffloadOptimizer> offload;
#if defined(TIER_TRAIN_HAVE_CUDA) && defined(TIER_HAVE_NCCL)
  offload = cuda::make_gpu_optimizer(be, &err);
#else
  (void)be;
#endif
  if (!offload) die(&comm, "--optimizer gpu: " + err, 2);
  return offload;
}

uint64_t quota(Comm& comm, const std::string& s) {
  if (s.empty()) return 0;  // the daemon's default
  auto q = tier::parse_size(s);
  if (!q) die(&comm, q.error().message(), 2);
  return *q;
}

std::unique_ptr<ShardStore> open_store(const Cli& c, Comm& comm, TrainOptions& o) {
  if (o.offload_checkpoints && !o.checkpoint_activations)
    die(&comm, "--offload-checkpoints needs --checkpoint-activations", 2);
  if (o.offload_checkpoints && c.state != "tier")
    die(&comm, "--offload-checkpoints needs --state tier (the checkpoints go to tierd)", 2);
  if (c.state == "resident") {
    o.buffers = c.buffers > 0 ? c.buffers : 1;
    if (o.resume) die(&comm, "--resume needs --state tier (resident state dies with the process)", 2);
    if (o.reshard) die(&comm, "--reshard needs --state tier and --resume", 2);
    if (o.snapshot_every > 0) die(&comm, "--snapshot-every needs --state tier (snapshots are tierd's)", 2);
    return make_resident_store();
  }
  if (c.state != "tier") die(&comm, fmt::format("--state must be resident or tier, not '{}'", c.state), 2);
  TierStoreOptions to;
  to.socket = c.socket;
  to.pool = c.job;
  to.optimizer_lane = c.overlap_optimizer && c.optimizer == "cpu";  // the overlapped update's own client
  to.ram_quota = quota(comm, c.ram_quota);
  to.nvme_quota = quota(comm, c.nvme_quota);
  auto s = make_tier_store(to);
  if (!s) die(&comm, "--state tier: " + s.error().to_string());
  o.buffers = c.buffers > 0 ? c.buffers : 2;
  if (o.resume && o.buffers != 2) die(&comm, "--resume needs --buffers 2", 2);
  if (o.reshard && !o.resume) die(&comm, "--reshard needs --resume", 2);
  return std::move(*s);
}

// --profile: the step's split by kernel, and the GEMMs against OpenBLAS sgemm alone.
void print_profile(const RunSummary& r, const TrainOptions& o, int ranks, int T) {
  const CpuProfile p = cpu_profile();
  const double steps = static_cast<double>(r.last_step - r.first_step + 1);
  const double step_ms = r.mean_ms;
  auto part = [&](const char* name, double ms) {
    return fmt::format("{} {:.1f} ms ({:.1f}%)", name, ms, 100.0 * ms / step_ms);
  };
  const double gemm_ms = p.gemm_s * 1e3 / steps, att_ms = p.attention_s * 1e3 / steps,
               ln_ms = p.layernorm_s * 1e3 / steps, gelu_ms = p.gelu_s * 1e3 / steps,
               other_ms = p.other_s * 1e3 / steps, opt_ms = r.mean_opt_ms;
  const double rest_ms = step_ms - gemm_ms - att_ms - ln_ms - gelu_ms - other_ms - opt_ms;
  const double gemm_gflops = p.gemm_s > 0 ? p.gemm_flops / p.gemm_s / 1e9 : 0;
  // The reference: one sgemm of the fc layer's forward shape, [B*T, 4C] = [B*T, C] @ [4C, C]^T.
  const int M = o.batch / ranks * T, N = 4 * o.model.dim, K = o.model.dim;
  const double ref = sgemm_gflops(M, N, K, 5);
  std::fprintf(stderr,
               "tier-train: profile, mean per step of rank 0: %.1f ms = %s, %s, %s, %s, %s, "
               "%s, rest %.1f ms (%.1f%%); GEMMs %.1f GFLOP/s (%ld calls/step); sgemm "
               "[%d x %d x %d] alone in %s %.1f GFLOP/s: the GEMMs reach %.2f of it\n",
               step_ms, part("gemm", gemm_ms).c_str(), part("attention", att_ms).c_str(),
               part("layernorm", ln_ms).c_str(), part("gelu", gelu_ms).c_str(),
               part("other kernels", other_ms).c_str(), part("optimizer", opt_ms).c_str(), rest_ms,
               100.0 * rest_ms / step_ms, gemm_gflops,
               static_cast<long>(static_cast<double>(p.gemm_calls) / steps), M, N, K, gemm_library_name(),
               ref, ref > 0 ? gemm_gflops / ref : 0.0);
}

void print_summary(const RunSummary& r, const ShardStore& store) {
  std::fprintf(stderr,
               "tier-train: steps %lld..%lld loss %.4f -> %.4f, val %s; %.1f ms/step, "
               "%.0f tokens/s, %.4f TFLOP/s per rank, stall %.2f ms/step, optimizer %.2f "
               "ms/step; state %s (%s per rank), activations %s (%llu bytes) per rank\n",
               static_cast<long long>(r.first_step), static_cast<long long>(r.last_step), r.first_loss,
               r.last_loss, r.last_val_loss >= 0 ? fmt::format("{:.4f}", r.last_val_loss).c_str() : "n/a",
               r.mean_ms, r.mean_tokens_per_s, r.mean_tflops, r.mean_stall_ms, r.mean_opt_ms, store.name(),
               tier::format_size(store.bytes()).c_str(), tier::format_size(r.activation_bytes).c_str(),
               static_cast<unsigned long long>(r.activation_bytes));
}

// --precision fp32|bf16, for the run and its --plan alike (docs/trainer.md, "Mixed precision").
// Without it: bf16 with --backend cuda, fp32 otherwise. Once every option is parsed, a run
// refuses the options bf16 does not support (exit 2).
void add_precision_option(CLI::App& app, TrainOptions& o, PlanOptions& po, Cli& c) {
  app.add_option("--precision", c.precision,
                 "fp32 or bf16 (bf16 params and grads in the tier and the collectives, fp32 master "
                 "params and AdamW moments); default bf16 with --backend cuda, else fp32")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.final_callback([&] {
    const std::string& p = c.precision.empty() ? (c.backend == "cuda" ? "bf16" : "fp32") : c.precision;
    o.precision = po.precision = p == "bf16" ? Precision::kBf16 : Precision::kFp32;
    if (tier::Status s = check_precision(o); !s && !c.do_plan) die(nullptr, s.message(), 2);
  });
}

}  // namespace

int main(int argc, char** argv) {
  tune_library_settings(argv);
  CLI::App app{"tier-train: a ZeRO-3 trainer whose sharded state lives in tierd"};
  Cli c;
  TrainOptions o;
  PlanOptions po;
  add_model_options(app, c, o);
  add_compute_options(app, c, o);
  add_state_options(app, c, o);
  add_tool_options(app, c, o);
  add_plan_options(app, po);
  add_precision_option(app, o, po, c);
  CLI11_PARSE(app, argc, argv);

  apply_model_options(c, o);
  const std::string collectives = resolve_collectives(c);
  if (c.do_plan) return print_plan(c, o, po);
  if (c.bench_opt || c.bench_att) {
    const int n = c.threads > 0 ? c.threads : static_cast<int>(std::thread::hardware_concurrency());
    set_cpu_threads(n);
    std::fputs((c.bench_opt ? bench_optimizer(n) : bench_attention(n)).c_str(), stdout);
    return 0;
  }

  auto comm_r = Comm::create(&argc, &argv, c.force_mpi);
  if (!comm_r) die(nullptr, comm_r.error().to_string());
  Comm& comm = **comm_r;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  const int nthreads = c.threads > 0                    ? c.threads
                       : std::getenv("OMP_NUM_THREADS") ? std::atoi(std::getenv("OMP_NUM_THREADS"))
                                                        : std::max(1, hw / comm.local_size());
  set_cpu_threads(nthreads);

  std::unique_ptr<Backend> be = open_backend(c, comm, o);
  std::unique_ptr<OffloadOptimizer> offload = open_optimizer(c, comm, *be);
  o.optimizer = offload.get();
  o.overlap_optimizer = c.overlap_optimizer;
  std::unique_ptr<ShardStore> store = open_store(c, comm, o);

  // Collective over the ranks (NCCL's bootstrap). Destroyed before the store and the backend.
  std::unique_ptr<LayerStream> stream;
  if (collectives == "nccl") {
#if defined(TIER_TRAIN_HAVE_CUDA) && defined(TIER_HAVE_NCCL)
    auto ls = cuda::make_pipeline_stream(*be, comm);
    if (!ls) die(&comm, "--collectives nccl: " + ls.error().to_string());
    stream = std::move(*ls);
#endif
    o.stream = stream.get();
  }

  const ModelConfig& m = o.model;
  const int T = o.seq > 0 ? o.seq : m.seq;
  auto data = Dataset::load(c.data_path, T);
  if (!data) die(&comm, data.error().message());

  std::string backend_desc = be->name();
  if (c.backend == "cpu") {
    backend_desc += fmt::format(" ({})", gemm_library_name());
    if (*gemm_library_error() != '\0' && comm.rank() == 0)
      std::fprintf(stderr, "tier-train: %s\n", gemm_library_error());
  }
  if (comm.rank() == 0)
    std::fprintf(stderr,
                 "tier-train: %s, %d rank(s) x %d thread(s), backend %s, collectives %s, "
                 "attention %s, state %s, batch %d x %d tokens, data %s (%zu train / %zu val bytes)\n",
                 m.describe().c_str(), comm.size(), nthreads, backend_desc.c_str(),
                 stream ? stream->name() : "host (MPI)", c.attention.c_str(), store->name(), o.batch, T,
                 data->source().c_str(), data->train_bytes(), data->val_bytes());
  if (c.profile && c.backend != "cpu") die(&comm, "--profile needs --backend cpu", 2);
  if (c.profile) set_cpu_profile(true);
  auto r = train(o, *data, comm, *be, *store, stdout);
  if (!r) die(&comm, r.error().to_string());
  if (c.profile && comm.rank() == 0) print_profile(*r, o, comm.size(), T);
  if (comm.rank() == 0) print_summary(*r, *store);
  stream.reset();
  store.reset();
  offload.reset();
  return 0;
}
