"""The L2-penalised multinomial logistic regression of the learned heads and the TF-IDF baseline, solved to its
optimum: per label k a weight vector w_k and a bias b_k minimising

    C · Σ_i −log softmax(W x_i + b)[y_i]  +  ½ Σ_k ‖w_k‖²          (the biases are not penalised)

over the labels present in y, the objective of scikit-learn's LogisticRegression(C); with two labels present,
scikit-learn's one logit vector w with ½‖w‖² is the two-row problem at C/2 (rows −w/2, w/2). tests/fitting/
test_logistic.py holds the two equal.

How, and why it is fast on the small problems a head is chosen on (tens to a few hundred queries, hundreds to
thousands of features, an L2 strength path per fold): the optimal weights lie in the span of the training rows
(the loss's gradient does), so the problem is solved in an orthonormal basis of that span, from the training
rows' n×n Gram matrix (its eigenvectors), with at most n − 1 … n coordinates per row whatever the width. There,
Newton's method with a backtracking line search converges to the optimum in a few steps, each solved through
the Hessian's structure (one block per label minus a rank-n term: Woodbury), without forming it whole. The
result is the optimum itself, not an iterate stopped at a tolerance, so it does not depend on where the solve
starts: the C path warm-starts each fit from the previous one for speed alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TOL = 1e-12  # Newton decrement (≈ 2 × the objective above its optimum), relative to the objective: then one
# more full step, in the quadratic phase, leaves the optimum's digits
MAX_STEPS = 200
_REL_EIG = 1e-12  # eigenvalues of the Gram matrix below this share of the largest are rounding, not spread


class Span:
    """An orthonormal basis of the span of the rows of x [n, d] (dense or scipy sparse): `coords` [n, r] are the
    rows in it; `of(z)` maps other rows onto it; `weights(theta)` maps coefficients back to the d features."""

    def __init__(self, x):
        gram = x @ x.T
        gram = np.asarray(gram.todense() if hasattr(gram, "todense") else gram, dtype=np.float64)
        lam, u = np.linalg.eigh(gram)
        keep = lam > _REL_EIG * max(float(lam.max(initial=0.0)), 0.0)
        s = np.sqrt(lam[keep])
        self.x, self.coords, self._proj = x, u[:, keep] * s, u[:, keep] / s  # coords = gram @ proj

    def of(self, z) -> np.ndarray:
        """[m, r]: rows z [m, d] (the same features) in the basis."""
        k = z @ self.x.T
        return np.asarray(k.todense() if hasattr(k, "todense") else k, dtype=np.float64) @ self._proj

    def weights(self, theta: np.ndarray) -> np.ndarray:
        """[K, d]: coefficients [K, r] on the basis as weights on the features."""
        return np.asarray(self.x.T @ (self._proj @ theta.T)).T


@dataclass
class Solution:
    """Per label present (`classes`, ascending) its coefficients on the basis and its bias (centred: Σ = 0)."""
    classes: np.ndarray
    theta: np.ndarray  # [K, r]
    bias: np.ndarray  # [K]

    def log_proba(self, coords: np.ndarray) -> np.ndarray:
        """[m, K] log-probabilities of the labels present for rows given in the basis."""
        z = coords @ self.theta.T + self.bias
        z -= z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))


def solve(coords: np.ndarray, y: np.ndarray, C: float, start: Solution | None = None) -> Solution:
    """The optimum for rows `coords` [n, r] (in a Span's basis) with labels y, from `start` (a solution of the same
    rows, e.g. at the previous C) or from zero. Raises ValueError when fewer than two labels are present."""
    classes, yy = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"logistic regression needs at least two labels among its {len(y)} training rows; "
                         f"they all have label {classes[0] if len(classes) else None}")
    n, r = coords.shape
    K = len(classes)
    c_eff = C / 2 if K == 2 else C  # scikit-learn's binary problem (module docstring)
    f = np.empty((n, r + 1))
    f[:, :r], f[:, r] = coords, 1.0
    pen = np.full(r + 1, 1.0 / c_eff)
    pen[r] = 0.0
    th = np.zeros((K, r + 1))
    if start is not None and np.array_equal(start.classes, classes):
        th[:, :r], th[:, r] = start.theta, start.bias
    onehot = np.zeros((n, K))
    onehot[np.arange(n), yy] = 1.0
    z = f @ th.T
    obj, p = _objective(z, yy, th, pen)
    for _ in range(MAX_STEPS):
        grad = (p - onehot).T @ f + pen * th
        step = _newton_step(f, p, grad, pen)
        dec = -float(np.sum(grad * step))
        dz = f @ step.T
        if dec <= TOL * max(1.0, obj):
            th += step
            break
        t = 1.0
        while True:  # backtracking (Armijo) on the objective along the step
            new_obj, new_p = _objective(z + t * dz, yy, th + t * step, pen)
            if new_obj <= obj - 1e-4 * t * dec or t < 1e-12:
                break
            t *= 0.5
        th, z, obj, p = th + t * step, z + t * dz, new_obj, new_p
    else:
        raise RuntimeError(f"logistic regression: Newton's method did not converge in {MAX_STEPS} steps "
                           f"(n={n}, {r} coordinates, {K} labels, C={C})")
    bias = th[:, r] - th[:, r].mean()  # the biases are defined up to a common shift: centred, as scikit-learn's
    return Solution(classes, th[:, :r].copy(), bias)


def _objective(z: np.ndarray, y: np.ndarray, th: np.ndarray, pen: np.ndarray) -> tuple[float, np.ndarray]:
    """(Σ_i cross-entropy + ½ Σ pen θ², probabilities) for logits z [n, K] (the objective / C)."""
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    s = e.sum(1, keepdims=True)
    ce = float(np.sum(np.log(s[:, 0]) + m[:, 0] - z[np.arange(len(y)), y]))
    return ce + 0.5 * float(np.sum(pen * th * th)), e / s


def _newton_step(f: np.ndarray, p: np.ndarray, g: np.ndarray, pen: np.ndarray) -> np.ndarray:
    """−H⁻¹ g for H = Σ_i (diag p_i − p_i p_iᵀ) ⊗ f_i f_iᵀ + diag(pen) per label, written as blockdiag(B_k) − RᵀR
    with B_k = fᵀ diag(p_k) f + diag(pen) and R_k = diag(p_k) f [n, m], and solved by Woodbury through the n×n
    matrix I − Σ_k R_k B_k⁻¹ R_kᵀ. That matrix is singular along 1 (H is along a common shift of the biases,
    which the loss does not see and nothing penalises): adding 11ᵀ/n makes it definite and leaves the step
    unchanged up to such a shift."""
    n, m = f.shape
    r = p.T[:, :, None] * f[None]  # [K, n, m]
    b = np.matmul(r.transpose(0, 2, 1), f)  # [K, m, m]
    b[:, np.arange(m), np.arange(m)] += pen
    sol = np.linalg.solve(b, np.concatenate([r.transpose(0, 2, 1), g[:, :, None]], axis=2))  # [K, m, n + 1]
    x, bg = sol[:, :, :n], sol[:, :, n]
    mat = np.eye(n) + 1.0 / n - np.matmul(r, x).sum(0)
    w = np.linalg.solve(mat, np.einsum("kim,km->i", r, bg))
    return -(bg + np.matmul(x, w))
