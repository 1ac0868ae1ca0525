// Python bindings: one def per op, nothing else. Tensors arrive as descriptors
// (dsa::Desc1 ... dsa::Desc4) built by python/dsa_ext/_native.py, which declares each op
// once: the names below are its parameter names in its order (then the values it derives,
// then device and stream), and the names of the C++ declarations; tests/test_boundary.py
// checks both.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "indexer/c128a_metadata.h"
#include "dcp/lse_merge.h"
#include "dcp/pack_candidates.h"
#include "dcp/stable_topk.h"
#include "indexer/convert_index.h"
#include "indexer/seq_lens.h"
#include "indexer/topk_per_row.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "dsa_ext native ops (ahead-of-time compiled, no libtorch linkage)";
  m.attr("__version__") = DSA_EXT_VERSION;
  m.attr("cuda_archs") = DSA_EXT_CUDA_ARCHS;

  // docs/ops.md section 2: top-K token ids -> paged-KV slots.
  m.def("convert_req_index_to_global_index", &dsa::convert_req_index_to_global_index,
        py::arg("req_id"), py::arg("block_table"), py::arg("token_indices"),
        py::arg("block_size"), py::arg("block_stride"), py::arg("dcp_world_size"),
        py::arg("dcp_rank"), py::arg("interleave"), py::arg("compact"),
        py::arg("idx_mapping"), py::arg("prefill_request_id"),
        py::arg("prefill_workspace_starts"), py::arg("prefill_workspace_rank_stride"),
        py::arg("out"), py::arg("valid_counts"), py::arg("device"), py::arg("stream"));
  // How the conversion kernel covers a shape (tests, diagnostics), and a test override.
  m.def("convert_index_plan", &dsa::convert_index_plan);
  m.def("set_convert_plan_override", &dsa::set_convert_plan_override);
  // docs/ops.md section 9: the indexer's per-row top-K of logits rows.
  m.def("topk_per_row", &dsa::topk_per_row, py::arg("logits"), py::arg("k"),
        py::arg("lengths"), py::arg("seq_lens"), py::arg("next_n"), py::arg("row_starts"),
        py::arg("row_ends"), py::arg("sorted"), py::arg("out"), py::arg("is_bf16"),
        py::arg("seq_lens_2d"), py::arg("device"), py::arg("stream"));
  // docs/ops.md section 9: the per-row top-K converted to paged-KV slots.
  m.def("topk_to_slots", &dsa::topk_to_slots, py::arg("logits"), py::arg("k"),
        py::arg("lengths"), py::arg("seq_lens"), py::arg("next_n"), py::arg("row_starts"),
        py::arg("row_ends"), py::arg("req_id"), py::arg("block_table"),
        py::arg("block_size"), py::arg("block_stride"), py::arg("compact"), py::arg("out"),
        py::arg("valid_counts"), py::arg("is_bf16"), py::arg("seq_lens_2d"),
        py::arg("device"), py::arg("stream"));
  // docs/ops.md section 9: the per-row top-K packed into DCP candidate keys in one kernel.
  m.def("topk_to_candidates", &dsa::topk_to_candidates, py::arg("logits"), py::arg("k"),
        py::arg("lengths"), py::arg("seq_lens"), py::arg("next_n"), py::arg("row_starts"),
        py::arg("row_ends"), py::arg("rank"), py::arg("world_size"), py::arg("interleave"),
        py::arg("out"), py::arg("seq_lens_2d"), py::arg("device"), py::arg("stream"));
  // How the per-row top-K kernel covers a shape (tests, diagnostics), and a test override.
  m.def("topk_per_row_plan", &dsa::topk_per_row_plan);
  m.def("set_topk_plan_override", &dsa::set_topk_plan_override);
  m.def("topk_whole_sm_clusters", &dsa::whole_sm_clusters);
  // docs/ops.md section 1: rank-local lengths (one rank, or one column per rank).
  m.def("dcp_local_seq_lens", &dsa::dcp_local_seq_lens, py::arg("seq_lens"),
        py::arg("rank"), py::arg("world_size"), py::arg("interleave"), py::arg("out"),
        py::arg("is_int64"), py::arg("device"), py::arg("stream"));
  // docs/ops.md section 3: C128A decode slots, decode lengths and prefill positions.
  m.def("build_c128a_topk_metadata", &dsa::build_c128a_topk_metadata,
        py::arg("positions"), py::arg("token_to_req"), py::arg("block_table"),
        py::arg("slot_mapping"), py::arg("decode_buffer"), py::arg("decode_lens_buffer"),
        py::arg("prefill_buffer"), py::arg("compress_ratio"), py::arg("block_size"),
        py::arg("num_decode_tokens"), py::arg("width"), py::arg("device"),
        py::arg("stream"));
  // docs/ops.md section 4: per-token decode context lengths, DCP-local, the row map.
  m.def("expand_decode_seq_lens", &dsa::expand_decode_seq_lens, py::arg("seq_lens"),
        py::arg("num_reqs"), py::arg("query_start_loc"), py::arg("next_n"),
        py::arg("num_decode_tokens"), py::arg("compress_ratio"), py::arg("dcp_rank"),
        py::arg("dcp_world_size"), py::arg("interleave"), py::arg("global_lens"),
        py::arg("local_lens"), py::arg("row_map"), py::arg("device"), py::arg("stream"));
  // docs/ops.md section 5: per-token logits bounds [ks, ke) and token_to_seq of a chunk.
  m.def("prefill_chunk_bounds", &dsa::prefill_chunk_bounds, py::arg("seq_lens"),
        py::arg("query_start_loc"), py::arg("row_starts"), py::arg("token_start"),
        py::arg("token_end"), py::arg("compress_ratio"), py::arg("dcp_rank"),
        py::arg("dcp_world_size"), py::arg("interleave"), py::arg("ks"), py::arg("ke"),
        py::arg("token_to_seq"), py::arg("device"), py::arg("stream"));
  // docs/ops.md section 6a: a rank's local top-K -> 64-bit candidate keys.
  m.def("pack_dcp_topk_candidates", &dsa::pack_dcp_topk_candidates, py::arg("logits"),
        py::arg("topk_indices"), py::arg("rank"), py::arg("world_size"),
        py::arg("interleave"), py::arg("row_starts"), py::arg("out"), py::arg("device"),
        py::arg("stream"));
  // docs/ops.md section 6c: exact top-K of packed candidates (CuTeDSL cubin on CUDA).
  m.def("stable_topk_from_candidates", &dsa::stable_topk_from_candidates,
        py::arg("candidates"), py::arg("out"), py::arg("sorted"), py::arg("device"),
        py::arg("stream"));
  // Which exported top-K variant a CUDA device runs for a shape (tests, diagnostics).
  m.def("stable_topk_variant", &dsa::stable_topk_variant);
  m.def("set_stable_topk_variant_override", &dsa::set_stable_topk_variant_override);
  // Whether kernels are launched as programmatic dependent launches (DSA_EXT_PDL).
  m.def("programmatic_launch_enabled", &dsa::programmatic_launch_enabled);
  // docs/ops.md section 7: weigh partial attention outputs by the all-gathered LSEs.
  m.def("correct_attention_output", &dsa::correct_attention_output, py::arg("partial"),
        py::arg("lses"), py::arg("rank"), py::arg("base2"), py::arg("corrected"),
        py::arg("global_lse"), py::arg("out_dtype"), py::arg("device"), py::arg("stream"));
}
