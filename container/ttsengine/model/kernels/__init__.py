"""Triton kernels (paged attention, int8 linears, Snake) and what their host side shares."""
