// C128A metadata: the entry point and the CPU implementation.
#include "c128a_metadata.h"

namespace dsa {

void c128a_metadata_cpu(const C128AArgs& a) {
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const C128ARow row = c128a_row(a, t);
    for (int64_t i = 0; i < a.width; ++i) row.out[i * row.col_stride] = c128a_entry(a, row, i);
    if (row.decode) a.decode_lens[t] = row.n;
  }
}

void build_c128a_topk_metadata(const Desc1& positions, const Desc1& token_to_req,
                               const Desc2& block_table, const Desc1& slot_mapping,
                               const Desc2& decode_buffer, const Desc1& decode_lens_buffer,
                               const Desc2& prefill_buffer, int64_t compress_ratio,
                               int64_t block_size, int64_t num_decode_tokens, int64_t width,
                               int64_t device, int64_t stream) {
  C128AArgs a;
  a.positions = Strided1D<const int64_t>(positions);
  a.token_to_req = Strided1D<const int32_t>(token_to_req);
  a.block_table = Strided2D<const int32_t>(block_table);
  a.slot_mapping = Strided1D<const int64_t>(slot_mapping);
  a.decode = Strided2D<int32_t>(decode_buffer);
  a.decode_lens = Strided1D<int32_t>(decode_lens_buffer);
  a.prefill = Strided2D<int32_t>(prefill_buffer);
  a.ratio = compress_ratio;
  a.num_tokens = a.positions.size;
  a.num_decode = num_decode_tokens;
  a.width = width;
  a.by_block_size = FastDiv(static_cast<uint32_t>(block_size));
  run_on(Place{device, stream}, a, c128a_metadata_cpu, c128a_metadata_cuda);
}

}  // namespace dsa
