// Per-token sequence lengths: the entry points and the CPU implementations.
#include "seq_lens.h"

#include "../common/overlap.h"

namespace dsa {
void local_lens_cpu(const LocalLensArgs& a) {
  for (int64_t i = 0; i < a.num; ++i) {
    if (a.is_int64) {
      local_lens_element(a.lens64, a.out64, a, i);
    } else {
      local_lens_element(a.lens32, a.out32, a, i);
    }
  }
}

void decode_lens_cpu(const DecodeLensArgs& a) {
  for (int64_t t = 0; t < a.num_tokens; ++t) decode_lens_element(a, t);
}

void prefill_bounds_cpu(const PrefillBoundsArgs& a) {
  for (int64_t t = 0; t < a.num_tokens; ++t) prefill_bounds_element(a, t);
}

void dcp_local_seq_lens(const Desc1& seq_lens, int64_t rank, int64_t world_size,
                        int64_t interleave, const Desc2& out, bool is_int64, int64_t device,
                        int64_t stream) {
  LocalLensArgs a;
  if (is_int64) {
    a.lens64 = Strided1D<const int64_t>(seq_lens);
    a.out64 = Strided2D<int64_t>(out);
  } else {
    a.lens32 = Strided1D<const int32_t>(seq_lens);
    a.out32 = Strided2D<int32_t>(out);
  }
  a.is_int64 = is_int64;
  a.num = seq_lens[1];
  a.rank = rank;
  a.world = world_size;
  a.interleave = interleave;
  require_apart("out", a.out64, "seq_lens", a.lens64);
  require_apart("out", a.out32, "seq_lens", a.lens32);
  run_on(Place{device, stream}, a, local_lens_cpu, local_lens_cuda);
}

void expand_decode_seq_lens(const Desc1& seq_lens, int64_t num_reqs,
                            const Desc1& query_start_loc, int64_t next_n,
                            int64_t num_decode_tokens, int64_t compress_ratio,
                            int64_t dcp_rank, int64_t dcp_world_size, int64_t interleave,
                            const Desc1& global_lens, const Desc2& local_lens,
                            const Desc1& row_map, int64_t device, int64_t stream) {
  DecodeLensArgs a;
  a.seq_lens = Strided1D<const int32_t>(seq_lens);
  a.seq_lens.size = num_reqs;  // the batch's requests: a prefix of the lengths given
  a.query_start_loc = Strided1D<const int32_t>(query_start_loc);
  a.next_n = next_n;
  a.num_tokens = num_decode_tokens;
  a.ratio = compress_ratio;
  a.rank = dcp_rank;
  a.world = dcp_world_size;
  a.interleave = interleave;
  a.global_lens = Strided1D<int32_t>(global_lens);
  a.local_lens = Strided2D<int32_t>(local_lens);
  a.row_map = Strided1D<int32_t>(row_map);
  auto apart_from_inputs = [&](const char* name, const auto& written) {
    require_apart(name, written, "seq_lens", a.seq_lens, "query_start_loc", a.query_start_loc);
  };
  // Named as decode_context_lens names them (decode_row_ends writes `out` only).
  apart_from_inputs("out", a.global_lens);
  apart_from_inputs("local_out", a.local_lens);
  apart_from_inputs("row_map_out", a.row_map);
  require_outputs_apart("out", a.global_lens, "local_out", a.local_lens, "row_map_out",
                        a.row_map);
  run_on(Place{device, stream}, a, decode_lens_cpu, decode_lens_cuda);
}

void prefill_chunk_bounds(const Desc1& seq_lens, const Desc1& query_start_loc,
                          const Desc1& row_starts, int64_t token_start, int64_t token_end,
                          int64_t compress_ratio, int64_t dcp_rank, int64_t dcp_world_size,
                          int64_t interleave, const Desc1& ks, const Desc1& ke,
                          const Desc1& token_to_seq, int64_t device, int64_t stream) {
  PrefillBoundsArgs a;
  a.seq_lens = Strided1D<const int32_t>(seq_lens);
  a.query_start_loc = Strided1D<const int32_t>(query_start_loc);
  a.row_starts = Strided1D<const int32_t>(row_starts);
  a.token_start = token_start;
  a.num_tokens = token_end - token_start;
  a.ratio = compress_ratio;
  a.rank = dcp_rank;
  a.world = dcp_world_size;
  a.interleave = interleave;
  a.ks = Strided1D<int32_t>(ks);
  a.ke = Strided1D<int32_t>(ke);
  a.token_to_seq = Strided1D<int32_t>(token_to_seq);
  auto apart_from_inputs = [&](const char* name, const auto& written) {
    require_apart(name, written, "seq_lens", a.seq_lens, "query_start_loc", a.query_start_loc,
                  "row_starts", a.row_starts);
  };
  apart_from_inputs("ks", a.ks);
  apart_from_inputs("ke", a.ke);
  apart_from_inputs("token_to_seq", a.token_to_seq);
  require_outputs_apart("ks", a.ks, "ke", a.ke, "token_to_seq", a.token_to_seq);
  run_on(Place{device, stream}, a, prefill_bounds_cpu, prefill_bounds_cuda);
}

}  // namespace dsa
