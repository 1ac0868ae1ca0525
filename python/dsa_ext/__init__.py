"""dsa_ext: ahead-of-time compiled CUDA ops for the DeepSeek Sparse Attention indexer.

Importing needs no GPU, no driver and no compiler: every kernel is compiled into the
wheel (SASS for sm_90a and sm_100a) and nothing is compiled at run time.
"""
from . import _C, dcp, indexer, indexer_topk, mqa_logits, reference, seq_lens
from .c128a import (C128AMetadataBuilder, build_c128a_topk_metadata, c128a_capacity,
                    c128a_topk_width)
from .indexer import IndexerMetadataBuilder, decode_path
from .indexer_topk import topk_per_row, topk_to_candidates, topk_to_slots
from .kv_index import convert_req_index_to_global_index, safe_lengths
from .dcp import (correct_attention_output, merge_attention_outputs, merge_topk_global,
                  merge_topk_global_from_logits, normalize_lse, pack_dcp_topk_candidates)
from .topk import stable_topk_from_candidates

__version__ = _C.__version__
#: CUDA architectures with machine code in this build, e.g. ("90a-real", "100a-real").
cuda_archs = tuple(_C.cuda_archs.split(","))

__all__ = [
    "convert_req_index_to_global_index",
    "safe_lengths",
    "build_c128a_topk_metadata",
    "c128a_capacity",
    "c128a_topk_width",
    "C128AMetadataBuilder",
    "IndexerMetadataBuilder",
    "decode_path",
    "dcp",
    "indexer",
    "indexer_topk",
    "topk_per_row",
    "topk_to_slots",
    "topk_to_candidates",
    "mqa_logits",
    "reference",
    "seq_lens",
    "pack_dcp_topk_candidates",
    "merge_topk_global",
    "merge_topk_global_from_logits",
    "stable_topk_from_candidates",
    "normalize_lse",
    "correct_attention_output",
    "merge_attention_outputs",
    "cuda_archs",
]
