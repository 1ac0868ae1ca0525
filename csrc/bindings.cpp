// Python bindings: one def per op, nothing else. Tensors arrive as descriptors
// (dsa::Desc1 / dsa::Desc2) built and validated by the Python layer.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dcp/lse_merge.h"
#include "dcp/pack_candidates.h"
#include "indexer/convert_index.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "dsa_ext native ops (ahead-of-time compiled, no libtorch linkage)";
  m.attr("__version__") = DSA_EXT_VERSION;
  m.attr("cuda_archs") = DSA_EXT_CUDA_ARCHS;

  // Spec section 2: top-K token ids -> paged-KV slots (DCP de-interleave, compaction).
  m.def("convert_req_index_to_global_index", &dsa::convert_req_index_to_global_index);
  // Spec 6a: a rank's local top-K -> lossless 64-bit candidate keys (score, global id).
  m.def("pack_dcp_topk_candidates", &dsa::pack_dcp_topk_candidates);
  // Spec 7: weigh partial attention outputs by the all-gathered LSEs (head-block-major).
  m.def("correct_attention_output", &dsa::correct_attention_output);
}
