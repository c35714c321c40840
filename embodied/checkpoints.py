"""Checkpoint files: the folders a run saves, how they are checked, and how a run is matched to them.

A step checkpoint is `checkpoints/step_<k>/` (`state.json`, `model.safetensors`, `replay_online.npz`); the
pretraining a run ends its offline phase with is `checkpoints/pretrained/` (`state.json`,
`model.safetensors`). Every folder is written to a temporary sibling and renamed into place, and read back
in full before anything resumes from it, so a damaged file is one line naming it, never a half-restored run.
Tensors go through safetensors and arrays through `np.load(allow_pickle=False)`: nothing here unpickles.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from embodied.errors import CheckpointError, ConfigError

PRETRAINED_DIR = "pretrained"  # checkpoints/<this>: the agent at the end of offline training


# -- checkpoint files -----------------------------------------------------------------------------------
# A step checkpoint is a folder checkpoints/step_<k>/ holding these files, all written by _write_folder.
CHECKPOINT_FILES = ("state.json", "model.safetensors", "replay_online.npz")
CHECKPOINT_STATE_KEYS = ("phase", "offline_step", "online_step", "episodes_done", "end_of_offline",
                         "eval_history", "rng", "config")


@dataclass
class Checkpoint:
    """The validated contents of one step checkpoint, read once before a resume touches anything."""
    path: Path
    state: dict
    tensors: dict
    replay: dict


def find_checkpoints(run_dir: str | Path) -> list[Path]:
    """Step checkpoint folders of a run, oldest first (half-written `.tmp_*` folders are not checkpoints)."""
    root = Path(run_dir) / "checkpoints"
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def fallback(path: Path) -> str:
    """The fix for a bad checkpoint: move it aside (never delete: it is the user's data) and name what is left."""
    earlier = [p for p in find_checkpoints(path.parent.parent) if p.name < path.name]
    then = f"to resume from {earlier[-1].name}" if earlier else "and resume=true starts the run over"
    return f"move {path} out of checkpoints/ {then}"


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read and check every file of a step checkpoint; any defect is a one-line CheckpointError naming the file.

    The replay archive is read in full, so a truncated or bit-flipped .npz fails here (zip CRC), not mid-resume."""
    path = Path(path)
    for name in CHECKPOINT_FILES:
        if not (path / name).is_file():
            raise CheckpointError(f"checkpoint {path} has no {name} (it is incomplete); {fallback(path)}")

    def corrupt(name: str, err: BaseException) -> CheckpointError:
        return CheckpointError(f"checkpoint file {path / name} is corrupt or truncated "
                               f"({type(err).__name__}: {first_line(err)}); {fallback(path)}")

    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise corrupt("state.json", err) from None
    missing = [key for key in CHECKPOINT_STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise corrupt("state.json", KeyError(f"missing {', '.join(missing)}"))
    if state["phase"] not in ("offline", "online"):
        raise corrupt("state.json", ValueError(f"phase={state['phase']!r}"))
    try:
        tensors = load_file(str(path / "model.safetensors"))
    except (OSError, ValueError, SafetensorError) as err:
        raise corrupt("model.safetensors", err) from None
    if "torch_rng" not in tensors:
        raise corrupt("model.safetensors", KeyError("no torch_rng tensor"))
    try:
        with np.load(path / "replay_online.npz", allow_pickle=False) as archive:
            replay = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        raise corrupt("replay_online.npz", err) from None
    return Checkpoint(path, state, tensors, replay)


def check_checkpoint_config(ckpt: Checkpoint, config: dict) -> None:
    """A checkpoint resumes only the run that wrote it: a differing setting is named, not left to surface as a
    tensor size mismatch. Keys this code added since the checkpoint was written are not compared."""
    saved, mine = ckpt.state["config"], jsonable(config)
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint file {ckpt.path / 'state.json'} has no run config; {fallback(ckpt.path)}")
    differ = []
    for key in sorted(set(saved) & set(mine)):
        theirs, ours = saved[key], mine[key]
        if isinstance(theirs, dict) and isinstance(ours, dict):
            differ += [f"{key}.{k} (checkpoint {theirs.get(k, '<unset>')!r}, this run {ours.get(k, '<unset>')!r})"
                       for k in sorted({*theirs, *ours}) if theirs.get(k, "<unset>") != ours.get(k, "<unset>")]
        elif theirs != ours:
            differ.append(f"{key} (checkpoint {theirs!r}, this run {ours!r})")
    if differ:
        more = f" and {len(differ) - 2} more" if len(differ) > 2 else ""
        raise CheckpointError(f"checkpoint {ckpt.path} was written with other settings: {'; '.join(differ[:2])}{more}; "
                              "resume with the run's own config: resume=true hydra.run.dir=<run>, no other overrides")


def write_folder(final: Path, tensors: dict, state: dict, **arrays: dict) -> Path:
    """model.safetensors + state.json (+ one .npz per `arrays` entry) written to a temporary sibling, then
    renamed into place: a crash mid-write never leaves a half-written checkpoint under `final`."""
    tmp = final.with_name(f".tmp_{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"))
    for name, values in arrays.items():
        np.savez(tmp / f"{name}.npz", **values)
    (tmp / "state.json").write_text(json.dumps(state, default=float))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def jsonable(value):
    """What a value reads back as from JSON (tuples become lists), for comparing configs."""
    return json.loads(json.dumps(value, default=float))


# -- pretrain once, fine-tune many ------------------------------------------------------------------------
# Only the fields that shape the pretrained agent must match between the pretraining run and a run that
# starts from it; everything online (presets, temperature, UTD, budgets) is free to differ.
PRETRAINED_MATCH = ("env", "offline_algo", "offline_agent", "gamma", "reward_scale", "reward_bias",
                    "sparse_failure_reward", "device")
# agent options that set how it computes, not what it is: a bf16 pretraining fine-tunes in fp32 (the weights
# are fp32 either way), which is what comparing the two precisions from one pretraining needs
PRETRAINED_FREE_OPTIONS = ("bf16",)


def pretrained_folder(path: str | Path) -> Path:
    """A run directory or its checkpoints/pretrained folder -> the folder."""
    path = Path(path)
    return path / "checkpoints" / PRETRAINED_DIR if (path / "checkpoints").is_dir() else path


def dataset_fingerprint(dataset) -> str | None:
    """A short hash of the transitions a pretraining learnt from: the same size and config can still be other
    data (`dataset.env`, `dataset.quality`, `dataset.path`), and a pretrained= run must start from its own.
    Images are left out (a suite's states, actions and rewards already tell its files apart)."""
    if dataset is None:
        return None
    digest = hashlib.sha256()
    for key in ("observations", "actions", "rewards"):
        values = getattr(dataset, key, None)
        if values is not None:
            digest.update(key.encode())
            digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()[:16]


def read_pretrained(path: str | Path, config: dict, dataset) -> tuple[dict, dict]:
    """(state, tensors) of a saved pretraining, after checking that it was made with this run's settings and
    data (a pretraining saved before the data fingerprint existed is checked on its size only)."""
    folder = pretrained_folder(path)
    if not (folder / "state.json").is_file():
        raise CheckpointError(f"pretrained={path} has no saved pretraining (looked for {folder}/state.json); "
                              "pass a run directory whose offline phase finished")
    try:
        state = json.loads((folder / "state.json").read_text())
        tensors = load_file(str(folder / "model.safetensors"))
    except (OSError, ValueError, SafetensorError) as err:
        raise CheckpointError(f"pretrained={folder} is corrupt or incomplete ({type(err).__name__}: {err}); "
                              "rerun its pretraining") from None
    saved, mine = state["config"], jsonable(config)
    for key in PRETRAINED_MATCH:
        theirs, ours = saved.get(key), mine.get(key)
        if isinstance(theirs, dict) and isinstance(ours, dict):  # name the options that differ, not the dicts
            differ = sorted(k for k in {*theirs, *ours} - set(PRETRAINED_FREE_OPTIONS)
                            if theirs.get(k, "<unset>") != ours.get(k, "<unset>"))
            theirs = {k: theirs.get(k, "<unset>") for k in differ}
            ours = {k: ours.get(k, "<unset>") for k in differ}
        if theirs != ours:
            raise ConfigError(f"pretrained={path} was trained with {key}={theirs!r}, this run has "
                              f"{key}={ours!r}; use the same setting or pretrain anew")
    dataset_size = None if dataset is None else len(dataset)
    if state.get("dataset_size") != dataset_size:
        raise ConfigError(f"pretrained={path} was trained on {state.get('dataset_size')} transitions, this run "
                          f"loads {dataset_size}; use the same dataset.size or pretrain anew")
    saved_print = state.get("dataset_fingerprint")
    if saved_print is not None and saved_print != (this_print := dataset_fingerprint(dataset)):
        raise ConfigError(f"pretrained={path} was trained on other data of the same size (dataset fingerprint "
                          f"{saved_print}, this run's {this_print}); use the pretraining's "
                          "dataset.env, dataset.quality and dataset.path, or pretrain anew")
    return state, tensors
