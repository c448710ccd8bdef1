// Finite-difference gradient check of every layer kind of the CPU backend (embed, block, head)
// on a tiny shape: the analytic gradients from *_backward must match central differences of
// the forward within a small relative error, for parameters and inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "trainer/cpu/cpu_backend.hpp"
#include "trainer/model.hpp"

using namespace tier::train;

namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.layers = 1;
  m.dim = 16;
  m.heads = 2;
  m.seq = 6;
  m.vocab = 13;
  return m;
}

std::vector<float> randn(size_t n, uint64_t seed, float s = 1.0f) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal() * s;
  return v;
}

// Layer `layer` of m as init_layer(m, layer, init_seed) makes it, plus noise·N(0,1) drawn from
// `noise_seed` (larger weights, non-unit LayerNorm) so that every path carries gradient.
std::vector<float> noisy_layer(const ModelConfig& m, int layer, uint64_t init_seed, float noise,
                               uint64_t noise_seed) {
  std::vector<float> params(m.layer_floats(layer));
  init_layer(m, layer, init_seed, params);
  Rng r(noise_seed);
  for (auto& p : params) p += noise * r.normal();
  return params;
}

// The sum of out[i]·w[i]: a scalar whose gradient with respect to `out` is w.
double weighted_sum(const std::vector<float>& out, const std::vector<float>& w) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

// Compares analytic gradient `ana` of f at `x` against central differences on `count` sampled
// coordinates. f returns a double; x is perturbed in place and restored.
template <class F> void check_grad(const char* what, std::vector<float>& x, const std::vector<float>& ana,
                                   F f, int count = 60, uint64_t seed = 7) {
  Rng r(seed);
  int bad = 0;
  double worst = 0;
  for (int k = 0; k < count; ++k) {
    const size_t i = static_cast<size_t>(r.next() % x.size());
    const float old = x[i];
    const float h = 1e-2f * std::max(1.0f, std::fabs(old));
    x[i] = old + h;
    const double fp = f();
    x[i] = old - h;
    const double fm = f();
    x[i] = old;
    const double num = (fp - fm) / (2.0 * h);
    const double err = std::fabs(num - ana[i]) / std::max(1e-2, std::fabs(num) + std::fabs(ana[i]));
    worst = std::max(worst, err);
    if (err > 2e-2) ++bad;
  }
  INFO(what << ": worst relative error " << worst);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("gradient check: embed layer", "[trainer][gradcheck]") {
  auto be = make_cpu_backend();
  const ModelConfig m = tiny_model();
  const Dims d = m.dims(2, 5);
  std::vector<float> params(m.layer_floats(0));
  init_layer(m, 0, 1, params);
  for (auto& p : params) p += 0.1f;  // make LayerNorm params non-trivial too
  std::vector<int32_t> tok = {1, 5, 5, 12, 0, 3, 3, 7, 1, 5};
  const size_t n = static_cast<size_t>(d.B) * d.T * d.C;
  const auto R = randn(n, 3);
  std::vector<float> out(n);
  auto f = [&] {
    be->embed_forward(d, params.data(), tok.data(), out.data());
    return weighted_sum(out, R);
  };
  std::vector<float> grads(params.size(), 0.0f);
  be->embed_backward(d, grads.data(), tok.data(), R.data());
  const EmbedLayout l = embed_layout(d);
  REQUIRE(grads[l.wte + 5 * d.C] != 0.0f);
  check_grad("embed params", params, grads, f, 200);
}

TEST_CASE("gradient check: transformer block", "[trainer][gradcheck]") {
  auto be = make_cpu_backend();
  const ModelConfig m = tiny_model();
  const Attention att = GENERATE(Attention::kFlash, Attention::kReference);
  INFO((att == Attention::kFlash ? "flash attention" : "reference attention"));
  const Dims d = m.dims(2, 6, att);
  std::vector<float> params = noisy_layer(m, 1, 1, 0.2f, 11);
  const size_t n = static_cast<size_t>(d.B) * d.T * d.C;
  auto x = randn(n, 5);
  const auto R = randn(n, 6);
  std::vector<float> acts(block_acts_floats(d)), y(n), scratch(block_scratch_floats(d));
  auto f = [&] {
    be->block_forward(d, params.data(), x.data(), carve_block_acts(acts.data(), d), y.data());
    return weighted_sum(y, R);
  };
  f();
  std::vector<float> grads(params.size(), 0.0f), dx(n);
  be->block_backward(d, params.data(), grads.data(), x.data(), carve_block_acts(acts.data(), d), R.data(),
                     dx.data(), scratch.data());
  SECTION("parameters") {
    // Sample each tensor of the layout so no kind of weight is skipped.
    const BlockLayout l = block_layout(d);
    const size_t offs[] = {l.ln1_w, l.ln1_b, l.qkv_w, l.qkv_b,    l.proj_w,   l.proj_b, l.ln2_w,
                           l.ln2_b, l.fc_w,  l.fc_b,  l.fcproj_w, l.fcproj_b, l.total};
    for (size_t t = 0; t + 1 < std::size(offs); ++t) {
      std::vector<float> sub(params.begin() + offs[t], params.begin() + offs[t + 1]);
      std::vector<float> gsub(grads.begin() + offs[t], grads.begin() + offs[t + 1]);
      auto fsub = [&] {
        std::copy(sub.begin(), sub.end(), params.begin() + offs[t]);
        return f();
      };
      INFO("tensor " << t);
      check_grad("block tensor", sub, gsub, fsub, 20, 100 + t);
      std::copy(sub.begin(), sub.end(), params.begin() + offs[t]);
    }
  }
  SECTION("input") { check_grad("block dx", x, dx, f, 60); }
  SECTION("dx may alias dy") {
    std::vector<float> g2(params.size(), 0.0f), dd = R;
    f();
    be->block_backward(d, params.data(), g2.data(), x.data(), carve_block_acts(acts.data(), d), dd.data(),
                       dd.data(), scratch.data());
    for (size_t i = 0; i < n; ++i) REQUIRE(dd[i] == Approx(dx[i]).margin(1e-6));
  }
}

TEST_CASE("gradient check: head (final LayerNorm, tied output, cross-entropy)", "[trainer][gradcheck]") {
  auto be = make_cpu_backend();
  const ModelConfig m = tiny_model();
  const Dims d = m.dims(2, 4);
  std::vector<float> params = noisy_layer(m, 0, 2, 0.3f, 12);
  const size_t n = static_cast<size_t>(d.B) * d.T * d.C;
  auto x = randn(n, 8);
  std::vector<int32_t> tgt = {0, 4, 12, 4, 7, 7, 2, 9};
  std::vector<float> acts(head_acts_floats(d));
  const float scale = 1.0f / static_cast<float>(d.B * d.T);
  auto f = [&] {
    return scale * be->head_forward(d, params.data(), x.data(), tgt.data(), carve_head_acts(acts.data(), d),
                                    nullptr, nullptr, 0.0f);
  };
  const double loss0 = f();
  REQUIRE(loss0 > 0.0);
  std::vector<float> grads(params.size(), 0.0f), dx(n);
  const double loss1 =
      scale * be->head_forward(d, params.data(), x.data(), tgt.data(), carve_head_acts(acts.data(), d),
                               dx.data(), grads.data(), scale);
  REQUIRE(loss1 == Approx(loss0).epsilon(1e-6));
  const EmbedLayout l = embed_layout(d);
  // wpe does not take part in the head: its gradient stays exactly zero.
  for (size_t i = l.wpe; i < l.lnf_w; ++i) REQUIRE(grads[i] == 0.0f);
  check_grad("head params", params, grads, f, 200);
  check_grad("head dx", x, dx, f, 60);
}
