"""MergeSFL (Liao et al., ICDE 2024): split FL with feature merging and batch size regulation.

`control` holds the control module's equations (Alg. 1) as pure functions; the split
exchange itself (feature merging, gradient dispatch) is in `rayfl.algorithms.split`.
"""
