"""Decode context parallelism (DCP): rank-local lengths and the cross-rank merges.

A request's KV cache is split over W ranks: position p lives on rank (p // I) % W
(spec section 1).
"""
