"""Profiling and observability hooks (NVTX ranges for Nsight Systems and torch.profiler)."""
