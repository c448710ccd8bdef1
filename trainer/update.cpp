// The AdamW update of a step and its commit (step.hpp): inline on the main thread
// (update_and_commit), or on its own thread beside the next step's pass
// (start_overlapped_update / finish_overlapped_update, --overlap-optimizer).
#include <cmath>
#include <csignal>
#include <cstring>
#include <future>

#include "trainer/bf16.hpp"
#include "trainer/step.hpp"
#include "wire/errors.hpp"

namespace tier::train::detail {

void OptProgress::start() {
  std::lock_guard g(mu);
  done = 0;
  failed = false;
}
void OptProgress::layer_done(int l) {
  {
    std::lock_guard g(mu);
    done = l + 1;
  }
  cv.notify_all();
}
void OptProgress::finish(bool ok) {
  {
    std::lock_guard g(mu);
    done = INT32_MAX;
    failed = !ok;
  }
  cv.notify_all();
}
bool OptProgress::wait_layer(int l) {
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return failed || done > l; });
  return !failed;
}

void Trainer::fault_at(const char* point, int64_t step) const {
  if (opts.fault_step == step && opts.fault_rank == rank && opts.fault_point == point) std::raise(SIGKILL);
}

// The global gradient norm and loss in one all-reduce: {sum of the shards' |g|^2 (taken at
// reduce-scatter time, grad_sumsq [NL]), sum of the ranks' losses}.
Result<Trainer::GradNorm> Trainer::grad_norm(double rank_loss) {
  double red[2] = {0, rank_loss};
  for (int l = 0; l < NL; ++l) red[0] += grad_sumsq[l];
  if (auto s = comm.allreduce_sum(red, 2); !s) return fail(s);
  return GradNorm{std::sqrt(red[0]), red[1]};
}

// The step's AdamW constants: the warmup + cosine learning rate and the factor that clips
// the global norm to opts.grad_clip (1 when it is under, or clipping is off).
AdamWStep Trainer::adamw_step(int64_t step, double norm) const {
  const float clip =
      opts.grad_clip > 0 && norm > opts.grad_clip ? static_cast<float>(opts.grad_clip / norm) : 1.0f;
  return make_step(opts.adamw, lr_at(opts.adamw.lr, step, warmup, opts.steps), step, clip);
}

std::vector<ShardKind> Trainer::opt_in_kinds() const {
  if (bf16) return {ShardKind::kMaster, ShardKind::kM, ShardKind::kV};
  return {ShardKind::kParam, ShardKind::kM, ShardKind::kV};
}
std::vector<ShardKind> Trainer::opt_out_kinds() const {
  if (bf16) return {ShardKind::kMaster, ShardKind::kM, ShardKind::kV, ShardKind::kParam};
  return {ShardKind::kParam, ShardKind::kM, ShardKind::kV};
}

// The AdamW update of `step`: reads opt_in_kinds() of buffer `cur` and the gradient (each
// [shard[l]]), writes opt_out_kinds() of buffer `nxt` (the same tensors when single-buffered,
// pinned for writing). Calls progress.layer_done(l) as each layer's pins are released. No MPI
// inside: safe on its own thread. Returns its duration in ms.
Result<double> Trainer::optimizer_step(int64_t step, int cur, int nxt, AdamWStep st) {
  const auto t_opt = Clock::now();
  // in: p (bf16: master), m, v, g; out: p (bf16: master), m, v [, bf16: the working param]
  using Pins = std::pair<std::vector<Pinned>, std::vector<Pinned>>;
  auto refs_of = [](int l, const std::vector<ShardKind>& kinds, int b) {
    std::vector<ShardRef> r;
    r.reserve(kinds.size() + 1);
    for (ShardKind k : kinds) r.push_back({l, k, b});
    return r;
  };
  auto pin_layer = [this, cur, nxt, refs_of](int l) -> Result<Pins> {
    Pins p;
    if (opts.buffers == 2) {
      std::vector<ShardRef> in = refs_of(l, opt_in_kinds(), cur);
      in.push_back({l, ShardKind::kGrad, 0});
      auto a = store.acquire_many(in, Access::kRead, opt_lane);
      if (!a) return fail(a.error());
      // Buffer nxt is written whole (the update, then the padding below): its old bytes are
      // dead, so a copy spilled to NVMe is not read back for it.
      auto b = store.acquire_many(refs_of(l, opt_out_kinds(), nxt), Access::kOverwrite, opt_lane);
      if (!b) return fail(b.error());
      p.first = std::move(*a);
      p.second = std::move(*b);
    } else {
      auto b = store.acquire_many(refs_of(l, opt_out_kinds(), 0), Access::kWrite, opt_lane);
      if (!b) return fail(b.error());
      auto g = store.acquire({l, ShardKind::kGrad, 0}, Access::kRead, opt_lane);
      if (!g) return fail(g.error());
      p.second = std::move(*b);
      p.first = {p.second[0], p.second[1], p.second[2], std::move(*g)};
    }
    return p;
  };
  // The pins of layer l+1 are taken (one or two daemon round trips) while layer l updates,
  // and the inputs of layer l+2 are hinted to tierd then, so a shard spilled to NVMe is
  // fetched a whole layer's update ahead of its lease (best effort; RAM-resident: no-op).
  auto hint_layer = [this, cur, refs_of](int l) {
    if (l >= NL) return;
    std::vector<ShardRef> in = refs_of(l, opt_in_kinds(), cur);
    in.push_back({l, ShardKind::kGrad, 0});
    store.prefetch(in, opt_lane);
  };
  hint_layer(1);
  std::future<Result<Pins>> next = std::async(std::launch::deferred, pin_layer, 0);
  for (int l = 0; l < NL; ++l) {
    auto pins = next.get();
    if (!pins) return fail(pins.error());
    if (l + 1 < NL) next = std::async(std::launch::async, pin_layer, l + 1);
    hint_layer(l + 2);
    const std::vector<Pinned>& in = pins->first;
    const std::vector<Pinned>& outp = pins->second;
    const size_t lo = static_cast<size_t>(rank) * shard[l], hi = lo + shard[l];
    for (const Range& r : decay_ranges(m, l)) {
      const size_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
      if (a >= b) continue;
      const size_t o = a - lo;
      if (opts.optimizer != nullptr && bf16) {
        if (auto s = opts.optimizer->update_bf16(
                in[0].data + o, in[1].data + o, in[2].data + o, in[3].bf16() + o, outp[0].data + o,
                outp[1].data + o, outp[2].data + o, outp[3].bf16() + o, b - a, st, r.decay, step);
            !s)
          return fail(s);
      } else if (opts.optimizer != nullptr) {
        if (auto s = opts.optimizer->update(in[0].data + o, in[1].data + o, in[2].data + o, in[3].data + o,
                                            outp[0].data + o, outp[1].data + o, outp[2].data + o, b - a, st,
                                            r.decay, step);
            !s)
          return fail(s);
      } else if (bf16) {
        adamw_update_bf16(in[0].data + o, in[1].data + o, in[2].data + o, in[3].bf16() + o, outp[0].data + o,
                          outp[1].data + o, outp[2].data + o, outp[3].bf16() + o, b - a, st, r.decay);
      } else {
        adamw_update(in[0].data + o, in[1].data + o, in[2].data + o, in[3].data + o, outp[0].data + o,
                     outp[1].data + o, outp[2].data + o, b - a, st, r.decay);
      }
    }
    // The padding past the layer's last parameter (on the last ranks) is in no range: an
    // overwrite pin must still write it, so it is carried over (zeros since init).
    if (opts.buffers == 2 && std::max(lo, layer_n[l]) < hi) {
      const size_t o = std::max(lo, layer_n[l]) - lo, n = hi - lo - o;
      for (int k = 0; k < 3; ++k) std::memcpy(outp[k].data + o, in[k].data + o, n * sizeof(float));
      if (bf16) f32_to_bf16(in[0].data + o, outp[3].bf16() + o, n);  // the master's padding, rounded
    }
    // The gradient is dead now: the next backward overwrites it before anything reads it,
    // and a crash before this step commits redoes the backward. Spilling it would be wasted.
    // Discarded while still pinned: released first, tierd could pick it (dirty, next use an
    // overwrite) for a write-back before the discard arrives.
    store.discard(std::vector<ShardRef>{{l, ShardKind::kGrad, 0}}, opt_lane);
    std::vector<Pinned> all = std::move(pins->first);
    for (auto& q : pins->second) all.push_back(std::move(q));
    store.release_many(all, opt_lane);
    progress.layer_done(l);
    if (l == 0) fault_at("optimizer", step);
  }
  return ms_since(t_opt);
}

// The update on the main thread, then the commit of its step. Adds its duration to opt_ms.
Status Trainer::update_and_commit(int64_t step, int cur, int nxt, AdamWStep st, double& opt_ms) {
  auto r = optimizer_step(step, cur, nxt, st);
  if (!r) return r.error();
  opt_ms += *r;
  return commit(step);
}

// The CPU update on its own thread (a GPU optimizer shares the backend's device and stream
// with the passes, so it runs inline); the next pass waits on `progress` layer by layer.
void Trainer::start_overlapped_update(int64_t step, int cur, int nxt, AdamWStep st) {
  progress.start();
  opt_job_step = step;
  opt_job = std::async(std::launch::async, [this, step, cur, nxt, st] {
    Result<double> r = optimizer_step(step, cur, nxt, st);
    progress.finish(r.has_value());
    return r;
  });
}

// Waits for the running update (if any) and commits its step; adds its duration to opt_ms.
Status Trainer::finish_overlapped_update(double& opt_ms) {
  if (!opt_job.valid()) return {};
  Result<double> r = opt_job.get();
  if (!r) return r.error();
  opt_ms += *r;
  return commit(opt_job_step);
}

// Commit: every rank finished writing buffer step % buffers; then each daemon's marker says
// so. The next update, which overwrites the buffer the previous commit names, starts only
// after this: so a crash anywhere leaves a committed, intact buffer.
// Double buffered, the buffer the step read (its `cur`) is dead once every daemon's marker
// names the step: the next update overwrites it whole and a resume reads the other one. It
// is discarded then, so tierd drops what of it is still in RAM instead of writing it back.
// Only after a second barrier: a rank that discarded while another daemon's marker still named
// the step before would leave that resume nothing to read.
Status Trainer::commit(int64_t step) {
  if (auto s = comm.barrier(); !s) return s;
  fault_at("precommit", step);
  if (marker_writer) {
    CommitMarker mk{CommitMarker::kMagic, static_cast<uint64_t>(step), uint64_t(R), hash};
    if (auto s = store.write_marker(mk); !s) return s;
  }
  fault_at("postcommit", step);
  if (opts.buffers == 2) {
    if (auto s = comm.barrier(); !s) return s;
    const int read_buffer = static_cast<int>((step - 1) % 2);
    std::vector<ShardRef> dead;
    for (int l = 0; l < NL; ++l)
      for (ShardKind k : opt_out_kinds()) dead.push_back({l, k, read_buffer});
    store.discard(dead);
    fault_at("discarded", step);
  }
  if (opts.snapshot_every > 0 && step % opts.snapshot_every == 0) return snapshot_cut(step);
  return {};
}

}  // namespace tier::train::detail
