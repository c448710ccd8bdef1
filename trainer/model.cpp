#include "trainer/model.hpp"
#include "wire/errors.hpp"

#include <cmath>
#include <fmt/format.h>

namespace tier::train {

uint64_t mix_seed(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

float Rng::normal() {
  if (have_spare_) {
    have_spare_ = false;
    return spare_;
  }
  double u1 = uniform(), u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  const double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
  spare_ = static_cast<float>(r * std::sin(th));
  have_spare_ = true;
  return static_cast<float>(r * std::cos(th));
}

size_t ModelConfig::layer_floats(int layer) const {
  const Dims d = dims(1, seq);
  return layer == 0 ? embed_layout(d).total : block_layout(d).total;
}

uint64_t ModelConfig::num_params() const {
  uint64_t n = layer_floats(0);
  if (layers > 0) n += static_cast<uint64_t>(layers) * layer_floats(1);
  return n;
}

double ModelConfig::flops_per_token(int T) const {
  const double C = dim, L = layers;
  return 6.0 * (12.0 * L * C * C + static_cast<double>(vocab) * C) + 12.0 * L * T * C;
}

std::string ModelConfig::describe() const {
  return fmt::format("{} (L={} C={} NH={} T={} V={}, {:.2f}M params)", name, layers, dim, heads, seq, vocab,
                     static_cast<double>(num_params()) / 1e6);
}

namespace {
struct Preset {
  const char* name;
  int L, C, NH, T;
};
// GPT-2 (124M, 350M) and GPT-3 (1.3B .. 175B) shapes; tiny and small are for tests and demo.
constexpr Preset kPresets[] = {
    {"tiny", 2, 32, 4, 16},       {"small", 4, 128, 4, 64},     {"124M", 12, 768, 12, 1024},
    {"350M", 24, 1024, 16, 1024}, {"1.3B", 24, 2048, 16, 2048}, {"2.7B", 32, 2560, 32, 2048},
    {"6.7B", 32, 4096, 32, 2048}, {"13B", 40, 5120, 40, 2048},  {"175B", 96, 12288, 96, 2048},
};
}  // namespace

Result<ModelConfig> preset(std::string_view name) {
  for (const auto& p : kPresets) {
    if (name == p.name) {
      ModelConfig m;
      m.name = p.name;
      m.layers = p.L;
      m.dim = p.C;
      m.heads = p.NH;
      m.seq = p.T;
      return m;
    }
  }
  return fail(Code::kInvalidArgument, fmt::format("unknown model preset '{}'", name));
}

std::vector<std::string> preset_names() {
  std::vector<std::string> v;
  for (const auto& p : kPresets) v.emplace_back(p.name);
  return v;
}

Status validate(const ModelConfig& m) {
  if (m.layers < 1 || m.dim < 1 || m.heads < 1 || m.seq < 1 || m.vocab < 2)
    return {Code::kInvalidArgument, "layers, dim, heads, seq must be >= 1 and vocab >= 2"};
  if (m.dim % m.heads != 0)
    return {Code::kInvalidArgument, fmt::format("dim {} is not a multiple of heads {}", m.dim, m.heads)};
  return {};
}

void init_layer(const ModelConfig& m, int layer, uint64_t seed, std::span<float> out) {
  Rng rng(mix_seed(seed, 1000003ull + static_cast<uint64_t>(layer)));
  const Dims d = m.dims(1, m.seq);
  auto normal = [&](size_t off, size_t n, float stdv) {
    for (size_t i = 0; i < n; ++i) out[off + i] = rng.normal() * stdv;
  };
  auto fill = [&](size_t off, size_t n, float v) {
    for (size_t i = 0; i < n; ++i) out[off + i] = v;
  };
  const size_t C = static_cast<size_t>(m.dim);
  if (layer == 0) {
    const EmbedLayout l = embed_layout(d);
    normal(l.wte, static_cast<size_t>(m.vocab) * C, 0.02f);
    normal(l.wpe, static_cast<size_t>(m.seq) * C, 0.01f);
    fill(l.lnf_w, C, 1.0f);
    fill(l.lnf_b, C, 0.0f);
    return;
  }
  const BlockLayout l = block_layout(d);
  const float resid = 0.02f / std::sqrt(2.0f * static_cast<float>(m.layers));
  fill(l.ln1_w, C, 1.0f);
  fill(l.ln1_b, C, 0.0f);
  normal(l.qkv_w, 3 * C * C, 0.02f);
  fill(l.qkv_b, 3 * C, 0.0f);
  normal(l.proj_w, C * C, resid);
  fill(l.proj_b, C, 0.0f);
  fill(l.ln2_w, C, 1.0f);
  fill(l.ln2_b, C, 0.0f);
  normal(l.fc_w, 4 * C * C, 0.02f);
  fill(l.fc_b, 4 * C, 0.0f);
  normal(l.fcproj_w, 4 * C * C, resid);
  fill(l.fcproj_b, C, 0.0f);
}

std::vector<Range> decay_ranges(const ModelConfig& m, int layer) {
  const Dims d = m.dims(1, m.seq);
  if (layer == 0) {
    const EmbedLayout l = embed_layout(d);
    return {{l.wte, l.lnf_w, true}, {l.lnf_w, l.total, false}};
  }
  const BlockLayout l = block_layout(d);
  return {{l.ln1_w, l.qkv_w, false},   {l.qkv_w, l.qkv_b, true},       {l.qkv_b, l.proj_w, false},
          {l.proj_w, l.proj_b, true},  {l.proj_b, l.fc_w, false},      {l.fc_w, l.fc_b, true},
          {l.fc_b, l.fcproj_w, false}, {l.fcproj_w, l.fcproj_b, true}, {l.fcproj_b, l.total, false}};
}

}  // namespace tier::train
