// Python bindings: one def per op, nothing else. Tensors arrive as descriptors
// (dsa::Desc1 / dsa::Desc2) built and validated by the Python layer.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "dcp/stable_topk.h"
#include "indexer/convert_index.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "dsa_ext native ops (ahead-of-time compiled, no libtorch linkage)";
  m.attr("__version__") = DSA_EXT_VERSION;
  m.attr("cuda_archs") = DSA_EXT_CUDA_ARCHS;

  // Spec section 2: top-K token ids -> paged-KV slots (DCP de-interleave, compaction).
  m.def("convert_req_index_to_global_index", &dsa::convert_req_index_to_global_index);
  // Spec section 6c: exact stable top-K of packed DCP candidates (CuTeDSL cubin on CUDA).
  m.def("stable_topk_from_candidates", &dsa::stable_topk_from_candidates);
}
