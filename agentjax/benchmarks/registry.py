"""BENCHES: every bench of launch/bench.py by name (each a function of the flags returning one
JSON-able dict; the flags: common.define_flags and, imported with the fit bench, the fit
check's)."""

from __future__ import annotations

from agentjax.benchmarks.async_rl import bench_async
from agentjax.benchmarks.attention import bench_attention
from agentjax.benchmarks.compiles import bench_compiles
from agentjax.benchmarks.coreact import bench_coreact
from agentjax.benchmarks.decode import bench_decode
from agentjax.benchmarks.decode_window import bench_decode_window
from agentjax.benchmarks.dense import bench_dense, bench_dense_fit
from agentjax.benchmarks.fit import bench_fit
from agentjax.benchmarks.forward import bench_forward
from agentjax.benchmarks.gpu import bench_gpu
from agentjax.benchmarks.info_gain import bench_info_gain
from agentjax.benchmarks.overload import bench_server_overload
from agentjax.benchmarks.judge import bench_judge
from agentjax.benchmarks.packing import bench_packing
from agentjax.benchmarks.ppo_step import bench_ppo_step
from agentjax.benchmarks.rewards import bench_rewards
from agentjax.benchmarks.rollout import bench_rollout
from agentjax.benchmarks.rollout_mix import bench_rollout_mix
from agentjax.benchmarks.sft_step import bench_sft_step
from agentjax.benchmarks.synthworld import bench_synthworld
from agentjax.benchmarks.train_step import bench_train_step

BENCHES = {"gpu": bench_gpu, "forward": bench_forward, "decode": bench_decode, "rollout": bench_rollout,
           "decode_window": bench_decode_window,
           "rollout_mix": bench_rollout_mix,
           "packing": bench_packing,
           "info_gain": bench_info_gain, "attention": bench_attention, "rewards": bench_rewards, "synthworld": bench_synthworld,
           "sft_step": bench_sft_step, "judge": bench_judge, "train_step": bench_train_step,
           "coreact": bench_coreact, "ppo_step": bench_ppo_step,
           "fit": bench_fit, "async": bench_async, "compiles": bench_compiles,
           "dense": bench_dense, "dense_fit": bench_dense_fit,
           "server_overload": bench_server_overload}
