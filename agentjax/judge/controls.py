"""Study controls on the judge's bits (the CW-GRPO study's, ours: CW-GRPO, arXiv:2604.14267, gives
the judge's credit but no such controls): noise and random credit.

    retrieval, thinking = apply_noise(retrieval, thinking, judged, config.judge.noise,
                                      config.judge.noise_p, rng)

Modes (`judge.noise`), applied only to rounds that were judged:

  "none"    the judge's bits, unchanged.
  "flip"    each judged bit (retrieval and thinking alike) is flipped independently with
            probability p (`judge.noise_p`): robustness to a noisy judge.
  "random"  every judged round's (retrieval, thinking) pair is redrawn, independently of the round,
            from the judge's own joint distribution of pairs over the judged rounds of the batch
            of its stratum (the trainer passes two: search rounds and answer rounds, so an
            answer round, whose c the oracle never credits but which enters the infinite-gamma
            sum, does not trade credit with the search rounds).
            Each bit is then Bernoulli(its marginal rate: the mean of that bit over the judged
            rounds), and the contribution c = retrieval * thinking keeps the judge's rate as well
            (drawing the two bits independently would give c the rate r_ret * r_think, less credit
            than the judge gives whenever the bits are correlated, as the oracle's are). The
            control keeps how much credit there is and removes where it goes.
"""

from __future__ import annotations

import numpy as np

NOISE_MODES = ("none", "flip", "random")


def apply_noise(retrieval: np.ndarray, thinking: np.ndarray, judged: np.ndarray, mode: str,
                p: float, rng: np.random.Generator,
                strata: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """The bits after the study control `mode` (see the module docstring).

  Args:
    retrieval, thinking: [B, T] int 0/1, the judge's bits.
    judged: [B, T] bool, rounds that were judged; the others are returned as they are.
    mode: "none", "flip" or "random" (config judge.noise).
    p: flip probability in [0, 1] (config judge.noise_p; used by "flip" only).
    rng: the generator the draws come from.
    strata: optional [B, T] int labels; "random" draws each stratum's rounds from that
      stratum's own pairs (e.g. 1 on answer rounds, 0 on search rounds). None: one stratum.
  Returns:
    (retrieval, thinking), new [B, T] arrays of the input dtype.
  Raises:
    ValueError: an unknown mode, p outside [0, 1], or arrays of different shapes.
  """
  if mode not in NOISE_MODES:
    raise ValueError(f"judge.noise: unknown mode {mode!r}; known: {list(NOISE_MODES)}")
  p = float(p)
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"judge.noise_p must be in [0, 1], got {p}")
  retrieval, thinking = np.array(retrieval), np.array(thinking)
  judged = np.asarray(judged, bool)
  if not retrieval.shape == thinking.shape == judged.shape:
    raise ValueError(f"apply_noise: retrieval {retrieval.shape}, thinking {thinking.shape} and "
                     f"judged {judged.shape} must have the same shape")
  if mode == "none" or not judged.any():
    return retrieval, thinking
  if mode == "flip":
    flip_r = rng.random(judged.shape) < p
    flip_t = rng.random(judged.shape) < p
    retrieval = np.where(judged & flip_r, 1 - retrieval, retrieval).astype(retrieval.dtype)
    thinking = np.where(judged & flip_t, 1 - thinking, thinking).astype(thinking.dtype)
    return retrieval, thinking
  # "random": draw each judged round's pair from the empirical joint of its stratum's pairs.
  strata = np.zeros(judged.shape, np.int64) if strata is None else np.asarray(strata)
  if strata.shape != judged.shape:
    raise ValueError(f"apply_noise: strata {strata.shape} must have judged's shape {judged.shape}")
  for label in np.unique(strata[judged]):
    cell = judged & (strata == label)
    pairs = 2 * (retrieval[cell] != 0) + (thinking[cell] != 0)  # 0..3 = (ret, think) bits
    probs = np.bincount(pairs, minlength=4) / pairs.size
    drawn = rng.choice(4, size=int(cell.sum()), p=probs)
    retrieval[cell] = drawn // 2
    thinking[cell] = drawn % 2
  return retrieval, thinking
