// train(): the option checks, the setup and the loop over Trainer::step (step.hpp).
#include "trainer/trainer.hpp"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "trainer/dump.hpp"
#include "trainer/step.hpp"
#include "wire/errors.hpp"

namespace tier::train {

using detail::Clock;
using detail::ms_since;
using detail::Trainer;

namespace {

// --dump DIR: the parameters the step read and the gradient it wrote, whole layers.
Status dump_step(Trainer& t, int64_t step, int cur) {
  const std::string dir = t.opts.dump_dir + "/";
  if (auto s = dump_layers(t.comm, t.store, ShardKind::kParam, cur, t.shard, t.layer_n,
                           fmt::format("{}params.{}.bin", dir, step));
      !s)
    return s;
  return dump_layers(t.comm, t.store, ShardKind::kGrad, 0, t.shard, t.layer_n,
                     fmt::format("{}grads.{}.bin", dir, step));
}

// NVMe traffic of this node since the last step (tierd's node-wide counters; one status
// round trip on rank 0, after the step's time was taken). 0 for resident state.
struct NvmeRate {
  double gbps = 0, read_mib = 0, written_mib = 0;
};
NvmeRate nvme_rate(Trainer& t, double step_ms) {
  NvmeRate r;
  if (t.rank != 0) return r;
  const ShardStore::NvmeIo io = t.store.nvme_io();
  if (io.read >= 0 && t.nvme_io_prev.read >= 0) {
    r.read_mib = static_cast<double>(io.read - t.nvme_io_prev.read) / (1 << 20);
    r.written_mib = static_cast<double>(io.written - t.nvme_io_prev.written) / (1 << 20);
    r.gbps = (r.read_mib + r.written_mib) * (1 << 20) / (step_ms / 1e3) / 1e9;
  }
  t.nvme_io_prev = io;
  return r;
}

void write_step_line(std::FILE* out, const StepStats& ss, const NvmeRate& io) {
  std::string line = fmt::format(
      "{{\"step\":{},\"loss\":{:.9g},\"ms\":{:.3f},\"tokens_per_s\":{:.1f},\"tflops\":{:.6f},"
      "\"stall_ms\":{:.3f},\"h2d_gbps\":{},\"nvme_gbps\":{:.3f},\"nvme_read_mib\":{:.1f},"
      "\"nvme_written_mib\":{:.1f},\"opt_ms\":{:.3f},\"grad_norm\":{:.9g}",
      ss.step, ss.loss, ss.ms, ss.tokens_per_s, ss.tflops, ss.stall_ms,
      ss.h2d_gbps < 0 ? std::string("null") : fmt::format("{:.3f}", ss.h2d_gbps), io.gbps, io.read_mib,
      io.written_mib, ss.opt_ms, ss.grad_norm);
  if (ss.val_loss >= 0) line += fmt::format(",\"val_loss\":{:.9g}", ss.val_loss);
  line += "}\n";
  std::fputs(line.c_str(), out);
  std::fflush(out);
}

void add_to_summary(RunSummary& sum, const StepStats& ss, int64_t& n) {
  if (n == 0) sum.first_loss = ss.loss;
  if (ss.val_loss >= 0) sum.last_val_loss = ss.val_loss;
  sum.last_loss = ss.loss;
  sum.last_step = ss.step;
  sum.mean_ms += ss.ms;
  sum.mean_tokens_per_s += ss.tokens_per_s;
  sum.mean_tflops += ss.tflops;
  sum.mean_stall_ms += ss.stall_ms;
  sum.mean_opt_ms += ss.opt_ms;
  ++n;
}

}  // namespace

uint64_t run_config_hash(const TrainOptions& o, int ranks) {
  uint64_t h = 0x5eed;
  for (uint64_t v : {uint64_t(o.model.layers), uint64_t(o.model.dim), uint64_t(o.model.heads),
                     uint64_t(o.model.seq), uint64_t(o.model.vocab), uint64_t(ranks), uint64_t(o.batch),
                     uint64_t(o.seq), o.seed, uint64_t(o.buffers)})
    h = mix_seed(h, v);
  // fp32's hash is what it was before --precision existed, so its committed jobs still resume.
  if (o.precision != Precision::kFp32) h = mix_seed(h, 0xbf16 + static_cast<uint64_t>(o.precision));
  return h;
}

Status check_precision(const TrainOptions& o) {
  if (o.precision == Precision::kFp32) return {};
  const char* what = o.reshard ? "--reshard" : !o.dump_dir.empty() ? "--dump" : nullptr;
  if (what == nullptr) return {};
  return Status(Code::kInvalidArgument,
                fmt::format("--precision bf16 is not supported with {}: it reads and writes fp32 state; "
                            "run it with --precision fp32 (docs/trainer.md)",
                            what));
}

// One training step, the way its parts run:
//   load batch -> forward -> backward -> (commit the previous step's overlapped update)
//   -> gradient norm -> optimizer step -> commit -> [validation] -> JSON line
// Double buffered, the step reads params, m, v of buffer cur = (step - 1) % 2 and writes
// buffer nxt = step % 2; single buffered, both are 0 (updated in place).
Result<StepStats> Trainer::step(int64_t step) {
  const auto t0 = Clock::now();
  cur_step = step;
  stall_ms = 0;
  const int cur = opts.buffers == 2 ? static_cast<int>((step - 1) % 2) : 0;
  const int nxt = opts.buffers == 2 ? static_cast<int>(step % 2) : 0;

  const uint64_t h2d0 = opts.stream != nullptr ? opts.stream->h2d_bytes() : 0;
  load_batch(step);  // tokens, targets [B,T]
  double loss = 0;   // summed over this rank's B*T tokens
  {
    auto pass = open_pass(train_uses, cur, true);
    Status s = pass->begin();
    if (s) s = forward(*pass, loss);  // x_0..x_L [B,T,C], loss, dx [B,T,C], g0 [pad0]
    if (s) s = backward(*pass);       // grad shards [shard[l]], grad_sumsq [NL]
    if (s = pass->end(std::move(s)); !s) {
      if (opt_job.valid())  // the pass may have stopped because the update failed: say why
        if (Result<double> r = opt_job.get(); !r) return fail(r.error());
      return fail(s);
    }
  }
  // The pass waited for every layer of the previous step's update: it is done; commit it
  // before this step's update may overwrite the buffer the last commit names.
  double opt_ms = 0;
  if (auto s = finish_overlapped_update(opt_ms); !s) return fail(s);
  if (!opts.dump_dir.empty() && step - start < opts.dump_steps)
    if (auto s = dump_step(*this, step, cur); !s) return fail(s);

  auto g = grad_norm(loss);  // ||g|| over every rank's shards, the global batch's summed loss
  if (!g) return fail(g.error());
  const AdamWStep st = adamw_step(step, g->norm);  // lr of the schedule, clip factor

  // Optimizer step and commit: inline, or started here and committed by the next step.
  if (overlap_optimizer) start_overlapped_update(step, cur, nxt, st);
  else if (auto s = update_and_commit(step, cur, nxt, st, opt_ms); !s) return fail(s);
  // The last step and validation steps wait for their own update (validation reads it).
  const bool last = step == opts.steps;
  const bool validate = opts.val_every >= 0 && (last || (opts.val_every > 0 && step % opts.val_every == 0));
  if (last || validate)
    if (auto s = finish_overlapped_update(opt_ms); !s) return fail(s);

  StepStats ss;
  ss.step = step;
  ss.loss = g->loss_sum / (static_cast<double>(Bg) * T);
  // A device error or a diverged loss ends the run: never a step line with a NaN in it.
  if (const char* e = be.failure(); e != nullptr && *e != '\0')
    return fail(Code::kInternal, fmt::format("step {}: the {} backend failed: {}", step, be.name(), e));
  if (!std::isfinite(ss.loss) || !std::isfinite(g->norm))
    return fail(Code::kInternal,
                fmt::format("step {}: loss {} / gradient norm {} is not finite", step, ss.loss, g->norm));
  ss.grad_norm = g->norm;
  ss.ms = ms_since(t0);
  ss.stall_ms = stall_ms;
  if (opts.stream != nullptr)
    ss.h2d_gbps = static_cast<double>(opts.stream->h2d_bytes() - h2d0) / (ss.ms / 1e3) / 1e9;
  ss.opt_ms = opt_ms;
  ss.tokens_per_s = static_cast<double>(Bg) * T / (ss.ms / 1000.0);
  ss.tflops = flops_step / R / (ss.ms / 1000.0) / 1e12;
  const NvmeRate io = nvme_rate(*this, ss.ms);
  if (validate) {
    auto v = validate_at(nxt);
    if (!v) return fail(v.error());
    ss.val_loss = *v;
  }
  if (rank == 0 && out != nullptr) write_step_line(out, ss, io);
  return ss;
}

Result<RunSummary> train(const TrainOptions& opts, const Dataset& data, Comm& comm, Backend& be,
                         ShardStore& store, std::FILE* out) {
  const ModelConfig& m = opts.model;
  if (auto s = validate(m); !s) return fail(s);
  const int R = comm.size();
  const int T = opts.seq > 0 ? opts.seq : m.seq;
  if (T > m.seq)
    return fail(Code::kInvalidArgument, fmt::format("--seq {} exceeds the model's {}", T, m.seq));
  if (opts.batch < R || opts.batch % R != 0)
    return fail(Code::kInvalidArgument,
                fmt::format("--batch {} must be a positive multiple of the rank count {}", opts.batch, R));
  if (opts.buffers != 1 && opts.buffers != 2) return fail(Code::kInvalidArgument, "buffers must be 1 or 2");
  if (opts.offload_checkpoints && !opts.checkpoint_activations)
    return fail(Code::kInvalidArgument, "--offload-checkpoints needs --checkpoint-activations");
  if (auto s = check_precision(opts); !s) return fail(s);

  Trainer t(opts, data, comm, be, store, out);
  if (auto s = t.open_state(); !s) return fail(s);
  if (auto s = t.alloc_buffers(); !s) return fail(s);
  t.set_plan();

  RunSummary sum;
  sum.first_step = t.start;
  sum.activation_bytes = t.buf.act_floats * sizeof(float);
  if (t.rank == 0) t.nvme_io_prev = store.nvme_io();
  int64_t n = 0;
  for (int64_t step = t.start; step <= opts.steps; ++step) {
    auto ss = t.step(step);
    if (!ss) return fail(ss.error());
    add_to_summary(sum, *ss, n);
  }
  if (n > 0) {
    sum.mean_ms /= n;
    sum.mean_tokens_per_s /= n;
    sum.mean_tflops /= n;
    sum.mean_stall_ms /= n;
    sum.mean_opt_ms /= n;
  }
  return sum;
}

}  // namespace tier::train
