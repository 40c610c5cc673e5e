"""agentjax: train LLM search agents with reinforcement learning in JAX.

Install, by where it runs (the extras are jax's own, passed through):
  CPU:             pip install -e .
  NVIDIA GPU:      pip install -e '.[cuda]'    (CUDA 12, as '.[cuda12]'; '.[cuda13]': CUDA 13)
  Cloud TPU VM:    pip install -e '.[tpu]'
  TensorBoard:     add the tensorboard extra, e.g. pip install -e '.[cuda,tensorboard]'
jax 0.11 needs Python >= 3.12; on Python 3.11 pip installs jax 0.10. The GPU figures in
docs/BENCHMARKS.md were measured on jax 0.11.2 and flax 0.12.10.

Install for development and tests:  pip install torch==2.13.0 && pip install -e '.[test]'
(`make test` does this in .venv). torch is a test-only dependency: it runs transformers'
reference models for the parity tests; agentjax itself never imports it.
"""

from setuptools import find_packages, setup

setup(
    name="agentjax",
    version="0.1.0",
    description="JAX/Flax RL for multi-turn LLM search agents (IGPO, GRPO family) on Qwen models",
    # configs/: the config files (configs/<method>.py:<preset>) import configs.base; installed so
    # that the launch scripts and agentjax.studies / agentjax.benchmarks import it from anywhere.
    # The repository's address: notebooks/*.ipynb clone it (their REPO_URL) outside a clone.
    url="https://github.com/agentjax/agentjax",
    packages=find_packages(include=["agentjax", "agentjax.*", "configs"]),
    python_requires=">=3.11",  # jax 0.10's floor (jax 0.11's is 3.12)
    install_requires=[
        # The suite runs on jax 0.10.2 + flax 0.12.8 (Python 3.11). On jax 0.11.2 (Python 3.12;
        # docs/BENCHMARKS.md's GPU figures) with flax 0.12.10 and 0.12.12, the attention,
        # checkpoint, loss, SFT, mesh, LoRA, rollout, sampling and trainer tests pass and the
        # Qwen forward gives jax 0.10.2's logits (within 3e-7).
        "jax>=0.10,<0.12",
        "flax>=0.12,<0.13",
        "optax>=0.2.8,<0.3",
        # agentjax.train.checkpoint leaves typed PRNG keys (jax.random.key) to orbax's array
        # handler: saved with their impl, restored into a typed-key target, sharded too. 0.11.20
        # cannot restore into a typed target; tests/test_checkpoint.py passes on 0.12.0 and 0.12.8.
        "orbax-checkpoint>=0.12.0,<0.13",
        "chex>=0.1.92,<0.2",
        "ml_collections>=1.1,<2",
        "numpy>=1.26",
        "ml_dtypes>=0.5",
        "transformers>=5.0,<6",
        "safetensors>=0.8,<1",  # bfloat16 slices through the numpy framework (tested: 0.8.0)
        "tokenizers>=0.22,<1",
        # transformers renders chat templates with jinja2 (agent prompts) but does not require it.
        "jinja2>=3.1,<4",
        "tensorflow-datasets>=4.9.9,<5",
        "importlib_resources>=6",
        "absl-py>=2.1,<3",
        "bm25s>=0.2.5,<0.4",
        "tensorboardX>=2.6,<3",
        "tqdm>=4.60",
        # Learning curves as PNG files (launch/demo.py) and the notebooks' plots.
        "matplotlib>=3.8,<4",
        # The judge's "openai" backend (any OpenAI-compatible endpoint) and launch/serve.py.
        "openai>=2.0,<3",
        "fastapi>=0.110,<1",
        "uvicorn>=0.30,<1",
    ],
    extras_require={
        # Accelerators: jax's extras of the same names, which pin jaxlib and the CUDA plugin or
        # libtpu to the jax that install_requires selects.
        "cuda": ["jax[cuda]"],  # jax's "cuda" is CUDA 12
        "cuda12": ["jax[cuda12]"],
        "cuda13": ["jax[cuda13]"],
        "tpu": ["jax[tpu]"],
        # `tensorboard --logdir <workdir>`: the trainer writes its events with tensorboardX.
        "tensorboard": ["tensorboard>=2.16,<3"],
        # torch: exactly the CPU build that lies on local disk (other specs pull CUDA wheels).
        # nbclient/nbformat/ipykernel execute notebooks/*.ipynb (tests/test_notebooks.py).
        # pytest-xdist: `make test` runs the suite in TEST_WORKERS processes.
        "test": ["pytest>=8", "pytest-xdist>=3.5,<4", "torch==2.13.0", "nbclient>=0.10,<1", "nbformat>=5.10,<6",
                 "ipykernel>=6.29,<8",
                 # peft: the reference for LoRA adapter folders (tests/test_lora_peft.py).
                 "peft==0.21.2",
                 # faiss-cpu: the reference for dense search (tests/test_dense.py, bench dense).
                 "faiss-cpu>=1.9,<2"],
    },
)
