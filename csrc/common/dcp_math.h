// DCP index math shared by the CPU implementations and the CUDA kernels.
//
// Built for both: under nvcc the functions are __host__ __device__, under a plain C++
// compiler DSA_HD vanishes. Every CPU/CUDA pair includes this header, so the two
// implementations cannot drift (spec section 1).
//
// Symbols: W = DCP world size, r = rank, I = interleave, BS = block size.
// Position p lives on rank (p / I) % W. All positions handled here are >= 0 and < 2^31.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSA_HD __host__ __device__ __forceinline__
#else
#define DSA_HD inline
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

  DSA_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    uint32_t hi = __umulhi(n, m);
#else
    uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
#endif
    return (hi + n) >> l;
  }
  DSA_HD uint32_t mod(uint32_t n) const { return n - div(n) * d; }
};

// ---------------------------------------------------------------------------------------
// Ownership of positions under decode context parallelism
// ---------------------------------------------------------------------------------------

/*!
 * \brief The divisors of one DCP layout, prepared once on the host.
 * \param world      W >= 1
 * \param interleave I >= 1
 */
struct DcpLayout {
  int32_t world = 1, interleave = 1;
  FastDiv by_interleave, by_world, by_group;  // group = W * I positions

  DcpLayout() = default;
  DcpLayout(int32_t w, int32_t i)
      : world(w), interleave(i), by_interleave(static_cast<uint32_t>(i)),
        by_world(static_cast<uint32_t>(w)),
        by_group(static_cast<uint32_t>(static_cast<int64_t>(w) * i)) {}

  //! Rank that owns position p: (p / I) % W.
  DSA_HD int32_t owner(int32_t p) const {
    return static_cast<int32_t>(by_world.mod(by_interleave.div(static_cast<uint32_t>(p))));
  }
  //! Position of p inside its owner's shard: (p / (W*I)) * I + p % I.
  DSA_HD int32_t local(int32_t p) const {
    uint32_t up = static_cast<uint32_t>(p);
    return static_cast<int32_t>(by_group.div(up) * static_cast<uint32_t>(interleave) +
                                by_interleave.mod(up));
  }
  //! Global position of local position q on rank r: (q / I) * (W*I) + r*I + q % I.
  DSA_HD int64_t global(int32_t q, int32_t rank) const {
    uint32_t uq = static_cast<uint32_t>(q);
    return static_cast<int64_t>(by_interleave.div(uq)) * world * interleave +
           static_cast<int64_t>(rank) * interleave + by_interleave.mod(uq);
  }
};

/*!
 * \brief Number of positions in [0, L) owned by rank r (the rank-local length of L).
 * \note  Plain integer arithmetic (no FastDiv): L may be any non-negative int64.
 */
DSA_HD int64_t dcp_local_length(int64_t L, int64_t rank, int64_t world, int64_t interleave) {
  const int64_t base = (L / (interleave * world)) * interleave;
  const int64_t rem = L - base * world - rank * interleave;
  return base + (rem < 0 ? 0 : (rem > interleave ? interleave : rem));
}

}  // namespace dsa
