"""agentjax: train LLM search agents with reinforcement learning in JAX.

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
    packages=find_packages(include=["agentjax", "agentjax.*", "configs"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.10,<0.11",
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
        "tensorflow-datasets>=4.9.9,<5",
        "importlib_resources>=6",
        "absl-py>=2.1,<3",
        "bm25s>=0.2.5,<0.4",
        "tensorboardX>=2.6,<3",
        "tqdm>=4.60",
        # The judge's "openai" backend (any OpenAI-compatible endpoint) and launch/serve.py.
        "openai>=2.0,<3",
        "fastapi>=0.110,<1",
        "uvicorn>=0.30,<1",
    ],
    extras_require={
        # torch: exactly the CPU build that lies on local disk (other specs pull CUDA wheels).
        # nbclient/nbformat/ipykernel execute notebooks/*.ipynb (tests/test_notebooks.py), whose
        # plots need matplotlib.
        # pytest-xdist: `make test` runs the suite in TEST_WORKERS processes.
        "test": ["pytest>=8", "pytest-xdist>=3.5,<4", "torch==2.13.0", "nbclient>=0.10,<1", "nbformat>=5.10,<6",
                 "ipykernel>=6.29,<8", "matplotlib>=3.8,<4",
                 # peft: the reference for LoRA adapter folders (tests/test_lora_peft.py).
                 "peft==0.21.2",
                 # faiss-cpu: the reference for dense search (tests/test_dense.py, bench dense).
                 "faiss-cpu>=1.9,<2"],
    },
)
