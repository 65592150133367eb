"""Model runners (installed as specbench.engines).

native: a compact Llama / Mistral / Qwen2 over a static KV cache, CUDA graphs, batched (native.py).
hf: transformers models as they are, with a DynamicCache cropped on rollback; the reference
for breadth and correctness (hf.py).
vllm, sglang: the whole run handed to a serving engine (translate.py maps the config, vllm.py
and sglang.py run it, show.py prints the equivalent server command lines).
"""
