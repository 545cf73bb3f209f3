"""Benchmarks: each prints its figures beside a ceiling measured in the same run on the same machine.

`_common.py` holds what they share (timer, the one percentile rule, progress lines, scratch
databases, the result table); each other module is one `fanout bench NAME`.
"""
