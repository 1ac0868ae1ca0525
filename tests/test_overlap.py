"""Outputs that share memory with an input are a ValueError naming both (docs/ops.md,
conventions); the documented in-place forms and views that interleave without sharing an
element still run. CPU: the check is on the host, the same for CUDA tensors."""
import pytest
import torch

import dsa_ext
from dsa_ext import reference


def _tables(T=4, K=8, blocks=4, block_size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    req_id = torch.randint(0, 2, (T,), dtype=torch.int32, generator=g)
    block_table = torch.randint(0, 64, (2, blocks), dtype=torch.int32, generator=g)
    ids = torch.randint(-1, blocks * block_size, (T, K), dtype=torch.int32, generator=g)
    return req_id, block_table, ids, block_size


def test_convert_out_overlapping_token_indices_is_rejected():
    req_id, block_table, ids, bs = _tables()
    T, K = ids.shape
    buf = torch.empty((T + 1, K), dtype=torch.int32)
    buf[:T] = ids
    with pytest.raises(ValueError, match="out must not share memory with token_indices"):
        dsa_ext.convert_req_index_to_global_index(req_id, block_table, buf[:T], bs,
                                                  out=buf[1:])


def test_convert_in_place_is_allowed():
    req_id, block_table, ids, bs = _tables()
    want, _ = reference.convert_req_index_to_global_index(req_id, block_table, ids, bs)
    inout = ids.clone()
    got = dsa_ext.convert_req_index_to_global_index(req_id, block_table, inout, bs, out=inout)
    assert got.data_ptr() == inout.data_ptr()
    assert torch.equal(got, want)


def test_convert_valid_counts_overlapping_an_input_is_rejected():
    req_id, block_table, ids, bs = _tables()
    counts = req_id  # int32 [T], the request ids' memory
    with pytest.raises(ValueError, match="valid_counts must not share memory with req_id"):
        dsa_ext.convert_req_index_to_global_index(req_id, block_table, ids, bs, compact=True,
                                                  valid_counts=counts)


def test_interleaved_views_share_no_element_and_run():
    # Columns 0, 2, 4, ... hold the ids and 1, 3, 5, ... the output: their spans
    # intersect, their elements do not, so the check lets them pass.
    req_id, block_table, ids, bs = _tables()
    T, K = ids.shape
    big = torch.empty((T, 2 * K), dtype=torch.int32)
    big[:, 0::2] = ids
    want, _ = reference.convert_req_index_to_global_index(req_id, block_table, ids, bs)
    got = dsa_ext.convert_req_index_to_global_index(req_id, block_table, big[:, 0::2], bs,
                                                    out=big[:, 1::2])
    assert torch.equal(got, want)
    assert torch.equal(big[:, 0::2], ids)


def test_topk_per_row_out_over_the_logits_is_rejected():
    rows, L, k = 2, 64, 4
    storage = torch.randn(rows * L)
    logits = storage.view(rows, L)
    out = storage.view(torch.int32)[: rows * k].view(rows, k)
    with pytest.raises(ValueError, match="out must not share memory with logits"):
        dsa_ext.topk_per_row(logits, k, out=out)


def test_topk_to_slots_out_over_the_block_table_is_rejected():
    rows, L, k = 2, 64, 4
    logits = torch.randn(rows, L)
    req_id = torch.zeros(rows, dtype=torch.int32)
    block_table = torch.arange(16, dtype=torch.int32).view(2, 8)
    with pytest.raises(ValueError, match="out must not share memory with block_table"):
        dsa_ext.topk_to_slots(logits, k, req_id, block_table, 16,
                              out=block_table.view(-1)[: rows * k].view(rows, k))


def test_stable_topk_out_over_the_candidates_is_rejected():
    keys = torch.randint(0, 1 << 40, (2, 8), dtype=torch.int64)
    out = keys.view(-1).view(torch.int32)[:8].view(2, 4)
    with pytest.raises(ValueError, match="out must not share memory with candidates"):
        dsa_ext.stable_topk_from_candidates(keys, 4, out=out)


def test_pack_out_over_the_logits_is_rejected():
    logits = torch.randn(2, 64)
    topk = torch.randint(0, 64, (2, 4), dtype=torch.int32)
    out = logits.view(-1).view(torch.int64)[:8].view(2, 4)
    with pytest.raises(ValueError, match="out must not share memory with logits"):
        dsa_ext.pack_dcp_topk_candidates(logits, topk, rank=0, world_size=1, out=out)


def test_local_seq_lens_out_over_seq_lens_is_rejected():
    seq_lens = torch.tensor([5, 9, 17, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="out must not share memory with seq_lens"):
        dsa_ext.seq_lens.local_seq_lens(seq_lens, 0, 2, out=seq_lens)


@pytest.mark.parametrize("other", ["out", "global_lse"])
def test_correct_attention_output_corrected_overlapping_is_rejected(other):
    # `corrected` over the input `out`, or the other output `global_lse` inside `corrected`.
    W, B, H, D = 2, 2, 4, 8
    out = torch.randn(B, H, D)
    lses = torch.randn(W, B, H)
    corrected = out.view(W, B, H // W, D) if other == "out" else torch.empty(W, B, H // W, D)
    global_lse = corrected.view(-1)[:B * H].view(B, H) if other == "global_lse" else None
    with pytest.raises(ValueError, match=f"corrected must not share memory with {other}"):
        dsa_ext.correct_attention_output(out, lses, 0, corrected=corrected,
                                         global_lse=global_lse)


def _c128a(decode, decode_lens, prefill, token_to_req=None):
    """build_c128a_topk_metadata of 4 tokens (2 decode), width 8, into the buffers given."""
    T, Td, ratio, bs, width = 4, 2, 4, 16, 8
    positions = torch.arange(T, dtype=torch.int64) * 3 + 20
    if token_to_req is None:
        token_to_req = torch.zeros(T, dtype=torch.int32)
    block_table = torch.arange(8, dtype=torch.int32).view(1, 8)
    slot_mapping = torch.arange(T, dtype=torch.int64)
    return dsa_ext.build_c128a_topk_metadata(positions, ratio, Td, token_to_req, block_table,
                                             bs, slot_mapping, decode, decode_lens, prefill,
                                             width)


def test_c128a_decode_lens_buffer_over_token_to_req_is_rejected():
    token_to_req = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError,
                       match="decode_lens_buffer must not share memory with token_to_req"):
        _c128a(torch.zeros((4, 8), dtype=torch.int32), token_to_req,
               torch.zeros((4, 8), dtype=torch.int32), token_to_req)


def test_topk_per_row_out_over_the_lengths_names_them():
    rows, L, k = 2, 64, 4
    buf = torch.full((rows * k,), L, dtype=torch.int32)
    with pytest.raises(ValueError, match="out must not share memory with lengths"):
        dsa_ext.topk_per_row(torch.randn(rows, L), k, lengths=buf[:rows],
                             out=buf.view(rows, k))


# Outputs against each other: two outputs' writes to one element would land in an order
# that changes from run to run.

def test_convert_valid_counts_inside_out_is_rejected():
    req_id, block_table, ids, bs = _tables()
    T, K = ids.shape
    out = torch.empty((T, K), dtype=torch.int32)
    with pytest.raises(ValueError, match="out must not share memory with valid_counts"):
        dsa_ext.convert_req_index_to_global_index(req_id, block_table, ids, bs, compact=True,
                                                  out=out, valid_counts=out.view(-1)[:T])


def test_convert_outputs_side_by_side_in_one_buffer_run():
    req_id, block_table, ids, bs = _tables()
    T, K = ids.shape
    storage = torch.empty(T * K + T, dtype=torch.int32)
    out, counts = storage[:T * K].view(T, K), storage[T * K:]
    want, want_counts = reference.convert_req_index_to_global_index(
        req_id, block_table, ids, bs, compact=True)
    got, got_counts = dsa_ext.convert_req_index_to_global_index(
        req_id, block_table, ids, bs, compact=True, return_valid_counts=True, out=out,
        valid_counts=counts)
    assert torch.equal(got, want) and torch.equal(got_counts, want_counts)


def test_topk_to_slots_valid_counts_inside_out_is_rejected():
    rows, L, k = 2, 64, 4
    logits = torch.randn(rows, L)
    req_id = torch.zeros(rows, dtype=torch.int32)
    block_table = torch.arange(16, dtype=torch.int32).view(2, 8)
    out = torch.empty((rows, k), dtype=torch.int32)
    with pytest.raises(ValueError, match="out must not share memory with valid_counts"):
        dsa_ext.topk_to_slots(logits, k, req_id, block_table, 16, compact=True,
                              return_valid_counts=True, out=out,
                              valid_counts=out.view(-1)[:rows])


def test_decode_context_lens_outputs_sharing_a_buffer_are_rejected():
    seq_lens = torch.tensor([10, 7], dtype=torch.int32)
    buf = torch.empty(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="out must not share memory with row_map_out"):
        dsa_ext.seq_lens.decode_context_lens(seq_lens, 4, next_n=2, out=buf, row_map_out=buf)


def test_decode_context_lens_names_its_keywords():
    seq_lens = torch.tensor([10, 7, 0, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match="local_out must not share memory with seq_lens"):
        dsa_ext.seq_lens.decode_context_lens(seq_lens, 4, next_n=1, local_out=seq_lens)


def test_prefill_chunk_bounds_ks_and_ke_sharing_a_buffer_are_rejected():
    seq_lens = torch.tensor([6, 4], dtype=torch.int32)
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    row_starts = torch.tensor([0, 6], dtype=torch.int32)
    buf = torch.empty(5, dtype=torch.int32)
    with pytest.raises(ValueError, match="ks must not share memory with ke"):
        dsa_ext.seq_lens.prefill_chunk_bounds(seq_lens, qsl, row_starts, 0, 5, ks=buf, ke=buf)


def test_c128a_decode_and_prefill_buffers_overlapping_are_rejected():
    both = torch.zeros((5, 8), dtype=torch.int32)
    with pytest.raises(ValueError,
                       match="decode_buffer must not share memory with prefill_buffer"):
        _c128a(both[:4], torch.zeros(4, dtype=torch.int32), both[1:])
