"""Torch kernels of one DeepSeek-V4.1-Flash-style layer, and a small real engine core (GPU side).

Nothing here is imported by the simulator; it needs ``torch`` (the ``calibrate`` extra). Modules:

=====================  ==========================================================================
``shapes``             ``LayerShape``: one layer's widths, from a ``ModelSpec`` or toy sizes
``linear``             ``Linear`` / ``GroupedLinear``: bf16 or FP8 (``torch._scaled_mm``)
``cache``              ``KVPool``: per-layer window / compressed / indexer cache of many sequences
``attention``          ``AttentionBlock`` (SWA / CSA / HCA, prefill and decode), ``DecodePlan``
``triton_indexer``     fused lightning-indexer scores (CUDA; torch fallback in ``attention``)
``moe``                ``MoEBlock``: router + grouped-GEMM experts (``torch._grouped_mm`` / FP8)
``ep``, ``ep_bench``   expert-parallel all-to-all dispatch/combine and its timing script
``vision``             ``VisionEncoder``: SigLIP-SO400M-scale ViT (the VE stage)
``engine``             ``EngineCore``: continuous batching over a reduced stack, real-time replay
``reference``          float64 references of all of the above (tests, ``gpu_check``)
``backend``            kernel backends by name: ``reference`` (the modules above), ``deepseek``
``block``              ``LayerBlock``: the prefill / decode entry points every block shares
``deepseek/``          DeepSeek's kernels: FlashMLA (sparse MODEL1 FP8, dense MLA), fused FP8
                       projections and decode kernels (Triton), V4 and V3 (MLA) blocks
``deepseek_check``     ``python -m deepinfer_sim.kernels.deepseek_check --out DIR``: the deepseek
                       backend against its emulation and the reference, decode profiles
``gpu_check``          ``python -m deepinfer_sim.kernels.gpu_check --out DIR``: smoke test + timing
=====================  ==========================================================================

The package import itself stays light (no torch): import the submodules you need.
"""
