// Run under mpirun with 3 ranks by bf16_test.cpp: the bf16 collectives of trainer/comm.hpp
// (all-gather; all-to-all then the fp32 sum in rank order) give exactly the expected bits on
// every rank. Exit status 0 when they do; otherwise 1 and what differed on stderr.
#include <cstdio>
#include <vector>

#include "trainer/bf16.hpp"
#include "trainer/comm.hpp"

using namespace tier::train;

namespace {

tier::Status run(Comm& c, const Comm::Op& proto, std::function<tier::Status(Comm::Request&)> start) {
  Comm::Op op = proto;
  op.start = std::move(start);
  return c.submit(std::move(op)).wait();
}

int check(const char* what, const std::vector<bf16_t>& got, const std::vector<bf16_t>& want, int rank) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      std::fprintf(stderr, "rank %d: %s[%zu] = 0x%04x, want 0x%04x\n", rank, what, i, got[i], want[i]);
      ++bad;
    }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  auto cr = Comm::create(&argc, &argv, /*force_mpi=*/true);
  if (!cr) {
    std::fprintf(stderr, "%s\n", cr.error().to_string().c_str());
    return 1;
  }
  Comm& c = **cr;
  const int R = c.size(), me = c.rank();
  if (R != 3) {
    std::fprintf(stderr, "run me with 3 ranks, not %d\n", R);
    return 1;
  }
  int bad = 0;

  // All-gather: rank r's shard [5] holds bf16(100 r + i).
  const size_t ag = 5;
  std::vector<bf16_t> shard(ag), all(ag * R), want(ag * R);
  for (size_t i = 0; i < ag; ++i)
    shard[i] = bf16_from_f32(static_cast<float>(100 * me + static_cast<int>(i)));
  for (int r = 0; r < R; ++r)
    for (size_t i = 0; i < ag; ++i)
      want[r * ag + i] = bf16_from_f32(static_cast<float>(100 * r + static_cast<int>(i)));
  if (auto s = run(c, {},
                   [&](Comm::Request& q) { return c.start_allgather_bf16(shard.data(), all.data(), ag, q); });
      !s) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  bad += check("allgather", all, want, me);

  // Reduce-scatter of send [R * 3]: element i of the part rank q keeps, from rank r:
  //   i = 0: 1 on rank 0, 2^-8 on the others: 1 + 2^-7 in fp32 (a bf16 accumulator: 1);
  //   i = 1: 2^24, 1, -2^24 on ranks 0, 1, 2: 0 in fp32 in rank order (double or another order: 1);
  //   i = 2: q + r + 1/8: exact.
  const size_t n = 3;
  std::vector<bf16_t> send(n * R), chunks(n * R), out(n);
  for (int q = 0; q < R; ++q) {
    send[q * n + 0] = me == 0 ? 0x3f80 : 0x3b80;
    send[q * n + 1] = me == 0 ? 0x4b80 : me == 1 ? 0x3f80 : 0xcb80;
    send[q * n + 2] = bf16_from_f32(static_cast<float>(q + me) + 0.125f);
  }
  if (auto s = run(c, {},
                   [&](Comm::Request& q) { return c.start_alltoall_bf16(send.data(), chunks.data(), n, q); });
      !s) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  sum_chunks_bf16(chunks.data(), R, n, out.data());
  bad += check("reduce_scatter", out, {0x3f81, 0x0000, bf16_from_f32(3.0f * me + 3.0f + 0.375f)}, me);
  return bad == 0 ? 0 : 1;
}
