// How a pass moves layers when the device does it itself (tier-train --collectives nccl; the
// implementation is trainer/cuda/pipeline_pass.hpp) instead of train()'s host path (MPI
// gathers on the comm thread into host staging, Backend::upload / download, MPI
// reduce-scatter). tier_train_core only calls this interface, so it stays free of CUDA.
//
// Per pass, train() calls, in the order of the pass's layer uses:
//
//   fetch(use 0 .. K)                         K = --prefetch; at most K + 1 fetches open
//   for each use i:  <backend calls reading the fetched layer>
//                    [grad_buffer(layer) ... <backward> ... push_grad(layer, grad shard)]
//                    done_with_oldest(); fetch(use i + K + 1)
//   finish()
//
// Pins: fetch() and push_grad() take the rank's shard (a Pinned from the ShardStore) and keep
// it pinned until the copy from or to it has completed on the device: the pin is released by
// a later call of this interface (at the latest finish()), never on another thread.
//
// Thread-safety: one thread (train()'s) calls everything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "tier/status.hpp"
#include "trainer/backend.hpp"
#include "trainer/state.hpp"

namespace tier::train {

class LayerStream {
 public:
  virtual ~LayerStream() = default;
  virtual const char* name() const = 0;

  // Once per train(), after store.open(): sizes the device slots for these shards
  // (elements per rank, per layer) with `depth` fetches open at once (K + 1), and registers the
  // store's memory for DMA. `precision` is the store's: with kBf16 the parameter and gradient
  // shards handed to fetch() and push_grad() hold bf16 values (Pinned::bf16()), which the
  // stream moves and reduces as bf16. The gradient buffers it returns are fp32 either way; the
  // parameters are bf16 (LayerParams::bf16) when the store is bf16 and the backend computes
  // from bf16 (Backend::bf16_params()), and fp32 otherwise.
  // The stream keeps a reference to `store` until it is destroyed.
  [[nodiscard]] virtual Status open(ShardStore& store, std::span<const size_t> shard_floats, int depth,
                                    Precision precision) = 0;

  // Enqueues the copy of `shard` (this rank's parameter shard of `layer`, pinned) to the device
  // and the all-gather of the layer; returns the device buffer that will hold the whole padded
  // layer (ranks x shard elements, fp32 or bf16: open()). Backend calls issued after this
  // returns see the layer. The buffer stays valid until done_with_oldest() released it.
  [[nodiscard]] virtual Result<LayerParams> fetch(int layer, Pinned shard) = 0;
  // The backend calls that read the oldest open fetch have all been issued: its slot may be
  // refilled by the next fetch (the device orders the refill after those calls).
  [[nodiscard]] virtual Status done_with_oldest() = 0;

  // A zeroed device buffer (ranks x shard floats) for `layer`'s whole gradient; valid until
  // push_grad(layer). Layer 0's may stay open while other layers' are taken and pushed (the
  // head writes it, the embedding's backward adds to it); at most one other is open at once.
  [[nodiscard]] virtual Result<float*> grad_buffer(int layer) = 0;
  // After the backward calls that write `layer`'s gradient were issued: reduce-scatters it (sum
  // over ranks) and copies this rank's shard into `shard` (the grad shard, pinned for
  // overwrite). Once that copy completed, *sumsq = sum of squares of the shard's values (set by a later
  // call, at the latest finish(); `sumsq` must stay valid until then).
  [[nodiscard]] virtual Status push_grad(int layer, Pinned shard, double* sumsq) = 0;

  // End of a pass: waits for every copy, sets every pending *sumsq and releases every pin.
  // After it the host shards hold the pass's gradients. Also the way to drop everything after
  // a failed call.
  [[nodiscard]] virtual Status finish() = 0;
  // Bytes of parameter shards copied host to device by fetch() since open() (the step line's
  // h2d_gbps); 0 from a stream that does not count them.
  virtual uint64_t h2d_bytes() const { return 0; }
};

}  // namespace tier::train
