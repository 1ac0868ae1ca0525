// Index conversion: the entry point and the CPU implementation.
#include "convert_index.h"

#include "../common/overlap.h"

namespace dsa {

namespace {

// convert_tokens with the kernels' template arguments (convert_index.cu: kUnswitch, and
// kExact only without compaction), one token at a time.
template <bool kPow2, bool kCompact>
void convert_rows_cpu(const ConvertIndexArgs& a) {
  const int64_t K = a.token_indices.cols;
  for (int64_t t = 0; t < a.token_indices.rows; ++t) {
    const ConvertRow row = convert_row(a, t);
    int64_t count = 0;
    for (int64_t c = 0; c < K; ++c) {
      int32_t one[1] = {a.token_indices(t, c)};
      convert_tokens<kPow2, true, !kCompact>(a, row, one, a.block_table.col_stride);
      const int32_t slot = one[0];
      if (!a.compact) {
        a.out(t, c) = slot;
        count += slot >= 0;
      } else if (slot >= 0) {
        a.out(t, count++) = slot;  // count <= c: never overwrites an unread input column
      }
    }
    if (a.compact) {
      for (int64_t c = count; c < K; ++c) a.out(t, c) = -1;
    }
    if (a.valid_counts.present()) a.valid_counts[t] = static_cast<int32_t>(count);
  }
}

}  // namespace

// The instantiation the kernels take (convert_index_cuda), so that the CPU tests check it.
void convert_index_cpu(const ConvertIndexArgs& a) {
  if (a.compact) {
    convert_pow2(a) ? convert_rows_cpu<true, true>(a) : convert_rows_cpu<false, true>(a);
  } else {
    convert_pow2(a) ? convert_rows_cpu<true, false>(a) : convert_rows_cpu<false, false>(a);
  }
}

void convert_req_index_to_global_index(const Desc1& req_id, const Desc2& block_table,
                                       const Desc2& token_indices, int64_t block_size,
                                       int64_t block_stride, int64_t dcp_world_size,
                                       int64_t dcp_rank, int64_t interleave, bool compact,
                                       const Desc1& idx_mapping,
                                       const Desc1& prefill_request_id,
                                       const Desc1& prefill_workspace_starts,
                                       int64_t prefill_workspace_rank_stride,
                                       const Desc2& out, const Desc1& valid_counts,
                                       int64_t device, int64_t stream) {
  ConvertIndexArgs a;
  a.req_id = Strided1D<const int32_t>(req_id);
  a.block_table = Strided2D<const int32_t>(block_table);
  a.token_indices = Strided2D<const int32_t>(token_indices);
  a.out = Strided2D<int32_t>(out);
  a.valid_counts = Strided1D<int32_t>(valid_counts);
  a.idx_mapping = Strided1D<const int32_t>(idx_mapping);
  a.prefill_request_id = Strided1D<const int32_t>(prefill_request_id);
  a.workspace_starts = Strided1D<const int32_t>(prefill_workspace_starts);
  a.workspace_rank_stride = prefill_workspace_rank_stride;
  a.by_block_size = FastDiv(static_cast<uint32_t>(block_size));
  a.block_stride = static_cast<int32_t>(block_stride);
  a.entry_limit = entry_limit_for(a.block_stride);
  a.dcp = DcpLayout(static_cast<int32_t>(dcp_world_size), static_cast<int32_t>(interleave));
  a.rank = static_cast<int32_t>(dcp_rank);
  a.compact = compact;
  auto apart_from_tables = [&](const char* name, const auto& written) {
    require_apart(name, written, "req_id", a.req_id, "block_table", a.block_table,
                  "idx_mapping", a.idx_mapping, "prefill_request_id", a.prefill_request_id,
                  "prefill_workspace_starts", a.workspace_starts);
  };
  // `out` may be `token_indices` itself, the same view (docs/ops.md section 2).
  if (out != token_indices) require_apart("out", a.out, "token_indices", a.token_indices);
  apart_from_tables("out", a.out);
  require_apart("valid_counts", a.valid_counts, "token_indices", a.token_indices);
  apart_from_tables("valid_counts", a.valid_counts);
  require_outputs_apart("out", a.out, "valid_counts", a.valid_counts);
  run_on(Place{device, stream}, a, convert_index_cpu, convert_index_cuda);
}

}  // namespace dsa
