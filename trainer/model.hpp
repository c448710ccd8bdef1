// Model shapes of tier-train: presets, explicit shapes, parameter counts and the deterministic
// initialization of each layer's flat parameter buffer (see backend.hpp for the layouts).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tier/status.hpp"
#include "trainer/backend.hpp"

namespace tier::train {

struct ModelConfig {
  std::string name = "custom";
  int layers = 0;   // L transformer blocks
  int dim = 0;      // C
  int heads = 0;    // NH
  int seq = 0;      // max_T: rows of wpe and the default training sequence length
  int vocab = 256;  // V: byte-level by default

  // Layer 0 is embed/head (wte, wpe, lnf); layers 1..L are blocks.
  int num_layers() const { return layers + 1; }
  Dims dims(int B, int T, Attention attention = Attention::kFlash) const {
    return Dims{B, T, dim, heads, vocab, seq, attention};
  }
  size_t layer_floats(int layer) const;
  uint64_t num_params() const;
  // Training FLOPs per token (forward + backward), the usual 6 * N + attention estimate with N
  // the parameters that take part in matrix products: 6 * (12 L C^2 + V C) + 12 L T C.
  double flops_per_token(int T) const;
  std::string describe() const;
};

// "tiny", "small", "124M", "350M", "1.3B", "2.7B", "6.7B", "13B", "175B".
[[nodiscard]] Result<ModelConfig> preset(std::string_view name);
std::vector<std::string> preset_names();
[[nodiscard]] Status validate(const ModelConfig& m);

// Writes layer `layer`'s initial parameters (layer_floats(layer) floats) into `out`: GPT-2
// init, weights N(0, 0.02) (residual projections scaled by 1/sqrt(2L)), biases 0, LayerNorm
// scale 1. Depends only on (seed, layer), so every rank count produces the same model.
void init_layer(const ModelConfig& m, int layer, uint64_t seed, std::span<float> out);

// Per-element weight decay mask of a layer: true where AdamW decays (matrices and embeddings),
// false for biases and LayerNorm parameters. As ranges [begin, end) in floats.
struct Range {
  size_t begin, end;
  bool decay;
};
std::vector<Range> decay_ranges(const ModelConfig& m, int layer);

// Deterministic random numbers: splitmix64 stream, Box-Muller normals.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1)
  float normal();

 private:
  uint64_t s_;
  bool have_spare_ = false;
  float spare_ = 0;
};
uint64_t mix_seed(uint64_t a, uint64_t b);

}  // namespace tier::train
