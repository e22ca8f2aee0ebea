"""Benchmark harness, device ceilings and run metadata shared by every op family's benchmark."""
