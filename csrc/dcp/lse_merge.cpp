// DCP attention-output merge: the entry point and the CPU implementation.
#include "lse_merge.h"

#include <stdexcept>
#include <string>

#include "../common/overlap.h"

namespace dsa {

template <typename T>
void correct_attn_cpu(const CorrectAttnArgs<T>& a) {
  const int64_t B = a.partial.size[0], H = a.partial.size[1], D = a.partial.size[2];
  const int64_t heads_per_rank = a.corrected.size[2];
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const LseWeight wt = merge_lse(a.lses, b, h, a.rank, a.base2);
      if (a.global_lse.present()) a.global_lse(b, h) = wt.lse;
      const int64_t w = h / heads_per_rank, j = h - w * heads_per_rank;
      for (int64_t d = 0; d < D; ++d) {
        a.corrected(w, b, j, d) =
            from_float<T>(weigh_output(to_float(a.partial(b, h, d)), wt.factor));
      }
    }
  }
}

template <typename T>
static void run(const Desc3& partial, const Desc3& lses, int64_t rank, bool base2,
                const Desc4& corrected, const Desc2& global_lse, const Place& place) {
  CorrectAttnArgs<T> a;
  a.partial = Strided3D<const T>(partial);
  a.lses = Strided3D<const float>(lses);
  a.corrected = Strided4D<T>(corrected);
  a.global_lse = Strided2D<float>(global_lse);
  a.rank = static_cast<int32_t>(rank);
  a.base2 = base2;
  require_apart("corrected", a.corrected, "out", a.partial, "lses", a.lses);
  require_apart("global_lse", a.global_lse, "out", a.partial, "lses", a.lses);
  require_outputs_apart("corrected", a.corrected, "global_lse", a.global_lse);
  run_on(place, a, correct_attn_cpu<T>, correct_attn_cuda<T>);
}

void correct_attention_output(const Desc3& partial, const Desc3& lses, int64_t rank,
                              bool base2, const Desc4& corrected, const Desc2& global_lse,
                              int64_t out_dtype, int64_t device, int64_t stream) {
  const Place place{device, stream};
  switch (static_cast<OutDtype>(out_dtype)) {
    case OutDtype::kFloat32:
      return run<float>(partial, lses, rank, base2, corrected, global_lse, place);
    case OutDtype::kBFloat16:
      return run<BFloat16>(partial, lses, rank, base2, corrected, global_lse, place);
  }
  throw std::invalid_argument("dsa_ext: correct_attention_output: unknown out_dtype " +
                              std::to_string(out_dtype));
}

template void correct_attn_cpu<float>(const CorrectAttnArgs<float>&);
template void correct_attn_cpu<BFloat16>(const CorrectAttnArgs<BFloat16>&);

}  // namespace dsa
