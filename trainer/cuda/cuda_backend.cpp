// tier::train::Backend on one GPU: the kernels of kernels.cu plus cuBLAS GEMMs, all enqueued on
// one compute stream (see cuda_backend.hpp for precision and error contracts).
#include "trainer/cuda/cuda_backend.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <unordered_map>

#include "trainer/cuda/kernels.hpp"
#include "trainer/gpu_map.hpp"

namespace tier::train::cuda {
namespace {

const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_ERROR";
  }
}

bool no_device(cudaError_t e) {
  return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary ||
         e == cudaErrorDevicesUnavailable;
}

// A linear layer's weight as a GEMM reads it: fp32 or bf16 (exactly one set).
struct Matrix {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
};

// A block's parameters as its kernels read them: LayerNorm scales and shifts and the biases in
// fp32, the four weight matrices fp32 or bf16.
struct Weights {
  const float *ln1_w = nullptr, *ln1_b = nullptr, *qkv_b = nullptr, *proj_b = nullptr;
  const float *ln2_w = nullptr, *ln2_b = nullptr, *fc_b = nullptr, *fcproj_b = nullptr;
  Matrix qkv_w, proj_w, fc_w, fcproj_w;
};

class CudaBackend final : public Backend {
 public:
  // A device buffer of T, grown on demand and never shrunk (growing frees the old one, which
  // synchronizes the device: nothing still reads it).
  template <class T> struct DeviceBuf {
    T* p = nullptr;
    size_t n = 0;
  };
  using Staging16 = DeviceBuf<uint16_t>;

  CudaBackend(const CudaBackendOptions& o) : opts_(o) {}

  bool init(std::string* error) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
      (void)cudaGetLastError();
      *error = std::string("no CUDA device: cudaGetDeviceCount: ") +
               (e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
      if (e != cudaSuccess && !no_device(e))
        *error = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
      return false;
    }
    if (opts_.device < 0 || opts_.device >= n) {
      *error = "no CUDA device with index " + std::to_string(opts_.device);
      return false;
    }
    if (!cu(cudaSetDevice(opts_.device), "cudaSetDevice") ||
        !cu(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate") ||
        !cu(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate") ||
        !cu(cudaEventCreateWithFlags(&all_, cudaEventDisableTiming), "cudaEventCreate") ||
        !cu(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), "cudaEventCreate") ||
        !cu(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming), "cudaEventCreate") ||
        !cu(cudaMalloc(reinterpret_cast<void**>(&dloss_), sizeof(double)), "cudaMalloc") ||
        !cu(cudaMallocHost(reinterpret_cast<void**>(&hloss_), sizeof(double)), "cudaMallocHost") ||
        !bl(cublasCreate(&blas_), "cublasCreate") ||
        !bl(cublasSetStream(blas_, stream_), "cublasSetStream")) {
      *error = error_;
      return false;
    }
    compute_ = opts_.exact_gemm ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
    return true;
  }

  ~CudaBackend() override {
    if (copy_) (void)cudaStreamSynchronize(copy_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
    for (auto& [p, ev] : uses_) (void)cudaEventDestroy(ev);
    if (all_) (void)cudaEventDestroy(all_);
    if (copied_) (void)cudaEventDestroy(copied_);
    if (staged_) (void)cudaEventDestroy(staged_);
    for (Staging16* st : {&up16_, &down16_, &act16_})
      if (st->p) (void)cudaFree(st->p);
    for (DeviceBuf<float>* st : {&wide_, &vec_})
      if (st->p) (void)cudaFree(st->p);
    if (copy_) (void)cudaStreamDestroy(copy_);
    if (blas_) (void)cublasDestroy(blas_);
    if (scratch_) (void)cudaFree(scratch_);
    if (dloss_) (void)cudaFree(dloss_);
    if (hloss_) (void)cudaFreeHost(hloss_);
    if (stream_) (void)cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "cuda"; }
  const std::string& error() const { return error_; }
  const char* failure() const override { return error_.c_str(); }
  cudaStream_t stream() const { return stream_; }

  // ---- memory ----
  bool host_accessible() const override { return false; }
  float* alloc(size_t floats) override {
    void* p = nullptr;
    if (!cu(cudaMalloc(&p, std::max<size_t>(floats, 1) * sizeof(float)), "cudaMalloc")) return nullptr;
    return static_cast<float*>(p);
  }
  void free(float* p) override {
    if (!p) return;
    forget_use(p);
    (void)cudaFree(p);  // cudaFree synchronizes the device
  }
  void zero(float* p, size_t floats) override {
    if (ok()) cu(cudaMemsetAsync(p, 0, floats * sizeof(float), stream_), "cudaMemsetAsync");
  }
  // Returns once the host buffer has been read (the Backend contract lets the caller reuse it
  // then), but the copy runs on the copy stream, so it overlaps kernels already enqueued on the
  // compute stream: a layer's parameters upload while the previous layer computes. Ordering:
  // the copy waits for the last layer call that read `dst` as its parameters (tracked per
  // pointer), or for all enqueued compute when `dst` was never passed as parameters; the
  // compute stream waits for the copy before its next kernel.
  void upload(float* dst, const float* src, size_t floats) override {
    upload_bytes(dst, src, floats * sizeof(float));
  }
  void download(float* dst, const float* src, size_t floats) override {
    copy(dst, src, floats * sizeof(float), cudaMemcpyDeviceToHost);
  }
  // The bf16 bytes go to a device staging buffer on the copy stream (after the previous widen
  // out of it ran: `staged_`), and the compute stream widens them into dst.
  bool upload_bf16(float* dst, const uint16_t* src, size_t n) override {
    uint16_t* stage = staging16(up16_, n);
    if (stage == nullptr) return false;
    // dst is written by the widen on the compute stream, after everything that read it.
    h2d(stage, src, n * sizeof(uint16_t), staged_);
    if (ok()) cu(bf16_to_f32(dst, stage, n, stream_), "widen bf16 upload");
    if (ok()) cu(cudaEventRecord(staged_, stream_), "cudaEventRecord");
    return true;
  }
  bool download_bf16(uint16_t* dst, const float* src, size_t n) override {
    uint16_t* stage = staging16(down16_, n);
    if (stage == nullptr) return false;
    if (cu(f32_to_bf16(stage, src, n, stream_), "round bf16 download"))
      copy(dst, stage, n * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    return true;
  }
  int32_t* alloc_tokens(size_t n) override {
    void* p = nullptr;
    if (!cu(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(int32_t)), "cudaMalloc")) return nullptr;
    return static_cast<int32_t*>(p);
  }
  void free_tokens(int32_t* p) override {
    if (!p) return;
    forget_use(p);
    (void)cudaFree(p);
  }
  void upload_tokens(int32_t* dst, const int32_t* src, size_t n) override {
    upload_bytes(dst, src, n * sizeof(int32_t));
  }
  void synchronize() override {
    if (stream_) cu(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  // The trainer's host staging (gather slots, gradient buffers): pinned so upload/download
  // are DMA. A refusal is not an error (the copies then go through CUDA's pageable path).
  bool pin_host(void* p, size_t bytes) override { return ::tier::train::cuda_pin_host(p, bytes, nullptr); }
  void unpin_host(void* p) override { ::tier::train::cuda_unpin_host(p); }

  // ---- layers ----
  // Layer 0 (wte, wpe, lnf; (V + max_T + 2) * C values, small beside a block's 12 C^2) is
  // widened whole when it comes as bf16; blocks compute from their bf16 matrices directly.
  bool bf16_params() const override { return true; }

  void embed_forward(const Dims& d, LayerParams lp, const int32_t* tokens, float* out) override {
    if (!ok()) return;
    const EmbedLayout l = embed_layout(d);
    const float* params = fp32_params(lp, l.total);
    if (!params) return;
    cu(encoder_forward(out, tokens, params + l.wte, params + l.wpe, d.B, d.T, d.C, stream_),
       "encoder_forward");
    note_use(lp.ptr());
  }

  void embed_backward(const Dims& d, float* grads, const int32_t* tokens, const float* dout) override {
    if (!ok()) return;
    const EmbedLayout l = embed_layout(d);
    cu(encoder_backward(grads + l.wte, grads + l.wpe, dout, tokens, d.B, d.T, d.C, stream_),
       "encoder_backward");
  }

  void block_forward(const Dims& d, LayerParams lp, const float* x, BlockActs a, float* y) override {
    if (!ok()) return;
    const BlockLayout l = block_layout(d);
    const Weights p = weights(lp, l, d.C);
    if (!ok()) return;
    const int N = d.B * d.T, C = d.C, NH = d.NH, HS = C / NH, BH = d.B * NH;
    const size_t BTC = size_t(N) * C;
    cu(layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, N, C, stream_), "ln1");
    linear_forward(a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * C, 0.0f);
    if (d.attention == Attention::kFlash) {
      if (tensor_core_attention(d))
        cu(flash_attention_forward_tc(a.atty, a.lse, a.qkv, d.B, d.T, C, NH, stream_),
           "flash_attention_forward_tc");
      else
        cu(flash_attention_forward(a.atty, a.lse, a.qkv, d.B, d.T, C, NH, stream_),
           "flash_attention_forward");
    } else {
      float* s = ensure_scratch(4 * BTC);  // q | k | v | yh
      if (!s) return;
      float *q = s, *k = s + BTC, *v = s + 2 * BTC, *yh = s + 3 * BTC;
      cu(attention_split_heads(q, k, v, a.qkv, d.B, d.T, C, NH, stream_), "split_heads");
      // att = softmax(q k^T / sqrt(HS)) per (b, h), causal.
      gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, d.T, d.T, HS, k, HS, size_t(d.T) * HS, q, HS, size_t(d.T) * HS,
                   a.att, d.T, size_t(d.T) * d.T, BH, 0.0f);
      const float sc = 1.0f / std::sqrt(static_cast<float>(HS));
      cu(causal_softmax_forward(a.att, a.att, sc, BH * d.T, d.T, stream_), "softmax");
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, HS, d.T, d.T, v, HS, size_t(d.T) * HS, a.att, d.T,
                   size_t(d.T) * d.T, yh, HS, size_t(d.T) * HS, BH, 0.0f);
      cu(attention_merge_heads(a.atty, yh, d.B, d.T, C, NH, stream_), "merge_heads");
    }
    // r = x + proj(atty)
    copy_d2d(a.r, x, BTC);
    linear_forward(a.r, a.atty, p.proj_w, p.proj_b, N, C, C, 1.0f);
    cu(layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.r, p.ln2_w, p.ln2_b, N, C, stream_), "ln2");
    linear_forward(a.fch, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C, 0.0f);
    cu(gelu_forward(a.fch_gelu, a.fch, 4 * BTC, stream_), "gelu");
    // y = r + fcproj(gelu)
    copy_d2d(y, a.r, BTC);
    linear_forward(y, a.fch_gelu, p.fcproj_w, p.fcproj_b, N, 4 * C, C, 1.0f);
    note_use(lp.ptr());
  }

  void block_backward(const Dims& d, LayerParams lp, float* g, const float* x, BlockActs a, const float* dy,
                      float* dx, float* scratch) override {
    if (!ok()) return;
    const BlockLayout l = block_layout(d);
    const Weights p = weights(lp, l, d.C);
    if (!ok()) return;
    const int N = d.B * d.T, C = d.C, NH = d.NH, HS = C / NH, BH = d.B * NH;
    const size_t BTC = size_t(N) * C;
    // Caller's scratch, carved as block_scratch_floats() counts it.
    float* dln = scratch;                           // [N,C]
    float* datty = dln + BTC;                       // [N,C]
    float* dr = datty + BTC;                        // [N,C]
    float* dqkv = dr + BTC;                         // [N,3C]
    float* datt = dqkv + 3 * BTC;                   // reference: [B,NH,T,T]; flash: drow [B,NH,T]
    float* dfch = datt + attention_acts_floats(d);  // [N,4C]

    copy_d2d(dr, dy, BTC);  // residual branch; dy is not read after the fc projection
    linear_backward(dfch, g + l.fcproj_w, g + l.fcproj_b, dy, a.fch_gelu, p.fcproj_w, N, 4 * C, C);
    cu(gelu_backward(dfch, a.fch, dfch, 4 * BTC, stream_), "gelu_backward");
    linear_backward(dln, g + l.fc_w, g + l.fc_b, dfch, a.ln2, p.fc_w, N, C, 4 * C);
    cu(layernorm_backward(dr, g + l.ln2_w, g + l.ln2_b, dln, a.r, p.ln2_w, a.ln2_mean, a.ln2_rstd, N, C,
                          stream_),
       "ln2_backward");
    linear_backward(datty, g + l.proj_w, g + l.proj_b, dr, a.atty, p.proj_w, N, C, C);
    // attention
    if (d.attention == Attention::kFlash) {
      if (tensor_core_attention(d))
        cu(flash_attention_backward_tc(dqkv, datt, datty, a.qkv, a.atty, a.lse, d.B, d.T, C, NH, stream_),
           "flash_attention_backward_tc");
      else
        cu(flash_attention_backward(dqkv, datt, datty, a.qkv, a.atty, a.lse, d.B, d.T, C, NH, stream_),
           "flash_attention_backward");
    } else {
      float* s = ensure_scratch(7 * BTC);  // q | k | v | dyh | dq | dk | dv
      if (!s) return;
      float *q = s, *k = s + BTC, *v = s + 2 * BTC, *dyh = s + 3 * BTC, *dq = s + 4 * BTC, *dk = s + 5 * BTC,
            *dv = s + 6 * BTC;
      cu(attention_split_out(dyh, datty, d.B, d.T, C, NH, stream_), "split_out");
      cu(attention_split_heads(q, k, v, a.qkv, d.B, d.T, C, NH, stream_), "split_heads");
      const size_t sTH = size_t(d.T) * HS, sTT = size_t(d.T) * d.T;
      gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, d.T, d.T, HS, v, HS, sTH, dyh, HS, sTH, datt, d.T, sTT, BH,
                   0.0f);
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, HS, d.T, d.T, dyh, HS, sTH, a.att, d.T, sTT, dv, HS, sTH, BH,
                   0.0f);
      const float sc = 1.0f / std::sqrt(static_cast<float>(HS));
      cu(causal_softmax_backward(datt, a.att, datt, sc, BH * d.T, d.T, stream_), "softmax_backward");
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, HS, d.T, d.T, k, HS, sTH, datt, d.T, sTT, dq, HS, sTH, BH, 0.0f);
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, HS, d.T, d.T, q, HS, sTH, datt, d.T, sTT, dk, HS, sTH, BH, 0.0f);
      cu(attention_merge_heads_qkv(dqkv, dq, dk, dv, d.B, d.T, C, NH, stream_), "merge_qkv");
    }
    linear_backward(dln, g + l.qkv_w, g + l.qkv_b, dqkv, a.ln1, p.qkv_w, N, C, 3 * C);
    copy_d2d(dx, dr, BTC);
    cu(layernorm_backward(dx, g + l.ln1_w, g + l.ln1_b, dln, x, p.ln1_w, a.ln1_mean, a.ln1_rstd, N, C,
                          stream_),
       "ln1_backward");
    note_use(lp.ptr());
  }

  double head_forward(const Dims& d, LayerParams lp, const float* x, const int32_t* targets, HeadActs a,
                      float* dx, float* g, float loss_scale) override {
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    if (!ok()) return kNaN;
    const EmbedLayout l = embed_layout(d);
    const float* p = fp32_params(lp, l.total);
    if (!p) return kNaN;
    const int N = d.B * d.T, C = d.C, V = d.V;
    const size_t BTC = size_t(N) * C;
    float* s = ensure_scratch(BTC + size_t(N));  // dlnf | losses
    if (!s) return kNaN;
    float *dlnf = s, *losses = s + BTC;
    cu(layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, p + l.lnf_w, p + l.lnf_b, N, C, stream_), "lnf");
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, p + l.wte, C, a.lnf, C, a.logits, V, 0.0f);
    const bool backward = dx != nullptr && loss_scale != 0.0f;
    cu(cross_entropy(losses, a.logits, targets, N, V, backward ? loss_scale : 0.0f, stream_),
       "cross_entropy");
    cu(sum_to_double(dloss_, losses, size_t(N), stream_), "sum_loss");
    if (dx != nullptr) {
      if (backward) {
        // dlnf = dlogits @ wte; dwte += dlogits^T @ lnf; dx = lnf_backward(dlnf).
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, p + l.wte, C, a.logits, V, dlnf, C, 0.0f);
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, a.lnf, C, a.logits, V, g + l.wte, C, 1.0f);
        zero(dx, BTC);
        cu(layernorm_backward(dx, g + l.lnf_w, g + l.lnf_b, dlnf, x, p + l.lnf_w, a.lnf_mean, a.lnf_rstd, N,
                              C, stream_),
           "lnf_backward");
      } else {
        zero(dx, BTC);  // loss_scale 0: the gradient is zero
      }
    }
    note_use(lp.ptr());
    cu(cudaMemcpyAsync(hloss_, dloss_, sizeof(double), cudaMemcpyDeviceToHost, stream_), "loss D2H");
    synchronize();
    return ok() ? *hloss_ : kNaN;
  }

 private:
  bool ok() const { return error_.empty(); }
  // Flash attention on the tensor cores (bf16, fp32 accumulation) where the GEMMs are bf16 too
  // and the head size is one the kernels have (32, 64, 128); the fp32 kernels otherwise.
  bool tensor_core_attention(const Dims& d) const {
    return compute_ == CUBLAS_COMPUTE_32F_FAST_16BF && flash_attention_tc_supported(d.B, d.T, d.C, d.NH);
  }
  bool cu(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    if (error_.empty())
      error_ = std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return false;
  }
  bool bl(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    if (error_.empty()) error_ = std::string(what) + ": " + cublas_name(st);
    return false;
  }

  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (!ok() || bytes == 0) return;
    if (cu(cudaMemcpyAsync(dst, src, bytes, kind, stream_), "cudaMemcpyAsync")) synchronize();
  }
  void upload_bytes(void* dst, const void* src, size_t bytes) {
    if (!ok() || bytes == 0) return;
    cudaEvent_t dep = nullptr;
    if (auto it = uses_.find(dst); it != uses_.end()) {
      dep = it->second;
    } else {
      if (!cu(cudaEventRecord(all_, stream_), "cudaEventRecord")) return;
      dep = all_;
    }
    h2d(dst, src, bytes, dep);
  }
  // The H2D on the copy stream after `dep`; the compute stream waits for it; returns once the
  // host bytes are read.
  void h2d(void* dst, const void* src, size_t bytes, cudaEvent_t dep) {
    if (!ok() || bytes == 0) return;
    if (!cu(cudaStreamWaitEvent(copy_, dep, 0), "cudaStreamWaitEvent") ||
        !cu(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_), "cudaMemcpyAsync H2D") ||
        !cu(cudaEventRecord(copied_, copy_), "cudaEventRecord") ||
        !cu(cudaStreamWaitEvent(stream_, copied_, 0), "cudaStreamWaitEvent"))
      return;
    cu(cudaEventSynchronize(copied_), "wait for H2D");
  }
  // A device buffer of at least n values (grown, never shrunk); nullptr after an error.
  template <class T> T* grown(DeviceBuf<T>& st, size_t n, const char* what) {
    if (!ok()) return nullptr;
    if (st.n < n) {
      if (st.p) (void)cudaFree(st.p);  // synchronizes the device: nothing still reads it
      st = {};
      if (!cu(cudaMalloc(reinterpret_cast<void**>(&st.p), n * sizeof(T)), what)) return nullptr;
      st.n = n;
    }
    return st.p;
  }
  uint16_t* staging16(Staging16& st, size_t n) { return grown(st, n, "cudaMalloc bf16 staging"); }

  // The whole layer in fp32: lp.f32 itself, or lp.bf16 widened (exactly) into wide_ on the
  // compute stream. nullptr after an error.
  const float* fp32_params(LayerParams lp, size_t floats) {
    if (lp.f32 != nullptr || !ok()) return ok() ? lp.f32 : nullptr;
    float* w = grown(wide_, floats, "cudaMalloc widened layer");
    if (w == nullptr || !cu(bf16_to_f32(w, lp.bf16, floats, stream_), "widen bf16 layer")) return nullptr;
    return w;
  }
  // A block's parameters for its kernels. From bf16 with bf16 GEMMs: the matrices stay the
  // gathered bf16 values and only the vectors (13 C values) are widened, into vec_; with
  // exact_gemm the whole layer is widened. Check ok() after.
  Weights weights(LayerParams lp, const BlockLayout& l, int C) {
    Weights w;
    const float* f = lp.f32;
    if (f == nullptr && compute_ != CUBLAS_COMPUTE_32F_FAST_16BF) f = fp32_params(lp, l.total);
    if (f != nullptr) {
      w = {f + l.ln1_w,
           f + l.ln1_b,
           f + l.qkv_b,
           f + l.proj_b,
           f + l.ln2_w,
           f + l.ln2_b,
           f + l.fc_b,
           f + l.fcproj_b,
           {f + l.qkv_w, nullptr},
           {f + l.proj_w, nullptr},
           {f + l.fc_w, nullptr},
           {f + l.fcproj_w, nullptr}};
      return w;
    }
    if (!ok()) return w;
    const uint16_t* b = lp.bf16;
    const size_t c = static_cast<size_t>(C);
    float* v = grown(vec_, 13 * c, "cudaMalloc block vectors");
    if (v == nullptr) return w;
    // The vectors lie in five runs of the layout: ln1_w ln1_b | qkv_b | proj_b ln2_w ln2_b | fc_b | fcproj_b.
    size_t at = 0;
    auto run = [&](size_t off, size_t n) {
      float* dst = v + at;
      at += n;
      cu(bf16_to_f32(dst, b + off, n, stream_), "widen block vectors");
      return dst;
    };
    w.ln1_w = run(l.ln1_w, 2 * c);
    w.ln1_b = w.ln1_w + c;
    w.qkv_b = run(l.qkv_b, 3 * c);
    w.proj_b = run(l.proj_b, 3 * c);
    w.ln2_w = w.proj_b + c;
    w.ln2_b = w.proj_b + 2 * c;
    w.fc_b = run(l.fc_b, 4 * c);
    w.fcproj_b = run(l.fcproj_b, c);
    w.qkv_w.bf16 = b + l.qkv_w;
    w.proj_w.bf16 = b + l.proj_w;
    w.fc_w.bf16 = b + l.fc_w;
    w.fcproj_w.bf16 = b + l.fcproj_w;
    return w;
  }
  // x [n] rounded to bf16 (the same rounding cuBLAS's FAST_16BF applies inside a GEMM) into
  // act16_, the bf16 operand of the next GEMM; nullptr after an error.
  const uint16_t* to_bf16(const float* x, size_t n) {
    uint16_t* o = grown(act16_, n, "cudaMalloc bf16 activations");
    if (o == nullptr || !cu(f32_to_bf16(o, x, n, stream_), "round activations to bf16")) return nullptr;
    return o;
  }
  // Records, after the kernels just enqueued, that `params` was read up to here.
  void note_use(const void* params) {
    if (!ok()) return;
    cudaEvent_t& ev = uses_[params];
    if (!ev && !cu(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate")) {
      uses_.erase(params);
      return;
    }
    cu(cudaEventRecord(ev, stream_), "cudaEventRecord");
  }
  void forget_use(const void* p) {
    if (auto it = uses_.find(p); it != uses_.end()) {
      (void)cudaEventDestroy(it->second);
      uses_.erase(it);
    }
  }

  void copy_d2d(float* dst, const float* src, size_t floats) {
    if (dst != src)
      cu(cudaMemcpyAsync(dst, src, floats * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "copy D2D");
  }

  // Internal scratch, grown on demand; its contents do not survive calls.
  float* ensure_scratch(size_t floats) {
    if (!ok()) return nullptr;
    if (floats > scratch_floats_) {
      if (scratch_) {
        synchronize();
        (void)cudaFree(scratch_);
        scratch_ = nullptr;
        scratch_floats_ = 0;
      }
      void* p = nullptr;
      if (!cu(cudaMalloc(&p, floats * sizeof(float)), "cudaMalloc scratch")) return nullptr;
      scratch_ = static_cast<float*>(p);
      scratch_floats_ = floats;
    }
    return scratch_;
  }

  // Column-major cuBLAS on row-major data (see docs/gpu.md for the three linear forms).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A, int lda,
            const float* B, int ldb, float* Cm, int ldc, float beta) {
    if (!ok()) return;
    const float alpha = 1.0f;
    bl(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta, Cm,
                    CUDA_R_32F, ldc, compute_, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx");
  }
  void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A, int lda,
                    size_t sA, const float* B, int ldb, size_t sB, float* Cm, int ldc, size_t sC, int batch,
                    float beta) {
    if (!ok()) return;
    const float alpha = 1.0f;
    bl(cublasGemmStridedBatchedEx(blas_, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda,
                                  static_cast<long long>(sA), B, CUDA_R_32F, ldb, static_cast<long long>(sB),
                                  &beta, Cm, CUDA_R_32F, ldc, static_cast<long long>(sC), batch, compute_,
                                  CUBLAS_GEMM_DEFAULT),
       "cublasGemmStridedBatchedEx");
  }
  // The same GEMM with bf16 A and B, fp32 C and fp32 accumulation (CUBLAS_COMPUTE_32F).
  void gemm16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const uint16_t* A, int lda,
              const uint16_t* B, int ldb, float* Cm, int ldc, float beta) {
    if (!ok()) return;
    const float alpha = 1.0f;
    bl(cublasGemmEx(blas_, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, Cm,
                    CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
       "cublasGemmEx bf16");
  }
  // `act` [rows, cols] times a weight: the fp32 GEMM for an fp32 weight; for a bf16 weight,
  // `act` rounded to bf16 and the bf16 GEMM (the operands FAST_16BF would have rounded anyway).
  void gemm_weight(cublasOperation_t ta, int m, int n, int k, Matrix W, int ldw, const float* act,
                   size_t act_n, int ldact, float* Cm, int ldc, float beta) {
    if (W.bf16 == nullptr) {
      gemm(ta, CUBLAS_OP_N, m, n, k, W.f32, ldw, act, ldact, Cm, ldc, beta);
      return;
    }
    const uint16_t* a16 = to_bf16(act, act_n);
    if (a16 != nullptr) gemm16(ta, CUBLAS_OP_N, m, n, k, W.bf16, ldw, a16, ldact, Cm, ldc, beta);
  }
  // out[N,OC] = beta*out + inp[N,IC] @ W[OC,IC]^T + bias
  void linear_forward(float* out, const float* inp, Matrix W, const float* bias, int N, int IC, int OC,
                      float beta) {
    gemm_weight(CUBLAS_OP_T, OC, N, IC, W, IC, inp, size_t(N) * IC, IC, out, OC, beta);
    if (bias && ok()) cu(add_bias(out, bias, N, OC, stream_), "add_bias");
  }
  // dinp[N,IC] = dout @ W (overwrites); dW += dout^T @ inp (fp32 accumulation into the fp32
  // gradient); dbias += colsum(dout).
  void linear_backward(float* dinp, float* dW, float* dbias, const float* dout, const float* inp, Matrix W,
                       int N, int IC, int OC) {
    gemm_weight(CUBLAS_OP_N, IC, N, OC, W, IC, dout, size_t(N) * OC, OC, dinp, IC, 0.0f);
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, dW, IC, 1.0f);
    if (dbias && ok()) cu(column_sum_acc(dbias, dout, N, OC, stream_), "bias_backward");
  }

  CudaBackendOptions opts_;
  cudaStream_t stream_ = nullptr;  // compute: kernels, GEMMs, memsets, downloads
  cudaStream_t copy_ = nullptr;    // uploads
  cudaEvent_t all_ = nullptr;      // "everything enqueued on stream_ so far" (untracked uploads)
  cudaEvent_t copied_ = nullptr;   // the last upload
  cudaEvent_t staged_ = nullptr;   // compute: after the last widen out of up16_
  Staging16 up16_, down16_;        // device bf16 staging of upload_bf16 / download_bf16 (grown on demand)
  Staging16 act16_;                // the bf16 activation operand of a GEMM with a bf16 weight
  DeviceBuf<float> wide_;          // a bf16 layer widened whole (layer 0; blocks with exact_gemm)
  DeviceBuf<float> vec_;           // a bf16 block's vectors widened (13 C floats)
  std::unordered_map<const void*, cudaEvent_t> uses_;  // params pointer → after its last reader
  cublasHandle_t blas_ = nullptr;
  cublasComputeType_t compute_ = CUBLAS_COMPUTE_32F_FAST_16BF;
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;
  double* dloss_ = nullptr;  // device: the loss sum
  double* hloss_ = nullptr;  // pinned host copy of it
  std::string error_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opts, std::string* error) {
  std::string local;
  std::string* err = error ? error : &local;
  auto b = std::make_unique<CudaBackend>(opts);
  if (!b->init(err)) return nullptr;
  return b;
}

std::string backend_error(const Backend& b) {
  const auto* c = dynamic_cast<const CudaBackend*>(&b);
  return c ? c->error() : std::string();
}

void* backend_stream(const Backend& b) {
  const auto* c = dynamic_cast<const CudaBackend*>(&b);
  return c ? static_cast<void*>(c->stream()) : nullptr;
}

}  // namespace tier::train::cuda

namespace tier::train {

std::unique_ptr<Backend> make_cuda_backend(int local_rank, std::string* pci) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  std::vector<std::string> bus(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof id, d) != cudaSuccess) (void)cudaGetLastError();
    bus[static_cast<size_t>(d)] = id;
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const int dev = cuda_device_for_rank(local_rank, bus, visible != nullptr && *visible != '\0');
  cuda::CudaBackendOptions o;
  o.device = dev >= 0 ? dev : 0;  // no device: the factory below says so
  if (pci != nullptr) *pci = dev >= 0 ? normalize_pci(bus[static_cast<size_t>(dev)]) : std::string();
  std::string err;
  auto b = cuda::make_cuda_backend(o, &err);
  if (!b) std::fprintf(stderr, "tier-train: --backend cuda: %s\n", err.c_str());
  return b;
}

bool cuda_pin_host(void* p, size_t bytes, std::string* error) {
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();
  if (error) *error = std::string("cudaHostRegister: ") + cudaGetErrorString(e);
  return false;
}

void cuda_unpin_host(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace tier::train
