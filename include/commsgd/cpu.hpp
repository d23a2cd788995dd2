// What the CPU running this process can do, for the kernels that choose a vector path at run time (the
// 16-bit conversions, the block codes, the chunked selection): read once with CPUID, so one build serves the
// baseline x86-64 and the CPUs with AVX2 alike. Elsewhere (another architecture, another compiler, nvcc)
// COMMSGD_X86_DISPATCH is 0 and every feature reads false.
#pragma once

#if !defined(__CUDACC__) && (defined(__x86_64__) || defined(__i386__)) &&                                    \
    (defined(__GNUC__) || defined(__clang__))
#define COMMSGD_X86_DISPATCH 1
#include <cpuid.h>
#else
#define COMMSGD_X86_DISPATCH 0
#endif

namespace commsgd::inline v1 {

struct cpu_features {
  bool avx2 = false;   // AVX2, with the OS saving the YMM registers
  bool f16c = false;   // the float <-> fp16 conversions
  bool popcnt = false; // one instruction for a word's population
  bool fma = false;    // fused multiply-add on YMM registers (FMA3)
};

inline const cpu_features& cpu() noexcept {
  static const cpu_features f = [] {
    cpu_features r;
#if COMMSGD_X86_DISPATCH
    // CPUID rather than __builtin_cpu_supports, which some Clang versions refuse "f16c" in: AVX and OSXSAVE
    // in leaf 1, the OS saving the YMM state in XCR0, AVX2 in leaf 7.
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return r;
    r.popcnt = (c & (1u << 23)) != 0;
    const bool avx = (c & (1u << 28)) != 0 && (c & (1u << 27)) != 0;
    const bool f16c = (c & (1u << 29)) != 0;
    const bool fma = (c & (1u << 12)) != 0;
    if (!avx) return r;
    unsigned xcr0 = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0 & 6u) != 6u) return r;
    r.f16c = f16c;
    r.fma = fma;
    r.avx2 = __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (b & (1u << 5)) != 0;
#endif
    return r;
  }();
  return f;
}

} // namespace commsgd::inline v1
