"""sglang-detspec: deterministic speculative decoding for SGLang.

Same request and same ``sampling_seed`` give the same tokens whatever batch
the request lands in, with EAGLE / NEXTN / multi-layer EAGLE speculative
decoding and rejection sampling on. See :mod:`sglang_detspec.ops` for the
keyed streams and samplers and :mod:`sglang_detspec.sglang_plugin` for the
wiring into SGLang.
"""

__version__ = "0.1.0"
