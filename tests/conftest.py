"""Test-wide defaults: headless MuJoCo rendering and no wandb network traffic."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("WANDB_MODE", "disabled")
