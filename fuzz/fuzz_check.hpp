// What a fuzz target does when a property it checks does not hold: trap, so libFuzzer (or the
// standalone driver) records the input as a crash. Not for use outside fuzz targets.
#pragma once

#include <cstdio>

#define FUZZ_CHECK(cond)                                                                      \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz property failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      __builtin_trap();                                                                       \
    }                                                                                         \
  } while (0)
