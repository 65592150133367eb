"""Triton kernels, each beside its torch reference (installed as specbench.kernels).

None yet: verification and n-gram lookup kernels come with the Triton work; until then every
rule and drafter runs on the pure torch reference in specbench.rules / specbench.drafters.
"""
