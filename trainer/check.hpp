// Check macros for tier-train internals: a failed check prints file, line and the condition
// and aborts the trainer process. Used for invariants and for CLI-level fatal errors in the
// tier-train binary only; library-facing code returns tier::Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define TT_CHECK(cond, ...)                                                                     \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "tier-train: %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                        \
      std::fputc('\n', stderr);                                                                 \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

// Checks a tier::Status / tier::Result and prints its message on failure.
#define TT_CHECK_OK(expr, what)                                                            \
  do {                                                                                     \
    auto&& tt_res_ = (expr);                                                               \
    if (!tt_res_) {                                                                        \
      std::fprintf(stderr, "tier-train: %s:%d: %s failed: %s\n", __FILE__, __LINE__, what, \
                   ::tier::train::status_text(tt_res_).c_str());                           \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

#include <string>
#include "tier/status.hpp"
namespace tier::train {
inline std::string status_text(const ::tier::Status& s) { return s.to_string(); }
template <class T> std::string status_text(const ::tier::Result<T>& r) {
  return r ? "OK" : r.error().to_string();
}
}  // namespace tier::train
