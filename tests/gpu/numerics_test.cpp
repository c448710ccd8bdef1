// The CUDA backend against the CPU backend on tiny shapes: every layer's forward and backward
// (blocks with flash and with reference attention),
// in exact fp32 GEMM mode (tight tolerance) and in bf16 tensor-core mode (bf16 tolerance), and
// the fused AdamW kernel against the CPU AdamW. Skips visibly without a device; the factory's
// no-device answer is checked everywhere.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "trainer/backend.hpp"
#include "trainer/cpu/cpu_backend.hpp"
#include "trainer/cuda/adamw_params.hpp"
#include "trainer/cuda/cuda_backend.hpp"
#include "trainer/cuda/kernels.hpp"
#include "trainer/model.hpp"
#include "trainer/optimizer.hpp"

using namespace tier::train;

namespace {

using tier::test::random_floats;
using tier::test::rel_err;

#define CHECK_CLOSE(got, want, tol)                 \
  do {                                              \
    const double e_ = rel_err(got, want);           \
    INFO(#got << " vs CPU: relative error " << e_); \
    CHECK(e_ <= (tol));                             \
  } while (0)

// Device buffer helper over a Backend.
struct Dev {
  Backend& be;
  float* p = nullptr;
  size_t n = 0;
  Dev(Backend& be, const std::vector<float>& host) : be(be), p(be.alloc(host.size())), n(host.size()) {
    be.upload(p, host.data(), n);
  }
  Dev(Backend& be, size_t n, bool zeroed) : be(be), p(be.alloc(n)), n(n) {
    if (zeroed) be.zero(p, n);
  }
  ~Dev() { be.free(p); }
  std::vector<float> get() const {
    std::vector<float> h(n);
    be.download(h.data(), p, n);
    return h;
  }
};

template <class T> T* device_alloc(size_t n) {
  void* p = nullptr;
  return cudaMalloc(&p, n * sizeof(T)) == cudaSuccess ? static_cast<T*>(p) : nullptr;
}

struct Case {
  bool exact;
  double tol;
};

void run_layers(const Case& cs) {
  INFO((cs.exact ? "fp32 GEMMs" : "bf16 tensor-core GEMMs"));
  std::string err;
  auto gpu = tier::train::cuda::make_cuda_backend({.device = 0, .exact_gemm = cs.exact}, &err);
  REQUIRE(gpu != nullptr);
  auto cpu = make_cpu_backend();
  auto tiny = preset("tiny");
  REQUIRE(tiny.has_value());
  const Dims d = tiny->dims(2, tiny->seq);  // the `tiny` model: C=32, NH=4, T=16, V=256
  const size_t BT = size_t(d.B) * d.T, BTC = BT * d.C;
  std::vector<int32_t> tokens(BT), targets(BT);
  for (size_t i = 0; i < BT; ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 5) % d.V);
    targets[i] = static_cast<int32_t>((i * 11 + 3) % d.V);
  }
  int32_t* dtok = gpu->alloc_tokens(BT);
  int32_t* dtgt = gpu->alloc_tokens(BT);
  gpu->upload_tokens(dtok, tokens.data(), BT);
  gpu->upload_tokens(dtgt, targets.data(), BT);

  // ---- embed ----
  const EmbedLayout el = embed_layout(d);
  std::vector<float> ep = random_floats(el.total, 1, 0.1f);
  for (size_t i = 0; i < size_t(d.C); ++i) ep[el.lnf_w + i] = 1.0f + 0.1f * ep[el.lnf_w + i];
  {
    std::vector<float> out(BTC);
    cpu->embed_forward(d, ep.data(), tokens.data(), out.data());
    Dev dp(*gpu, ep), dout(*gpu, BTC, false);
    gpu->embed_forward(d, dp.p, dtok, dout.p);
    CHECK_CLOSE(dout.get(), out, 1e-6);

    const std::vector<float> g_in = random_floats(BTC, 2);
    std::vector<float> grads(el.total, 0.0f);
    cpu->embed_backward(d, grads.data(), tokens.data(), g_in.data());
    Dev dg(*gpu, el.total, true), dgin(*gpu, g_in);
    gpu->embed_backward(d, dg.p, dtok, dgin.p);
    CHECK_CLOSE(dg.get(), grads, 1e-5);
  }

  // ---- block ----
  const BlockLayout bl = block_layout(d);
  std::vector<float> bp = random_floats(bl.total, 3, 0.2f);
  for (size_t off : {bl.ln1_w, bl.ln2_w})
    for (size_t i = 0; i < size_t(d.C); ++i) bp[off + i] = 1.0f + 0.1f * bp[off + i];
  const std::vector<float> x = random_floats(BTC, 4);
  const std::vector<float> dy = random_floats(BTC, 5);
  for (const Attention kind : {Attention::kFlash, Attention::kReference}) {
    INFO((kind == Attention::kFlash ? "flash attention" : "reference attention"));
    const Dims d = tiny->dims(2, tiny->seq, kind);  // the outer d with this attention
    std::vector<float> acts(block_acts_floats(d)), y(BTC), grads(bl.total, 0.0f), dx(BTC),
        scratch(block_scratch_floats(d));
    cpu->block_forward(d, bp.data(), x.data(), carve_block_acts(acts.data(), d), y.data());
    cpu->block_backward(d, bp.data(), grads.data(), x.data(), carve_block_acts(acts.data(), d), dy.data(),
                        dx.data(), scratch.data());

    Dev dp(*gpu, bp), dxin(*gpu, x), dacts(*gpu, block_acts_floats(d), false), dyout(*gpu, BTC, false);
    gpu->block_forward(d, dp.p, dxin.p, carve_block_acts(dacts.p, d), dyout.p);
    CHECK_CLOSE(dyout.get(), y, cs.tol);
    Dev ddy(*gpu, dy), dgr(*gpu, bl.total, true), ddx(*gpu, BTC, false),
        dscr(*gpu, block_scratch_floats(d), false);
    gpu->block_backward(d, dp.p, dgr.p, dxin.p, carve_block_acts(dacts.p, d), ddy.p, ddx.p, dscr.p);
    CHECK_CLOSE(ddx.get(), dx, cs.tol);
    const std::vector<float> g = dgr.get();
    // Per parameter tensor, so a wrong one is named.
    const std::pair<const char*, std::pair<size_t, size_t>> parts[] = {
        {"ln1", {bl.ln1_w, bl.qkv_w}}, {"qkv", {bl.qkv_w, bl.proj_w}}, {"proj", {bl.proj_w, bl.ln2_w}},
        {"ln2", {bl.ln2_w, bl.fc_w}},  {"fc", {bl.fc_w, bl.fcproj_w}}, {"fcproj", {bl.fcproj_w, bl.total}}};
    for (const auto& [name, r] : parts) {
      INFO("block gradient " << name);
      CHECK_CLOSE(std::vector<float>(g.begin() + r.first, g.begin() + r.second),
                  std::vector<float>(grads.begin() + r.first, grads.begin() + r.second), cs.tol);
    }
    std::vector<float> acts_gpu = dacts.get();
    const BlockActs ca = carve_block_acts(acts.data(), d);
    const BlockActs ga = carve_block_acts(acts_gpu.data(), d);
    if (kind == Attention::kFlash) {
      const size_t rows = size_t(d.B) * d.NH * d.T;
      CHECK_CLOSE(std::vector<float>(ga.lse, ga.lse + rows), std::vector<float>(ca.lse, ca.lse + rows),
                  cs.tol);
      continue;
    }
    const size_t att_n = size_t(d.B) * d.NH * d.T * d.T;
    // Only the causal part of att is defined.
    std::vector<float> att_c, att_g;
    for (size_t i = 0; i < att_n; ++i) {
      const size_t t1 = (i / d.T) % d.T, t2 = i % d.T;
      if (t2 <= t1) {
        att_c.push_back(ca.att[i]);
        att_g.push_back(ga.att[i]);
      }
    }
    CHECK_CLOSE(att_g, att_c, cs.tol);
  }

  // ---- head ----
  {
    const HeadActs unused{};
    (void)unused;
    const float scale = 1.0f / static_cast<float>(BT);
    std::vector<float> acts(head_acts_floats(d)), dx(BTC), grads(el.total, 0.0f);
    const double loss_cpu =
        cpu->head_forward(d, ep.data(), x.data(), targets.data(), carve_head_acts(acts.data(), d), dx.data(),
                          grads.data(), scale);
    Dev dp(*gpu, ep), dxin(*gpu, x), dacts(*gpu, head_acts_floats(d), false), ddx(*gpu, BTC, false),
        dg(*gpu, el.total, true);
    const double loss_gpu =
        gpu->head_forward(d, dp.p, dxin.p, dtgt, carve_head_acts(dacts.p, d), ddx.p, dg.p, scale);
    INFO("backend error: " << tier::train::cuda::backend_error(*gpu));
    REQUIRE(std::isfinite(loss_gpu));
    CHECK(std::abs(loss_gpu - loss_cpu) <= cs.tol * std::abs(loss_cpu));
    CHECK_CLOSE(ddx.get(), dx, cs.tol);
    CHECK_CLOSE(dg.get(), grads, cs.tol);
    // Forward only (no dx) gives the same loss.
    const double loss_fwd =
        gpu->head_forward(d, dp.p, dxin.p, dtgt, carve_head_acts(dacts.p, d), nullptr, nullptr, 0.0f);
    CHECK(std::abs(loss_fwd - loss_cpu) <= cs.tol * std::abs(loss_cpu));
  }
  gpu->free_tokens(dtok);
  gpu->free_tokens(dtgt);
  CHECK(tier::train::cuda::backend_error(*gpu).empty());
}

}  // namespace

TEST_CASE("CUDA backend factory without a device says so", "[gpu]") {
  int n = 0;
  const bool present = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  std::string err;
  auto be = tier::train::cuda::make_cuda_backend({}, &err);
  if (!present) {
    CHECK(be == nullptr);
    CHECK(err.starts_with("no CUDA device"));
  } else {
    REQUIRE(be != nullptr);
    CHECK(std::string(be->name()) == "cuda");
    CHECK_FALSE(be->host_accessible());
  }
}

TEST_CASE("CUDA layers match the CPU backend with fp32 GEMMs", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  run_layers({.exact = true, .tol = 2e-4});
}

TEST_CASE("CUDA layers match the CPU backend with bf16 GEMMs within bf16 tolerance", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  run_layers({.exact = false, .tol = 3e-2});
}

TEST_CASE("fused AdamW kernel matches the CPU AdamW and rounds its bf16 copy", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  const size_t n = 100003;
  std::vector<float> p = random_floats(n, 7), m = random_floats(n, 8, 0.01f),
                     v = random_floats(n, 9, 0.001f, 0.002f), g = random_floats(n, 10);
  AdamWConfig cfg;
  const AdamWStep s = make_step(cfg, 1e-3f, 3, 0.5f);
  std::vector<float> pc(n), mc(n), vc(n);
  adamw_update_scalar(p.data(), m.data(), v.data(), g.data(), pc.data(), mc.data(), vc.data(), n, s, true);

  float* dp = device_alloc<float>(n);
  float* dm = device_alloc<float>(n);
  float* dv = device_alloc<float>(n);
  float* dg = device_alloc<float>(n);
  uint16_t* db = device_alloc<uint16_t>(n);
  REQUIRE((dp && dm && dv && dg && db));
  cudaMemcpy(dp, p.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dm, m.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, v.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dg, g.data(), n * 4, cudaMemcpyHostToDevice);
  const tier::train::cuda::AdamW h = tier::train::cuda::kernel_adamw(s, 3, true);
  REQUIRE(tier::train::cuda::adamw(dp, dg, dm, dv, db, n, h, nullptr) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<float> pg(n), mg(n), vg(n), bf(n);
  std::vector<uint16_t> b16(n);
  cudaMemcpy(pg.data(), dp, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(mg.data(), dm, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(vg.data(), dv, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(b16.data(), db, n * 2, cudaMemcpyDeviceToHost);
  CHECK_CLOSE(pg, pc, 1e-6);
  CHECK_CLOSE(mg, mc, 1e-6);
  CHECK_CLOSE(vg, vc, 1e-6);
  // bf16 → f32 on the device, and the bf16 copy is the fp32 master rounded to 8 mantissa bits.
  REQUIRE(tier::train::cuda::bf16_to_f32(dg, db, n, nullptr) == cudaSuccess);
  cudaMemcpy(bf.data(), dg, n * 4, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < n; i += 997) {
    uint32_t bits;
    std::memcpy(&bits, &bf[i], 4);
    CHECK((bits & 0xffffu) == 0u);
    CHECK(b16[i] == (bits >> 16));
  }
  CHECK_CLOSE(bf, pg, 1.0 / 256);
  for (void* q : {static_cast<void*>(dp), static_cast<void*>(dm), static_cast<void*>(dv),
                  static_cast<void*>(dg), static_cast<void*>(db)})
    cudaFree(q);
}

TEST_CASE("an upload into a parameter buffer waits for the layer that read it", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  std::string err;
  auto gpu = tier::train::cuda::make_cuda_backend({.device = 0, .exact_gemm = true}, &err);
  REQUIRE(gpu != nullptr);
  auto cpu = make_cpu_backend();
  const Dims d{.B = 4, .T = 64, .C = 64, .NH = 4, .V = 64, .max_T = 64};
  const size_t BTC = size_t(d.B) * d.T * d.C;
  const BlockLayout bl = block_layout(d);
  const std::vector<float> p1 = random_floats(bl.total, 11, 0.2f, 0.0f);
  const std::vector<float> p2 = random_floats(bl.total, 12, 0.2f, 0.0f);
  const std::vector<float> x = random_floats(BTC, 13);
  std::vector<float> acts(block_acts_floats(d)), y1(BTC), y2(BTC);
  cpu->block_forward(d, p1.data(), x.data(), carve_block_acts(acts.data(), d), y1.data());
  cpu->block_forward(d, p2.data(), x.data(), carve_block_acts(acts.data(), d), y2.data());

  // One parameter slot reused back to back, as the trainer's slot ring does: the second upload
  // must not overwrite the slot while the first layer's kernels still read it.
  Dev slot(*gpu, bl.total, false), dx(*gpu, x), da(*gpu, block_acts_floats(d), false), dy1(*gpu, BTC, false),
      dy2(*gpu, BTC, false);
  gpu->upload(slot.p, p1.data(), bl.total);
  gpu->block_forward(d, slot.p, dx.p, carve_block_acts(da.p, d), dy1.p);
  gpu->upload(slot.p, p2.data(), bl.total);
  gpu->block_forward(d, slot.p, dx.p, carve_block_acts(da.p, d), dy2.p);
  gpu->synchronize();
  CHECK_CLOSE(dy1.get(), y1, 2e-4);
  CHECK_CLOSE(dy2.get(), y2, 2e-4);
  CHECK(tier::train::cuda::backend_error(*gpu).empty());
}

namespace {

// A whole `tiny` model step, as tier-train runs it: embed, every block, head with loss and
// backward, blocks backward, embed backward; params from the model's own init.
struct ModelPass {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per layer
};

ModelPass model_pass(Backend& be, const ModelConfig& m, const Dims& d,
                     const std::vector<std::vector<float>>& params, const std::vector<int32_t>& tokens,
                     const std::vector<int32_t>& targets) {
  const int L = m.layers;
  const size_t BTC = size_t(d.B) * d.T * d.C, BT = size_t(d.B) * d.T;
  std::vector<Dev*> owned;
  auto dev = [&](size_t n) {
    owned.push_back(new Dev(be, n, true));
    return owned.back()->p;
  };
  auto devv = [&](const std::vector<float>& h) {
    owned.push_back(new Dev(be, h));
    return owned.back()->p;
  };
  int32_t* tok = be.alloc_tokens(BT);
  int32_t* tgt = be.alloc_tokens(BT);
  be.upload_tokens(tok, tokens.data(), BT);
  be.upload_tokens(tgt, targets.data(), BT);
  std::vector<float*> P, G, xs, acts;
  for (int l = 0; l <= L; ++l) {
    P.push_back(devv(params[l]));
    G.push_back(dev(params[l].size()));
    xs.push_back(dev(BTC));
  }
  for (int l = 0; l < L; ++l) acts.push_back(dev(block_acts_floats(d)));
  float* head = dev(head_acts_floats(d));
  float* scratch = dev(block_scratch_floats(d));
  float* dx = dev(BTC);

  be.embed_forward(d, P[0], tok, xs[0]);
  for (int l = 1; l <= L; ++l) be.block_forward(d, P[l], xs[l - 1], carve_block_acts(acts[l - 1], d), xs[l]);
  ModelPass r;
  r.loss =
      be.head_forward(d, P[0], xs[L], tgt, carve_head_acts(head, d), dx, G[0], 1.0f / static_cast<float>(BT));
  for (int l = L; l >= 1; --l)
    be.block_backward(d, P[l], G[l], xs[l - 1], carve_block_acts(acts[l - 1], d), dx, dx, scratch);
  be.embed_backward(d, G[0], tok, dx);
  be.synchronize();
  for (int l = 0; l <= L; ++l) {
    std::vector<float> g(params[l].size());
    be.download(g.data(), G[l], g.size());
    r.grads.push_back(std::move(g));
  }
  for (Dev* p : owned) delete p;
  be.free_tokens(tok);
  be.free_tokens(tgt);
  return r;
}

}  // namespace

TEST_CASE("a whole tiny model step on the CUDA backend matches the CPU backend", "[gpu]") {
  if (!tier::test::have_cuda_device()) return;
  auto m = preset("tiny");
  REQUIRE(m.has_value());
  const Dims d = m->dims(4, m->seq);
  std::vector<std::vector<float>> params;
  for (int l = 0; l < m->num_layers(); ++l) {
    params.emplace_back(m->layer_floats(l));
    init_layer(*m, l, 1234, params.back());
  }
  const size_t BT = size_t(d.B) * d.T;
  std::vector<int32_t> tokens(BT), targets(BT);
  for (size_t i = 0; i < BT; ++i) {
    tokens[i] = static_cast<int32_t>((i * 97 + 13) % d.V);
    targets[i] = static_cast<int32_t>((i * 89 + 7) % d.V);
  }
  auto cpu = make_cpu_backend();
  const ModelPass want = model_pass(*cpu, *m, d, params, tokens, targets);
  for (const Case cs : {Case{true, 2e-4}, Case{false, 3e-2}}) {
    INFO((cs.exact ? "fp32 GEMMs" : "bf16 tensor-core GEMMs"));
    std::string err;
    auto gpu = tier::train::cuda::make_cuda_backend({.device = 0, .exact_gemm = cs.exact}, &err);
    REQUIRE(gpu != nullptr);
    const ModelPass got = model_pass(*gpu, *m, d, params, tokens, targets);
    INFO("backend error: " << tier::train::cuda::backend_error(*gpu));
    CHECK(std::abs(got.loss - want.loss) <= cs.tol * std::abs(want.loss));
    for (size_t l = 0; l < want.grads.size(); ++l) {
      INFO("layer " << l);
      CHECK_CLOSE(got.grads[l], want.grads[l], cs.tol);
    }
  }
}
