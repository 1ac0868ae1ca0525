// DCP index math shared by the CPU implementations and the CUDA kernels.
//
// Built for both: under nvcc the functions are __host__ __device__, under a plain C++
// compiler DSA_HD vanishes. Every CPU/CUDA pair includes this header, so the two
// implementations cannot drift (docs/ops.md section 1).
//
// Symbols: W = DCP world size, r = rank, I = interleave, BS = block size.
// Position p lives on rank (p / I) % W. The general (multiply-high) divisions take
// positions in [0, 2^31); the power-of-two forms (shifts and masks) are exact for any 32-bit
// value, which token_slot<true> relies on for negative tokens.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#define DSA_UNROLL _Pragma("unroll")
#else
#define DSA_HD inline
#define DSA_UNROLL  // a loop the device code unrolls; the host compiler chooses
#endif

namespace dsa {

// ---------------------------------------------------------------------------------------
// Fast unsigned division by a run-time constant
// ---------------------------------------------------------------------------------------

/*!
 * \brief Division of n in [0, 2^31) by a fixed divisor d in [1, 2^31), by a multiply-high
 *        and a shift (Granlund-Montgomery), identical on host and device.
 * \note  NOTES: the sum mulhi(n, m) + n fits 32 bits only because n < 2^31; callers
 *        guarantee that (token positions are non-negative int32).
 */
struct FastDiv {
  uint32_t d = 1, m = 0, l = 0;

  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    while ((1ull << l) < d) ++l;
    // m = floor(2^32 * (2^l - d) / d) + 1; fits 32 bits for d <= 2^31.
    m = static_cast<uint32_t>(((1ull << 32) * ((1ull << l) - d)) / d + 1);
  }

  //! d is a power of two: then d == 2^l, and div<true> / mod<true> are a shift and a mask.
  DSA_HD bool pow2() const { return (d & (d - 1)) == 0; }

  //! n / d. kPow2 (the caller checked pow2()): a shift, exact for any 32-bit n.
  template <bool kPow2 = false>
  DSA_HD uint32_t div(uint32_t n) const {
    if constexpr (kPow2) {
      return n >> l;
    } else {
#if defined(__CUDA_ARCH__)
      const uint32_t hi = __umulhi(n, m);
#else
      const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
#endif
      return (hi + n) >> l;
    }
  }
  template <bool kPow2 = false>
  DSA_HD uint32_t mod(uint32_t n) const {
    if constexpr (kPow2) {
      return n & (d - 1);
    } else {
      return n - div(n) * d;
    }
  }
};

// ---------------------------------------------------------------------------------------
// Ownership of positions under decode context parallelism
// ---------------------------------------------------------------------------------------

//! Where a global position lives: its owner rank and its position in that rank's shard.
struct DcpPosition {
  int32_t owner, local;
};

/*!
 * \brief The divisors of one DCP layout, prepared once on the host.
 * \param world      W >= 1
 * \param interleave I >= 1, with W * I < 2^31
 */
struct DcpLayout {
  int32_t world = 1, interleave = 1;
  FastDiv by_interleave, by_world;

  DcpLayout() = default;
  DcpLayout(int32_t w, int32_t i)
      : world(w), interleave(i), by_interleave(static_cast<uint32_t>(i)),
        by_world(static_cast<uint32_t>(w)) {}

  //! W and I are powers of two (locate<true> may be used).
  DSA_HD bool pow2() const { return by_interleave.pow2() && by_world.pow2(); }

  /*!
   * \brief owner = (p / I) % W and local = (p / (W*I)) * I + p % I, with two divisions:
   *        p / (W*I) is (p / I) / W for non-negative p. kPow2: pow2() holds (shifts and
   *        masks).
   */
  template <bool kPow2 = false>
  DSA_HD DcpPosition locate(int32_t p) const {
    const uint32_t up = static_cast<uint32_t>(p);
    const uint32_t group = by_interleave.div<kPow2>(up);
    const uint32_t within =
        kPow2 ? by_interleave.mod<true>(up) : up - group * static_cast<uint32_t>(interleave);
    const uint32_t cycle = by_world.div<kPow2>(group);
    const uint32_t owner =
        kPow2 ? by_world.mod<true>(group) : group - cycle * static_cast<uint32_t>(world);
    return {static_cast<int32_t>(owner),
            static_cast<int32_t>(cycle * static_cast<uint32_t>(interleave) + within)};
  }
  //! Global position of local position q on rank r: (q / I) * (W*I) + r*I + q % I.
  DSA_HD int64_t global(int32_t q, int32_t rank) const {
    const uint32_t uq = static_cast<uint32_t>(q);
    const uint32_t group = by_interleave.div(uq);
    return static_cast<int64_t>(group) * world * interleave +
           static_cast<int64_t>(rank) * interleave + (uq - group * interleave);
  }
};

/*!
 * \brief Number of positions in [0, L) owned by rank r (the rank-local length of L).
 * \note  Plain integer arithmetic (no FastDiv): L may be any int64; a length <= 0 owns
 *        no position (lengths are data: a negative one must still give a defined 0).
 */
DSA_HD int64_t dcp_local_length(int64_t L, int64_t rank, int64_t world, int64_t interleave) {
  if (L <= 0) return 0;
  const int64_t base = (L / (interleave * world)) * interleave;
  const int64_t rem = L - base * world - rank * interleave;
  return base + (rem < 0 ? 0 : (rem > interleave ? interleave : rem));
}

}  // namespace dsa
