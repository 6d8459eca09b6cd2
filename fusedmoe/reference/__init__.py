"""Plain-PyTorch ground truth: routing, activations, quantization, the MoE forward.

Tests, benchmarks and the ``torch_ref`` backend import this package; nothing here is fast.
"""
