"""Model runners (installed as specbench.engines).

hf: transformers models as they are, with a DynamicCache cropped on rollback; the reference
for breadth and correctness. A compact native engine with a static cache and CUDA graphs comes
with the GPU-runner work.
"""
