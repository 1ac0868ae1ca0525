// C128A metadata: the entry point and the CPU implementation.
#include "c128a_metadata.h"

#include "../common/overlap.h"

namespace dsa {

namespace {

template <int kRun>
void fill_rows(const C128AArgs& a) {
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const C128ARow row = c128a_row(a, t);
    // 64-bit column counter: with width > 2^31 - 4 the last c0 + 4 passes INT32_MAX.
    for (int64_t c0 = 0; c0 < a.width; c0 += 4) {
      int32_t entry[4 / kRun], v[4];
      c128a_chunk_loads<kRun>(a, row, static_cast<int32_t>(c0), entry);
      c128a_chunk_values<kRun>(a, row, static_cast<int32_t>(c0), entry, v);
      for (int64_t e = 0; e < 4 && c0 + e < a.width; ++e) {
        row.out[(c0 + e) * row.col_stride] = v[e];
      }
    }
    if (row.decode) a.decode_lens[t] = row.n;
  }
}

}  // namespace

void c128a_metadata_cpu(const C128AArgs& a) {
  switch (c128a_run(a)) {
    case 4: fill_rows<4>(a); break;
    case 2: fill_rows<2>(a); break;
    default: fill_rows<1>(a);
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
  auto apart_from_inputs = [&](const char* name, const auto& written) {
    require_apart(name, written, "positions", a.positions, "token_to_req", a.token_to_req,
                  "block_table", a.block_table, "slot_mapping", a.slot_mapping);
  };
  apart_from_inputs("decode_buffer", a.decode);
  apart_from_inputs("decode_lens_buffer", a.decode_lens);
  apart_from_inputs("prefill_buffer", a.prefill);
  require_outputs_apart("decode_buffer", a.decode, "decode_lens_buffer", a.decode_lens,
                        "prefill_buffer", a.prefill);
  run_on(Place{device, stream}, a, c128a_metadata_cpu, c128a_metadata_cuda);
}

}  // namespace dsa
