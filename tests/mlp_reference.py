"""The built-in MLPs' arithmetic, written out one IEEE operation at a time.

This is the executable form of the contract in docs/policies.md ("Exact
arithmetic"): every built-in MLP implementation (the C kernel of the Python
worker, the Node worker) must give these bits. It is slow on purpose: each
line is one rounded float32 (or float64) operation, in the contract's order,
so a reader can check an implementation against it line by line. Tests only.

Conventions: ``f32(x)`` rounds to float32; numpy float32 arrays and scalars
compute in float32 with one rounding per operation (no fused multiply-add,
no reassociation), float64 ones in float64.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
F64 = np.float64

# ---------------------------------------------------------------- tanh (f32)
# A rational approximation, odd numerator of degree 13 over even denominator
# of degree 6 (the coefficients of Eigen's float tanh), inputs clamped.
TANH_CLAMP = F32(7.90531110763549805)
TANH_TINY = F32(0.0004)
TANH_ALPHA = [  # x^13 .. x^1, Horner order
    F32(-2.76076847742355e-16),
    F32(2.00018790482477e-13),
    F32(-8.60467152213735e-11),
    F32(5.12229709037114e-08),
    F32(1.48572235717979e-05),
    F32(6.37261928875436e-04),
    F32(4.89352455891786e-03),
]
TANH_BETA = [  # x^6 .. x^0, Horner order
    F32(1.19825839466702e-06),
    F32(1.18534705686654e-04),
    F32(2.26843463243900e-03),
    F32(4.89352518554385e-03),
]


def tanh32(a: np.ndarray) -> np.ndarray:
    """Elementwise float32 tanh of the contract (NaN in, NaN out)."""
    a = np.asarray(a, dtype=F32)
    x = np.where(a > TANH_CLAMP, TANH_CLAMP, a)
    x = np.where(x < -TANH_CLAMP, -TANH_CLAMP, x).astype(F32)
    x2 = x * x
    p = np.full_like(x, TANH_ALPHA[0])
    for c in TANH_ALPHA[1:]:
        p = x2 * p
        p = p + c
    p = x * p
    q = np.full_like(x, TANH_BETA[0])
    for c in TANH_BETA[1:]:
        q = x2 * q
        q = q + c
    r = p / q
    return np.where(np.abs(a) < TANH_TINY, a, r).astype(F32)


def relu32(a: np.ndarray) -> np.ndarray:
    """``0 if x < 0 else x``: NaN and -0.0 pass through unchanged."""
    a = np.asarray(a, dtype=F32)
    return np.where(a < 0, F32(0.0), a).astype(F32)


# ----------------------------------------------------------------- exp (f32)
EXP_HI = F32(88.72283935546875)  # above: +inf
EXP_LO = F32(-103.97208404541015625)  # below: 0
EXP_LOG2E = F32(1.44269504088896341)
EXP_C1 = F32(0.693359375)
EXP_C2 = F32(-2.12194440e-4)
EXP_P = [  # Horner order
    F32(1.9875691500e-4),
    F32(1.3981999507e-3),
    F32(8.3334519073e-3),
    F32(4.1665795894e-2),
    F32(1.6666665459e-1),
    F32(5.0000001201e-1),
]


def exp32(x: float | np.floating) -> np.float32:
    """float32 exp of the contract (Cephes' expf, scaled in two exact steps)."""
    x = F32(x)
    if math.isnan(x):
        return x
    if x > EXP_HI:
        return F32(math.inf)
    if x < EXP_LO:
        return F32(0.0)
    n = math.floor(F32(x * EXP_LOG2E) + F32(0.5))
    fn = F32(n)
    r = F32(x - F32(fn * EXP_C1))
    r = F32(r - F32(fn * EXP_C2))
    z = F32(r * r)
    y = EXP_P[0]
    for c in EXP_P[1:]:
        y = F32(F32(y * r) + c)
    y = F32(F32(F32(y * z) + r) + F32(1.0))
    # 2**n in two factors, each a normal float32 for n in [-150, 128]; the
    # first product is exact, so only the second one rounds.
    n1 = n // 2
    n2 = n - n1
    return F32(F32(y * F32(2.0**n1)) * F32(2.0**n2))


# ----------------------------------------------------------------- log (f64)
LOG_SQRT_HALF = 0.70710678118654752440
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
#: 1 / (2k + 1) for k = 11 .. 1, the double nearest each, Horner order.
LOG_SERIES = [1.0 / (2 * k + 1) for k in range(11, 0, -1)]


def log64(z: float) -> float:
    """float64 natural log of the contract, for finite z >= 1 (the categorical's Z).

    ``z = m * 2**e`` with m in [sqrt(1/2), sqrt(2)), then
    ``log(m) = 2 atanh(s)`` with ``s = (m - 1) / (m + 1)``, a series in s**2.
    """
    m, e = math.frexp(z)  # m in [0.5, 1), exact
    if m < LOG_SQRT_HALF:
        m, e = m * 2.0, e - 1
    f = m - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    p = LOG_SERIES[0]
    for c in LOG_SERIES[1:]:
        p = p * s2 + c
    p = p * s2 + 1.0
    log_m = (2.0 * s) * p
    return e * LN2_HI + (log_m + e * LN2_LO)


# --------------------------------------------------------------- the network
def dense32(h: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[j] = (((0 + h[0] w[0, j]) + h[1] w[1, j]) + ...) + b[j]`` in float32."""
    h, w, b = (np.asarray(v, dtype=F32) for v in (h, w, b))
    acc = np.zeros((h.shape[0], w.shape[1]), dtype=F32)
    for k in range(w.shape[0]):
        acc = acc + h[:, k : k + 1] * w[k]
    return (acc + b).astype(F32)


ACTIVATIONS = {"tanh": tanh32, "relu": relu32, "identity": lambda a: np.asarray(a, dtype=F32)}


def forward32(
    h0: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]], activation: str
) -> np.ndarray:
    """The MLP's outputs (N, O) for encoded observations ``h0`` (N, D)."""
    h = np.asarray(h0, dtype=F32)
    for weight, bias in layers[:-1]:
        h = ACTIVATIONS[activation](dense32(h, weight, bias))
    return dense32(h, *layers[-1])


# ----------------------------------------------------------- distributions
def categorical_row(logits: np.ndarray, u: float | None) -> tuple[int, np.float32]:
    """One row's index and log-probability (u None: deterministic)."""
    logits = np.asarray(logits, dtype=F32)
    m = logits[0]
    for v in logits[1:]:
        m = max(m, v)  # keeps the first of equal values
    s = [F32(v - m) for v in logits]
    e = [exp32(v) for v in s]
    c, total = [], 0.0
    for v in e:
        total = total + float(v)
        c.append(total)
    if u is None:
        index = next(i for i, v in enumerate(logits) if v == m)
    else:
        t = u * total
        above = [i for i, v in enumerate(c) if v > t]
        # None above t (t rounded up to Z): the last index of positive weight.
        index = above[0] if above else max(i for i, v in enumerate(e) if v > 0)
    return index, F32(float(s[index]) - log64(total))


HALF_LOG_2PI = 0.91893853320467274178  # the double nearest 0.5 * log(2 pi)


def gaussian_row(
    mean: np.ndarray, log_std: np.ndarray, eps: np.ndarray | None
) -> tuple[np.ndarray, np.float32]:
    """One row's action (float32) and log-density (eps None: the mean, z = 0)."""
    mean = np.asarray(mean, dtype=F32)
    log_std = np.asarray(log_std, dtype=F32)
    z = np.zeros(len(mean), dtype=F32) if eps is None else np.asarray(eps).astype(F32)
    if eps is None:
        action = mean.copy()
    else:
        action = np.array(
            [F32(mj + F32(exp32(lj) * zj)) for mj, lj, zj in zip(mean, log_std, z, strict=True)],
            dtype=F32,
        )
    total = 0.0
    for zj, lj in zip(z, log_std, strict=True):
        zz = float(zj)
        total = total + (((-0.5 * zz) * zz - float(lj)) - HALF_LOG_2PI)
    return action, F32(total)
