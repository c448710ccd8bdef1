// Optimizer, schedule, data and --plan arithmetic of tier-train.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "trainer/bf16.hpp"
#include "trainer/data.hpp"
#include "trainer/model.hpp"
#include "trainer/optimizer.hpp"
#include "trainer/plan.hpp"
#include "trainer/trainer.hpp"
#include "trainer/trainer.hpp"

using namespace tier::train;

TEST_CASE("AdamW: one step by hand", "[trainer][optimizer]") {
  AdamWConfig c;
  c.weight_decay = 0.1f;
  const AdamWStep st = make_step(c, 0.1f, 1, 1.0f);
  float p = 1, m = 0, v = 0, g = 0.5f;
  adamw_update(&p, &m, &v, &g, &p, &m, &v, 1, st, true);
  // m = 0.05, v = 0.0125 (beta2 0.95); mhat = 0.5, vhat = 0.25; p = 1 - 0.1 * (1 + 0.1 * 1).
  CHECK(m == Approx(0.05f));
  CHECK(v == Approx(0.0125f));
  CHECK(p == Approx(0.89f).epsilon(1e-6));
  float q = 1, mq = 0, vq = 0;
  adamw_update(&q, &mq, &vq, &g, &q, &mq, &vq, 1, st, false);
  CHECK(q == Approx(0.9f).epsilon(1e-6));  // no decay on biases and LayerNorm
}

TEST_CASE("AdamW: the vectorized, threaded update is bit-identical to the scalar loop at any offset",
          "[trainer][optimizer]") {
  const size_t n = 100003;
  Rng r(5);
  std::vector<float> p(n), m(n), v(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = r.normal();
    m[i] = r.normal() * 1e-2f;
    v[i] = std::fabs(r.normal()) * 1e-4f;
    g[i] = r.normal();
  }
  const AdamWStep st = make_step(AdamWConfig{}, 1e-3f, 7, 0.37f);
  for (size_t off : {size_t{0}, size_t{1}, size_t{3}, size_t{17}}) {
    std::vector<float> p1(n), m1(n), v1(n), p2(n), m2(n), v2(n);
    adamw_update(p.data() + off, m.data() + off, v.data() + off, g.data() + off, p1.data(), m1.data(),
                 v1.data(), n - off, st, true);
    adamw_update_scalar(p.data() + off, m.data() + off, v.data() + off, g.data() + off, p2.data(), m2.data(),
                        v2.data(), n - off, st, true);
    INFO("offset " << off << " isa " << adamw_isa());
    CHECK(std::memcmp(p1.data(), p2.data(), (n - off) * 4) == 0);
    CHECK(std::memcmp(m1.data(), m2.data(), (n - off) * 4) == 0);
    CHECK(std::memcmp(v1.data(), v2.data(), (n - off) * 4) == 0);
  }
}

namespace {

// A shard past the streaming threshold (64-byte aligned vectors: the streaming stores' case).
struct BigShard {
  static constexpr size_t n = (size_t{1} << 20) + 37;  // a remainder after the last vector
  std::vector<float> p, m, v, g;
  BigShard() : p(n), m(n), v(n), g(n) {
    Rng r(11);
    for (size_t i = 0; i < n; ++i) {
      p[i] = r.normal();
      m[i] = r.normal() * 1e-2f;
      v[i] = std::fabs(r.normal()) * 1e-4f;
      g[i] = r.normal();
    }
    // Lanes whose new weight is not finite, so the bf16 rounding's NaN and overflow cases run.
    p[5] = std::numeric_limits<float>::quiet_NaN();
    p[6] = std::numeric_limits<float>::infinity();
    p[7] = 3.4e38f;
    g[8] = std::numeric_limits<float>::quiet_NaN();
  }
};

// n elements at a 64-byte aligned address (std::vector's are 16-byte aligned at most).
template <class T> struct Aligned {
  std::vector<T> buf;
  T* data_;
  size_t n;
  explicit Aligned(size_t count) : buf(count + 64 / sizeof(T)), n(count) {
    const auto a = reinterpret_cast<uintptr_t>(buf.data());
    data_ = buf.data() + (64 - a % 64) % 64 / sizeof(T);
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return n; }
};

template <class A, class B> bool same_bits(const A& a, const B& b) {
  using T = std::remove_cvref_t<decltype(*a.data())>;
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("AdamW: a large out-of-place update (streaming stores) and its copy match the scalar loop",
          "[trainer][optimizer]") {
  BigShard s;
  const size_t n = BigShard::n;
  const AdamWStep st = make_step(AdamWConfig{}, 1e-3f, 3, 0.5f);
  Aligned<float> p1(n), m1(n), v1(n), copy(n);
  std::vector<float> p2(n), m2(n), v2(n);
  adamw_update(s.p.data(), s.m.data(), s.v.data(), s.g.data(), p1.data(), m1.data(), v1.data(), n, st, true,
               copy.data());
  adamw_update_scalar(s.p.data(), s.m.data(), s.v.data(), s.g.data(), p2.data(), m2.data(), v2.data(), n, st,
                      true);
  INFO("isa " << adamw_isa());
  CHECK(same_bits(p1, p2));
  CHECK(same_bits(m1, m2));
  CHECK(same_bits(v1, v2));
  CHECK(same_bits(copy, p2));
  // In place (no streaming) gives the same bits as well.
  adamw_update(s.p.data(), s.m.data(), s.v.data(), s.g.data(), s.p.data(), s.m.data(), s.v.data(), n, st,
               true);
  CHECK(same_bits(s.p, p2));
  CHECK(same_bits(s.m, m2));
  CHECK(same_bits(s.v, v2));
}

TEST_CASE("AdamW bf16: a large update (streaming stores) matches the fp32 loop on the widened gradient",
          "[trainer][optimizer][bf16]") {
  BigShard s;
  const size_t n = BigShard::n;
  std::vector<bf16_t> g16(n);
  std::vector<float> gw(n);
  for (size_t i = 0; i < n; ++i) {
    g16[i] = bf16_from_f32(s.g[i]);
    gw[i] = bf16_to_f32(g16[i]);
  }
  const AdamWStep st = make_step(AdamWConfig{}, 1e-3f, 2, 1.0f);
  for (size_t off : {size_t{0}, size_t{5}}) {  // inputs at any offset; the outputs are aligned
    const size_t k = n - off;
    Aligned<float> p1(k), m1(k), v1(k);
    Aligned<bf16_t> w1(k);
    std::vector<float> p2(k), m2(k), v2(k);
    std::vector<bf16_t> w2(k);
    adamw_update_bf16(s.p.data() + off, s.m.data() + off, s.v.data() + off, g16.data() + off, p1.data(),
                      m1.data(), v1.data(), w1.data(), k, st, true);
    adamw_update_scalar(s.p.data() + off, s.m.data() + off, s.v.data() + off, gw.data() + off, p2.data(),
                        m2.data(), v2.data(), k, st, true);
    for (size_t i = 0; i < k; ++i) w2[i] = bf16_from_f32(p2[i]);
    INFO("offset " << off << " isa " << adamw_isa());
    CHECK(same_bits(p1, p2));
    CHECK(same_bits(m1, m2));
    CHECK(same_bits(v1, v2));
    CHECK(same_bits(w1, w2));
  }
}

TEST_CASE("learning-rate schedule: linear warmup then cosine to 10%", "[trainer][optimizer]") {
  CHECK(lr_at(1.0f, 5, 10, 100) == Approx(0.5f));
  CHECK(lr_at(1.0f, 10, 10, 100) == Approx(1.0f));
  CHECK(lr_at(1.0f, 55, 10, 100) == Approx(0.55f));
  CHECK(lr_at(1.0f, 100, 10, 100) == Approx(0.1f));
}

TEST_CASE("default warmup: a tenth of the run, at least min(100, half of it)", "[trainer][optimizer]") {
  CHECK(default_warmup(1) == 1);
  CHECK(default_warmup(2) == 1);
  CHECK(default_warmup(12) == 6);
  CHECK(default_warmup(20) == 10);
  CHECK(default_warmup(500) == 100);
  CHECK(default_warmup(5000) == 500);
}

TEST_CASE("batches do not depend on how the global batch is split", "[trainer][data]") {
  auto d = Dataset::load("", 16);
  REQUIRE(d.has_value());
  std::vector<int32_t> all(8 * 16), allt(8 * 16), half(4 * 16), halft(4 * 16);
  d->train_batch(9, 4, 0, 8, 16, all.data(), allt.data());
  d->train_batch(9, 4, 4, 4, 16, half.data(), halft.data());
  CHECK(std::equal(half.begin(), half.end(), all.begin() + 4 * 16));
  CHECK(std::equal(halft.begin(), halft.end(), allt.begin() + 4 * 16));
  for (int i = 0; i + 1 < 16; ++i) CHECK(all[i + 1] == allt[i]);  // targets are shifted tokens
  CHECK_FALSE(Dataset::load("/nonexistent/file", 16).has_value());
}

TEST_CASE("model presets have the published parameter counts", "[trainer][model]") {
  auto m = preset("124M");
  REQUIRE(m.has_value());
  m->vocab = 50257;
  // GPT-2 small: 124.4M with a 50257 vocabulary and 1024 positions.
  CHECK(m->num_params() == 124439808ull);
  auto g3 = preset("175B");
  REQUIRE(g3.has_value());
  CHECK(g3->num_params() / 1e9 == Approx(174.0).epsilon(0.01));
  CHECK_FALSE(preset("nope").has_value());
}

TEST_CASE("plan arithmetic (--plan) matches a case computed by hand", "[trainer][plan]") {
  PlanOptions o;
  o.model.name = "hand";
  o.model.layers = 2;
  o.model.dim = 64;
  o.model.heads = 4;
  o.model.seq = 32;
  o.nodes = 2;
  o.gpus_per_node = 4;
  o.micro_batch = 2;
  o.gpu_tflops = 100;
  o.net_gbps = 10;
  o.pcie_gbps = 20;
  o.nvme_gbps = 5;
  o.host_ram = "1G";
  o.ram_frac = 0.5;
  o.host_mem_gbps = 100;
  auto p = make_plan(o);
  REQUIRE(p.has_value());
  // Params: embed 256*64 + 32*64 + 2*64 = 18560; block 12*64^2 + 13*64 = 49984; total 118528.
  CHECK(p->params == 118528u);
  // 8 ranks: layers padded to multiples of 128 floats. Embed 18560 (145 * 128): shards of 2320
  // floats, 9280 B, charged 12288 (three 4 KiB granules). Block 50048: shards of 6256 floats,
  // 25024 B, charged 28672. Per layer and rank: param, m, v twice (2 buffers) and one grad.
  CHECK(p->mem.geometry.pad == std::vector<size_t>{18560, 50048, 50048});
  CHECK(p->mem.rank.params == 2 * 12288u + 2 * 2 * 28672u);
  CHECK(p->mem.rank.grads == 12288u + 2 * 28672u);
  CHECK(p->mem.rank.moments == 2 * p->mem.rank.params);
  CHECK(p->mem.rank.tensors == 21u);
  CHECK(p->state_rank == Approx(7 * 12288 + 2 * 7 * 28672));
  // A node: 4 ranks and the commit marker (32 bytes, one granule).
  CHECK(p->mem.node.marker == 4096u);
  CHECK(p->state_node == Approx(4 * 487424 + 4096));
  CHECK(p->state_total == Approx(2 * (4 * 487424 + 4096)));
  CHECK(p->nvme_node == 0.0);
  // FLOPs per token 6*(12*2*64^2 + 256*64) + 12*2*32*64 = 737280; 64 tokens per GPU; no
  // checkpointing, so no recompute.
  CHECK(p->model_flops_gpu == Approx(737280.0 * 64));
  CHECK(p->compute_s == Approx(737280.0 * 64 / 100e12));
  // Collectives: 3 * 4 bytes (fp32) * 118528 * 7/8 over 10 GB/s.
  CHECK(p->net_s == Approx(3.0 * 4 * 118528 * 7 / 8 / 10e9));
  CHECK(p->pcie_s == Approx(3.0 * 4 * 118528 / 8 / 20e9));
  CHECK(p->optimizer_s == Approx(28.0 * 118528 / 2 / 100e9));
  CHECK(p->bound == "network");
  CHECK(p->step_s == Approx(p->net_s));
  CHECK(p->tflops_gpu == Approx(737280.0 * 64 / p->net_s / 1e12));
  CHECK(p->fits);

  SECTION("state beyond RAM spills to NVMe and is streamed every step") {
    o.host_ram = "1M";
    auto q = make_plan(o);
    REQUIRE(q.has_value());
    const double ram = 0.5 * (1 << 20), node = 4 * 487424 + 4096;
    CHECK(q->ram_node == Approx(ram));
    CHECK(q->nvme_node == Approx(node - ram));
    CHECK(q->nvme_s == Approx(2 * (node - ram) / 5e9));
  }
  SECTION("checkpointing recomputes the forward; offloaded checkpoints are pool tensors") {
    o.checkpointing = true;
    o.offload_checkpoints = true;
    auto q = make_plan(o);
    REQUIRE(q.has_value());
    CHECK(q->compute_s == Approx(737280.0 * 64 * 8 / 6 / 100e12));
    // One [B=2, T=32, C=64] fp32 input per block: 16384 bytes, 4 granules, two blocks.
    CHECK(q->mem.rank.checkpoints == 2 * 16384u);
    CHECK(q->state_node == Approx(4 * (487424 + 32768) + 4096));
    // A block's activations once instead of L times.
    CHECK(q->mem.device.activations * 2 == p->mem.device.activations);
    // The device figure is what the trainer allocates (activation_floats), plus tokens and
    // targets [B,T] int32 and the parameter and gradient buffers.
    const DeviceBytes& dv = q->mem.device;
    const Dims d = o.model.dims(2, 32);
    CHECK(dv.checkpoints + dv.activations + dv.head + dv.scratch - 2 * 2 * 32 * 4 ==
          activation_floats(d, 2, true, true) * sizeof(float));
  }
  SECTION("offloaded checkpoints without checkpointing are refused") {
    o.offload_checkpoints = true;
    CHECK_FALSE(make_plan(o).has_value());
  }
}

TEST_CASE("plan of the device pipeline: bf16 gathered layers without an fp32 copy", "[trainer][plan]") {
  MemoryConfig c;
  c.model.name = "hand";
  c.model.layers = 2;
  c.model.dim = 64;
  c.model.heads = 4;
  c.model.seq = 32;
  c.ranks = 8;
  c.ranks_per_node = 4;
  c.micro_batch = 2;
  c.prefetch = 1;
  c.device_pipeline = true;
  c.precision = Precision::kFp32;
  auto f = memory_model(c);
  c.precision = Precision::kBf16;
  auto h = memory_model(c);
  c.device_pipeline = false;
  auto host = memory_model(c);
  REQUIRE(f.has_value());
  REQUIRE(h.has_value());
  REQUIRE(host.has_value());
  // Padded layers {18560, 50048, 50048} over 8 ranks: the largest shard 6256 floats. Two
  // parameter slots of shard + layer: fp32 4 bytes each, bf16 2 (no fp32 copy of the layer).
  const uint64_t slot = 6256 + 50048;
  CHECK(f->device.gathered == 2 * slot * 4);
  CHECK(h->device.gathered == 2 * slot * 2);
  // Gradients: layer 0's fp32, and two slots of an fp32 layer gradient with, fp32, the fp32
  // shard or, bf16, the bf16 layer and shard.
  CHECK(f->device.grads == 18560 * 4 + 2 * (50048 * 4 + 6256 * 4));
  CHECK(h->device.grads == 18560 * 4 + 2 * (50048 * 4 + slot * 2));
  // The backend's bf16 GEMM operand [B*T, 4C], a block's 13 C vectors and layer 0 widened.
  CHECK(h->device.scratch - f->device.scratch == 2 * 32 * 64 * 4 * 2 + 13 * 64 * 4 + 18560 * 4);
  // The host path's fp32 slots and their bf16 staging are larger than the pipeline's bf16 slots.
  CHECK(host->device.gathered == 2 * 50048 * (4 + 2));
  CHECK(h->device.gathered < host->device.gathered / 2);
}

TEST_CASE("activation_floats: checkpointing keeps one block's activations, offload two inputs",
          "[trainer][checkpoint]") {
  const Dims d{2, 16, 32, 4, 256, 16};
  const size_t BTC = 2 * 16 * 32, blk = block_acts_floats(d), L = 6;
  const size_t scratch = std::max(block_scratch_floats(d), BTC);
  // x_0..x_L and dx, L blocks' activations, the head's, the scratch.
  const size_t plain = (L + 2) * BTC + L * blk + head_acts_floats(d) + scratch;
  CHECK(activation_floats(d, L, false) == plain);
  CHECK(activation_floats(d, L, false, true) == plain);  // offload only with checkpointing
  CHECK(activation_floats(d, L, true) == plain - (L - 1) * blk);
  CHECK(activation_floats(d, L, true, true) == plain - (L - 1) * blk - (L - 1) * BTC);
}
