"""Private Triton kernels and their launchers. Launchers take CUDA tensors (or CPU tensors under
``TRITON_INTERPRET=1``) that the public ops have already validated."""
