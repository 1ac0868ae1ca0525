// Python bindings: one def per op, nothing else. Tensors arrive as descriptors
// (dsa::Desc1 / dsa::Desc2) built and validated by the Python layer.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "indexer/c128a_metadata.h"
#include "dcp/lse_merge.h"
#include "dcp/pack_candidates.h"
#include "dcp/stable_topk.h"
#include "indexer/convert_index.h"
#include "indexer/seq_lens.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "dsa_ext native ops (ahead-of-time compiled, no libtorch linkage)";
  m.attr("__version__") = DSA_EXT_VERSION;
  m.attr("cuda_archs") = DSA_EXT_CUDA_ARCHS;

  // Spec section 2: top-K token ids -> paged-KV slots (DCP de-interleave, compaction).
  m.def("convert_req_index_to_global_index", &dsa::convert_req_index_to_global_index);
  // How the conversion kernel covers a shape (tests, diagnostics), and a test override.
  m.def("convert_index_plan", &dsa::convert_index_plan);
  m.def("set_convert_plan_override", &dsa::set_convert_plan_override);
  // Spec section 1: rank-local lengths of any lengths (one rank or one column per rank).
  m.def("dcp_local_seq_lens", &dsa::dcp_local_seq_lens);
  // Spec section 3: C128A decode slots, decode lengths and prefill positions, one launch.
  m.def("build_c128a_topk_metadata", &dsa::build_c128a_topk_metadata);
  // Spec section 4: per-token decode context lengths (uniform/ragged), DCP-local, row map.
  m.def("expand_decode_seq_lens", &dsa::expand_decode_seq_lens);
  // Spec section 5: per-token logits bounds [ks, ke) and token_to_seq of a prefill chunk.
  m.def("prefill_chunk_bounds", &dsa::prefill_chunk_bounds);
  // Spec 6a: a rank's local top-K -> lossless 64-bit candidate keys (score, global id).
  m.def("pack_dcp_topk_candidates", &dsa::pack_dcp_topk_candidates);
  // Spec section 6c: exact stable top-K of packed DCP candidates (CuTeDSL cubin on CUDA).
  m.def("stable_topk_from_candidates", &dsa::stable_topk_from_candidates);
  // Which exported top-K variant a CUDA device runs for a shape (tests, diagnostics).
  m.def("stable_topk_variant", &dsa::stable_topk_variant);
  // Whether kernels are launched as programmatic dependent launches (DSA_EXT_PDL).
  m.def("programmatic_launch_enabled", &dsa::programmatic_launch_enabled);
  // Spec 7: weigh partial attention outputs by the all-gathered LSEs (head-block-major).
  m.def("correct_attention_output", &dsa::correct_attention_output);
}
