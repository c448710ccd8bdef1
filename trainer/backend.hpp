// The compute backend of tier-train: forward and backward of each layer kind on explicit
// buffers. The CPU backend (trainer/cpu/) and the CUDA backend (trainer/cuda/) implement it;
// the ZeRO-3 streamer (trainer/zero3.*) decides which layer's parameters are gathered where,
// and calls the backend with plain pointers.
//
// This header is plain C++20 (no <expected>, no C++23) so that .cu files can include it.
//
// Model (GPT-2 style, decoder only), with B = sequences on this rank, T = sequence length,
// C = model width, NH = heads, HS = C / NH, V = vocabulary (256 for bytes), H = 4 * C:
//
//   x0[B,T,C]      = wte[tokens] + wpe[0..T)                          "embed"  layer (layer 0)
//   for each block l = 1..L:                                          "block"  layers 1..L
//     r[B,T,C]     = x + proj(attention(qkv(ln1(x))))                 causal, NH heads
//     y[B,T,C]     = r + fcproj(gelu(fc(ln2(r))))                     GELU, tanh approximation
//   logits[B,T,V]  = lnf(xL) @ wte^T                                  "head"   (uses layer 0)
//   loss           = mean cross-entropy(logits, targets)
//
// Layer 0 ("embed/head") holds wte, wpe, lnf_w, lnf_b: the output head is tied to wte, so the
// head and the embedding read and write the same flat buffer. Every layer's parameters are ONE
// flat float buffer, carved by the layouts below (offsets in floats, shapes beside each tensor).
// Linear weights are stored [out, in] row-major: out = in @ W^T + b.
//
// Memory: every pointer passed to a Backend method is "device memory" of that backend
// (host memory for the CPU backend), allocated with Backend::alloc unless host_accessible()
// says host pointers are fine. Buffers are owned by the caller; the backend keeps no pointer
// past the call. Calls on one Backend are issued from one thread; they may run asynchronously
// on the device in issue order; synchronize() waits for all of them. Methods that return a
// host value (head_forward's loss) synchronize first.
#pragma once

#include <cstddef>
#include <utility>
#include <cstdint>

namespace tier::train {

// How a block computes its causal attention (tier-train --attention).
//   kFlash      tiled, online softmax (the FlashAttention recurrence): saves only the output
//               and one logsumexp per row [B,NH,T]; the backward recomputes the probabilities
//               tile by tile. Memory linear in T.
//   kReference  materialized: saves the probabilities [B,NH,T,T] and its backward needs a
//               [B,NH,T,T] scratch. Memory quadratic in T; kept as the reference kFlash is
//               tested against.
enum class Attention : int { kFlash = 0, kReference = 1 };

// Shapes of one forward/backward on one rank.
struct Dims {
  int B = 0;      // sequences in this call
  int T = 0;      // tokens per sequence (<= max_T)
  int C = 0;      // width
  int NH = 0;     // heads; C % NH == 0
  int V = 0;      // vocabulary
  int max_T = 0;  // rows of wpe
  Attention attention = Attention::kFlash;
};

// Floats of the attention state a block saves (BlockActs::att or BlockActs::lse) and of the
// per-row scratch its backward needs: B*NH*T*T for the reference, B*NH*T for flash.
inline size_t attention_acts_floats(const Dims& d) {
  const size_t rows = static_cast<size_t>(d.B) * d.NH * d.T;
  return d.attention == Attention::kReference ? rows * d.T : rows;
}

// ---- parameter layouts (offsets in floats into a layer's flat buffer) ----

struct EmbedLayout {
  size_t wte = 0;    // [V, C]      token embedding, also the output head (tied)
  size_t wpe = 0;    // [max_T, C]  position embedding
  size_t lnf_w = 0;  // [C]         final LayerNorm scale
  size_t lnf_b = 0;  // [C]         final LayerNorm shift
  size_t total = 0;  // floats in the layer
};

inline EmbedLayout embed_layout(const Dims& d) {
  EmbedLayout l;
  size_t o = 0;
  auto take = [&o](size_t n) { return std::exchange(o, o + n); };  // the next n floats
  const size_t C = static_cast<size_t>(d.C);
  l.wte = take(static_cast<size_t>(d.V) * C);
  l.wpe = take(static_cast<size_t>(d.max_T) * C);
  l.lnf_w = take(C);
  l.lnf_b = take(C);
  l.total = o;
  return l;
}

struct BlockLayout {
  size_t ln1_w = 0, ln1_b = 0;        // [C], [C]
  size_t qkv_w = 0, qkv_b = 0;        // [3C, C], [3C]   q | k | v along the output
  size_t proj_w = 0, proj_b = 0;      // [C, C], [C]     attention output projection
  size_t ln2_w = 0, ln2_b = 0;        // [C], [C]
  size_t fc_w = 0, fc_b = 0;          // [4C, C], [4C]
  size_t fcproj_w = 0, fcproj_b = 0;  // [C, 4C], [C]
  size_t total = 0;
};

inline BlockLayout block_layout(const Dims& d) {
  BlockLayout l;
  size_t o = 0;
  auto take = [&o](size_t n) { return std::exchange(o, o + n); };  // the next n floats
  const size_t C = static_cast<size_t>(d.C);
  l.ln1_w = take(C);
  l.ln1_b = take(C);
  l.qkv_w = take(3 * C * C);
  l.qkv_b = take(3 * C);
  l.proj_w = take(C * C);
  l.proj_b = take(C);
  l.ln2_w = take(C);
  l.ln2_b = take(C);
  l.fc_w = take(4 * C * C);
  l.fc_b = take(4 * C);
  l.fcproj_w = take(4 * C * C);
  l.fcproj_b = take(C);
  l.total = o;
  return l;
}

// ---- activations a block saves in forward for its backward (floats, one buffer per block) ----

struct BlockActs {
  float* ln1 = nullptr;       // [B,T,C]     ln1(x)
  float* ln1_mean = nullptr;  // [B,T]
  float* ln1_rstd = nullptr;  // [B,T]
  float* qkv = nullptr;       // [B,T,3C]
  float* att = nullptr;       // [B,NH,T,T]  softmax probabilities (causal; upper part unused);
                              //             Attention::kReference only, else null
  float* lse = nullptr;       // [B,NH,T]    logsumexp of each row's scaled scores;
                              //             Attention::kFlash only, else null
  float* atty = nullptr;      // [B,T,C]     attention output before proj
  float* r = nullptr;         // [B,T,C]     residual after attention
  float* ln2 = nullptr;       // [B,T,C]
  float* ln2_mean = nullptr;  // [B,T]
  float* ln2_rstd = nullptr;  // [B,T]
  float* fch = nullptr;       // [B,T,4C]    fc output, before GELU
  float* fch_gelu = nullptr;  // [B,T,4C]
};

inline size_t block_acts_floats(const Dims& d) {
  const size_t BT = static_cast<size_t>(d.B) * d.T, C = static_cast<size_t>(d.C);
  return BT * C * 5 + BT * 4 + BT * 3 * C + attention_acts_floats(d) + BT * 4 * C * 2;
}

// Carves `base` (block_acts_floats(d) floats) into a BlockActs.
inline BlockActs carve_block_acts(float* base, const Dims& d) {
  const size_t BT = static_cast<size_t>(d.B) * d.T, C = static_cast<size_t>(d.C);
  float* p = base;
  auto take = [&p](size_t n) { return std::exchange(p, p + n); };  // the next n floats
  BlockActs a;
  a.ln1 = take(BT * C);
  a.ln1_mean = take(BT);
  a.ln1_rstd = take(BT);
  a.qkv = take(BT * 3 * C);
  (d.attention == Attention::kReference ? a.att : a.lse) = take(attention_acts_floats(d));
  a.atty = take(BT * C);
  a.r = take(BT * C);
  a.ln2 = take(BT * C);
  a.ln2_mean = take(BT);
  a.ln2_rstd = take(BT);
  a.fch = take(BT * 4 * C);
  a.fch_gelu = take(BT * 4 * C);
  return a;
}

// Activations of the head: lnf output and statistics, and the logits (probabilities after
// head_forward with grads, since backward needs only softmax - onehot).
struct HeadActs {
  float* lnf = nullptr;       // [B,T,C]
  float* lnf_mean = nullptr;  // [B,T]
  float* lnf_rstd = nullptr;  // [B,T]
  float* logits = nullptr;    // [B,T,V]
};

inline size_t head_acts_floats(const Dims& d) {
  const size_t BT = static_cast<size_t>(d.B) * d.T;
  return BT * d.C + 2 * BT + BT * d.V;
}

inline HeadActs carve_head_acts(float* base, const Dims& d) {
  const size_t BT = static_cast<size_t>(d.B) * d.T;
  HeadActs a;
  a.lnf = base;
  a.lnf_mean = a.lnf + BT * d.C;
  a.lnf_rstd = a.lnf_mean + BT;
  a.logits = a.lnf_rstd + BT;
  return a;
}

// A layer's parameters as a layer method receives them (the layouts above either way): fp32
// (what every backend takes), or the bf16 working copy (uint16_t bits, trainer/bf16.hpp) on a
// backend whose bf16_params() is true, which then computes from those bits without an fp32
// copy of the layer. Exactly one pointer is set. Converts implicitly from `const float*`, so
// fp32 callers pass their pointer as before.
struct LayerParams {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  LayerParams() = default;
  LayerParams(const float* p) : f32(p) {}  // NOLINT(google-explicit-constructor): fp32 call sites
  static LayerParams of_bf16(const uint16_t* p) {
    LayerParams l;
    l.bf16 = p;
    return l;
  }
  const void* ptr() const { return f32 != nullptr ? static_cast<const void*>(f32) : bf16; }
};

// Scratch a block's backward needs (not saved across calls): one buffer shared by all blocks.
inline size_t block_scratch_floats(const Dims& d) {
  const size_t BT = static_cast<size_t>(d.B) * d.T, C = static_cast<size_t>(d.C);
  // dln[BT,C] + dqkv[BT,3C] + datty[BT,C] + dfch[BT,4C] + dr[BT,C]
  // + attention: datt[B,NH,T,T] (reference) or drow[B,NH,T] = rowsum(dout * out) (flash)
  return BT * C * 3 + BT * 3 * C + attention_acts_floats(d) + BT * 4 * C;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- memory (device memory of this backend; floats) ----
  // True when device memory is host memory (CPU backend): the trainer then gathers straight
  // into backend buffers and skips upload/download.
  virtual bool host_accessible() const = 0;
  // Returns nullptr on failure. Memory is uninitialized.
  virtual float* alloc(size_t floats) = 0;
  virtual void free(float* p) = 0;
  virtual void zero(float* p, size_t floats) = 0;
  virtual void upload(float* dst_dev, const float* src_host, size_t floats) = 0;
  virtual void download(float* dst_host, const float* src_dev, size_t floats) = 0;
  // Token ids live in device memory too: tokens/targets [B,T] int32 in [0, V).
  virtual int32_t* alloc_tokens(size_t n) = 0;
  virtual void free_tokens(int32_t* p) = 0;
  virtual void upload_tokens(int32_t* dst_dev, const int32_t* src_host, size_t n) = 0;
  virtual void synchronize() = 0;
  // The first error the backend met (a CUDA or cuBLAS call that failed), or "" while none
  // did. A backend that failed does nothing more: train() checks this after every step and
  // fails the run with it. Default: a backend that cannot fail this way.
  virtual const char* failure() const { return ""; }
  // Page-locks host memory the trainer allocated itself (staging for upload/download) so
  // copies to and from it are DMA; false when the backend has no use for it or refused (the
  // memory then stays pageable and still works). A pinned range must be unpinned with
  // unpin_host before it is freed. Default: nothing to pin (host-accessible backends).
  virtual bool pin_host(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
    return false;
  }
  virtual void unpin_host(void* p) { (void)p; }
  // --precision bf16 on a backend whose memory is not host memory (the trainer's host path):
  // upload_bf16 copies n bf16 values (uint16_t bits, trainer/bf16.hpp) into dst_dev as fp32,
  // widened (exactly) on the device, so half the bytes cross the bus; same contract as upload.
  // download_bf16 writes bf16(src_dev[i]) to dst_host, rounded on the device to the bits the
  // host's f32_to_bf16 gives; same contract as download. false: not done (the default), and
  // the caller converts on the host around upload / download instead.
  virtual bool upload_bf16(float* dst_dev, const uint16_t* src_host, size_t n) {
    (void)dst_dev, (void)src_host, (void)n;
    return false;
  }
  virtual bool download_bf16(uint16_t* dst_host, const float* src_dev, size_t n) {
    (void)dst_host, (void)src_dev, (void)n;
    return false;
  }

  // True when the layer methods accept LayerParams::bf16 (the CUDA backend: bf16 GEMMs from
  // the gathered bf16 layer). Default: fp32 parameters only.
  virtual bool bf16_params() const { return false; }

  // ---- layers ----
  // embed: out[B,T,C] = wte[tokens[b,t]] + wpe[t]. `params` is layer 0 (EmbedLayout).
  virtual void embed_forward(const Dims& d, LayerParams params, const int32_t* tokens, float* out) = 0;
  // Accumulates (+=) into grads (layer 0 layout) the gradient of wte and wpe from dout[B,T,C].
  virtual void embed_backward(const Dims& d, float* grads, const int32_t* tokens, const float* dout) = 0;

  // block: y[B,T,C] = block(x[B,T,C]); `params` is one BlockLayout buffer. Saves what the
  // backward needs into `acts` (carve_block_acts). x and y must not alias.
  virtual void block_forward(const Dims& d, LayerParams params, const float* x, BlockActs acts, float* y) = 0;
  // Given dy[B,T,C], writes dx[B,T,C] (overwrites) and accumulates (+=) parameter gradients
  // into `grads` (BlockLayout). `x` and `acts` are exactly those of the matching forward.
  // `scratch` holds block_scratch_floats(d) floats. dx may alias dy.
  virtual void block_backward(const Dims& d, LayerParams params, float* grads, const float* x, BlockActs acts,
                              const float* dy, float* dx, float* scratch) = 0;

  // head: logits = lnf(x) @ wte^T; returns sum over the B*T positions of the cross-entropy
  // -log softmax(logits)[target] (a host value; synchronizes). When `dx` is not null it also
  // runs the backward of loss_scale * that sum: writes dx[B,T,C] (overwrites) and accumulates
  // (+=) the gradients of wte, lnf_w, lnf_b into `grads` (layer 0 layout). `params`: layer 0.
  virtual double head_forward(const Dims& d, LayerParams params, const float* x, const int32_t* targets,
                              HeadActs acts, float* dx, float* grads, float loss_scale) = 0;
};

}  // namespace tier::train
