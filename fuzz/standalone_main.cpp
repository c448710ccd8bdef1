// A libFuzzer-compatible driver for builds without libFuzzer (the normal GCC build), so ctest
// exercises every fuzz target: it runs LLVMFuzzerTestOneInput over every corpus file, then over
// random mutations of them until a time or run budget is spent.
//
//   fuzz_X [--seconds S] [--runs N] [--seed K] [--max-len L] CORPUS_DIR_OR_FILE...
//
// A crash (signal) writes the input being run to ./crash-<target>-<pid> before the process dies,
// so it can be replayed: `fuzz_X crash-...` (a file argument runs just that file).
// The mutations are simple (bit flips, byte overwrites, inserts, deletes, truncation, splices
// of two corpus entries, integer boundary values): no coverage feedback, which is what the
// clang build (tools/fuzz) adds.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

// The input being run, for the crash handler. Written only by the main thread between runs.
const uint8_t* g_current = nullptr;
size_t g_current_size = 0;
char g_crash_path[256] = "crash-input";

extern "C" void on_crash(int sig) {
  int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    if (g_current_size > 0 && ::write(fd, g_current, g_current_size) < 0) {}
    ::close(fd);
  }
  static const char msg[] = "standalone fuzz driver: crash; input saved to ";
  if (::write(2, msg, sizeof msg - 1) < 0 || ::write(2, g_crash_path, std::strlen(g_crash_path)) < 0 ||
      ::write(2, "\n", 1) < 0) {}
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void run_one(const std::vector<uint8_t>& in) {
  g_current = in.data();
  g_current_size = in.size();
  LLVMFuzzerTestOneInput(in.empty() ? nullptr : in.data(), in.size());
  g_current = nullptr;
  g_current_size = 0;
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void mutate(std::vector<uint8_t>& v, const std::vector<std::vector<uint8_t>>& corpus, std::mt19937_64& rng,
            size_t max_len) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : size_t(rng() % n); };
  int steps = 1 + int(rng() % 4);
  for (int s = 0; s < steps; ++s) {
    switch (rng() % 8) {
      case 0:  // flip a bit
        if (!v.empty()) v[pick(v.size())] ^= uint8_t(1u << (rng() % 8));
        break;
      case 1:  // overwrite a byte
        if (!v.empty()) v[pick(v.size())] = uint8_t(rng());
        break;
      case 2: {  // insert random bytes
        size_t n = 1 + pick(8);
        std::vector<uint8_t> ins(n);
        for (auto& b : ins) b = uint8_t(rng());
        v.insert(v.begin() + long(pick(v.size() + 1)), ins.begin(), ins.end());
        break;
      }
      case 3:  // erase a range
        if (!v.empty()) {
          size_t at = pick(v.size());
          size_t n = 1 + pick(std::min<size_t>(16, v.size() - at));
          v.erase(v.begin() + long(at), v.begin() + long(std::min(v.size(), at + n)));
        }
        break;
      case 4:  // truncate
        if (!v.empty()) v.resize(pick(v.size()));
        break;
      case 5: {  // splice the tail of another corpus entry
        if (corpus.empty()) break;
        const auto& o = corpus[pick(corpus.size())];
        if (o.empty()) break;
        size_t from = pick(o.size());
        v.resize(pick(v.size() + 1));
        v.insert(v.end(), o.begin() + long(from), o.end());
        break;
      }
      case 6: {  // an interesting 32-bit value (lengths and counts live in u32 fields)
        static const uint32_t vals[] = {0,       1,          0x7f,        0x80,        0xff, 0x100, 0xffff,
                                        0x10000, 0x7fffffff, 0x80000000u, 0xffffffffu, 4096, 4097,  65536};
        if (v.size() >= 4) {
          uint32_t x = vals[pick(sizeof vals / sizeof vals[0])];
          std::memcpy(v.data() + pick(v.size() - 3), &x, 4);
        }
        break;
      }
      case 7:  // duplicate a range (repeated records / messages)
        if (!v.empty() && v.size() < max_len) {
          size_t at = pick(v.size());
          size_t n = 1 + pick(std::min<size_t>(64, v.size() - at));
          std::vector<uint8_t> dup(v.begin() + long(at), v.begin() + long(at + n));
          v.insert(v.begin() + long(pick(v.size() + 1)), dup.begin(), dup.end());
        }
        break;
    }
  }
  if (v.size() > max_len) v.resize(max_len);
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  double seconds = 5;
  uint64_t runs = 100000;
  uint64_t seed = std::random_device{}();
  size_t max_len = 64 * 1024;
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seconds") seconds = std::stod(next());
    else if (a == "--runs") runs = std::stoull(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--max-len") max_len = std::stoull(next());
    else if (a.rfind("-", 0) == 0) {
      std::fprintf(stderr, "ignoring libFuzzer flag %s\n", a.c_str());
    } else inputs.emplace_back(a);
  }
  std::string name = std::filesystem::path(argv[0]).filename().string();
  std::snprintf(g_crash_path, sizeof g_crash_path, "crash-%s-%d", name.c_str(), int(::getpid()));
  for (int sig : {SIGSEGV, SIGABRT, SIGILL, SIGFPE, SIGBUS}) ::signal(sig, on_crash);

  std::vector<std::vector<uint8_t>> corpus;
  bool only_files = !inputs.empty();
  for (const auto& p : inputs) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      only_files = false;
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p, ec))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) corpus.push_back(read_bytes(f));
    } else if (std::filesystem::is_regular_file(p, ec)) {
      corpus.push_back(read_bytes(p));
    } else {
      std::fprintf(stderr, "%s: no such corpus file or directory\n", p.c_str());
      return 2;
    }
  }
  for (const auto& c : corpus) run_one(c);
  uint64_t done = corpus.size();
  if (only_files) {
    std::printf("%s: ran %llu input file(s)\n", name.c_str(), (unsigned long long)done);
    return 0;
  }
  run_one({});
  std::mt19937_64 rng(seed);
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<uint8_t> buf;
  while (done < runs && std::chrono::steady_clock::now() < deadline) {
    if (!corpus.empty() && rng() % 8 != 0) {
      buf = corpus[rng() % corpus.size()];
    } else {
      buf.resize(rng() % 256);
      for (auto& b : buf) b = uint8_t(rng());
    }
    mutate(buf, corpus, rng, max_len);
    run_one(buf);
    ++done;
  }
  std::printf("%s: %zu corpus inputs, %llu runs, seed %llu, no crash\n", name.c_str(), corpus.size(),
              (unsigned long long)done, (unsigned long long)seed);
  return 0;
}
