"""Geometry shared by the safety chain, the measured-state monitor, the sim server and the drivers."""
from __future__ import annotations

import numpy as np


def box_distance_m(p, lo, hi) -> float:
    """How far point `p` is outside the axis-aligned box [lo, hi] (0 inside), in the points' units."""
    p = np.asarray(p, np.float64)
    return float(np.linalg.norm(np.maximum(np.asarray(lo) - p, 0) + np.maximum(p - np.asarray(hi), 0)))


def rotvec_to_matrix(rv: np.ndarray) -> np.ndarray:
    """Rotation matrix of a rotation vector (axis times angle, rad), by Rodrigues' formula."""
    angle = float(np.linalg.norm(rv))
    if angle < 1e-12:
        return np.eye(3)
    k = rv / angle
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(angle) * kx + (1 - np.cos(angle)) * kx @ kx
