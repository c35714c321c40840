"""Experiment logging: every metric lands in `metrics.jsonl` first, wandb second.

The JSONL file is the record the summary command and the plots read, so it is written even when
wandb is disabled, misconfigured or unreachable, and flushed line by line so a killed run keeps
everything it logged.
"""
from __future__ import annotations

import json
import os
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
WANDB_ID_FILE = ".wandb_run_id"  # lets a resumed run continue the same wandb run

PHASE_ORDER = {"offline": 0, "online": 1}
WANDB_INIT_TIMEOUT_S = 60


def to_jsonable(value: Any) -> Any:
    """Turn numpy/torch scalars (and containers of them) into plain Python values for JSON."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    size = getattr(value, "size", None)
    if callable(size):  # torch.Tensor.size is a method; numel is the element count
        size = value.numel()
    if hasattr(value, "item") and size == 1:
        return value.item()  # numpy/torch scalar -> float, int or bool
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON via a temporary file and rename, so readers never see half a file."""
    path = Path(path)
    text = json.dumps(to_jsonable(data), indent=2, sort_keys=True) + "\n"
    _write_text_atomic(path, text)


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_metrics(run_dir: str | Path) -> list[dict]:
    """All metric lines of a run (a run dir or a metrics.jsonl path); [] when there are none.

    A line that is not valid JSON (e.g. cut short when the run was killed) is skipped with a warning.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.exists():
        return []
    lines, bad = _parse_lines(path.read_text(encoding="utf-8").splitlines())
    if bad:
        warnings.warn(f"{path}: skipped {bad} unreadable line(s)", stacklevel=2)
    return lines


def _parse_lines(raw_lines: Iterable[str]) -> tuple[list[dict], int]:
    parsed, bad = [], 0
    for raw in raw_lines:
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(record, dict):
            parsed.append(record)
        else:
            bad += 1
    return parsed, bad


def resolve_wandb_mode(wandb_mode: str, enabled: bool = True) -> str:
    """The wandb mode to use: WANDB_MODE in the environment wins over the config value."""
    if not enabled or os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        return "disabled"
    mode = os.environ.get("WANDB_MODE") or wandb_mode or "offline"
    return "offline" if mode == "dryrun" else mode


class RunLogger:
    """Metrics for one run: `metrics.jsonl` always, wandb (offline by default) when enabled.

    `log` adds `total_step` (offline gradient steps so far + online env steps) when the caller
    does not, so offline and online points share one x axis. Reopening an existing run dir appends.
    """

    def __init__(self, run_dir: str | Path, config: dict | None = None, wandb_mode: str = "offline",
                 project: str = "embodied", group: str | None = None, name: str | None = None,
                 enabled_wandb: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.summary_path = self.run_dir / SUMMARY_FILE
        self.wandb_mode = resolve_wandb_mode(wandb_mode, enabled_wandb)
        self.offline_steps = 0  # set explicitly when offline training was skipped (loaded checkpoint)
        self._wandb_run = None
        self._wandb_warned = False
        self._closed = False
        self._repair_partial_tail()
        self._recover_offline_steps(read_metrics(self.metrics_path))
        self._file = open(self.metrics_path, "a", encoding="utf-8")
        if self.wandb_mode != "disabled":
            self._start_wandb(config or {}, project, group, name)

    # ---- JSONL -------------------------------------------------------------------------------

    def log(self, metrics: dict, step: int, phase: str, kind: str) -> dict:
        """Record one line of metrics; returns the record as written."""
        if self._closed:
            raise RuntimeError("RunLogger.log called after close()")
        step = int(to_jsonable(step))
        record = {"step": step, "phase": phase, "kind": kind}
        record.update({str(key): to_jsonable(value) for key, value in metrics.items()})
        record.setdefault("total_step", self._total_step(step, phase))
        if phase == "offline":
            self.offline_steps = max(self.offline_steps, step)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._log_wandb(record)
        return record

    def _total_step(self, step: int, phase: str) -> int:
        return step + self.offline_steps if phase == "online" else step

    def _recover_offline_steps(self, lines: list[dict]) -> None:
        offline = [line.get("step", 0) for line in lines if line.get("phase") == "offline"]
        self.offline_steps = max(offline, default=0)

    def _repair_partial_tail(self) -> None:
        """Drop a last line cut short by a kill, so new lines do not glue onto it."""
        if not self.metrics_path.exists() or self.metrics_path.stat().st_size == 0:
            return
        text = self.metrics_path.read_text(encoding="utf-8")
        if not text.endswith("\n"):
            complete = text[: text.rfind("\n") + 1]
            _write_text_atomic(self.metrics_path, complete)

    def truncate_after(self, step: int, phase: str | None = None) -> int:
        """Drop lines logged after `step`, for resuming from a checkpoint taken at that step.

        With `phase` ("offline"/"online"), `step` counts within that phase: later lines of the same
        phase and every line of a later phase go. Without it, `step` is compared to each line's
        `total_step`. The file is rewritten atomically. Returns the number of lines dropped.
        """
        self._file.close()
        lines = read_metrics(self.metrics_path)
        kept = [line for line in lines if not self._is_after(line, step, phase)]
        _write_text_atomic(self.metrics_path, "".join(json.dumps(line) + "\n" for line in kept))
        self._recover_offline_steps(kept)
        self._file = open(self.metrics_path, "a", encoding="utf-8")
        return len(lines) - len(kept)

    @staticmethod
    def _is_after(line: dict, step: int, phase: str | None) -> bool:
        line_step = line.get("step", 0)
        if phase is None:
            return line.get("total_step", line_step) > step
        line_order = PHASE_ORDER.get(line.get("phase"), PHASE_ORDER.get(phase))
        return (line_order, line_step) > (PHASE_ORDER.get(phase), step)

    # ---- summary -----------------------------------------------------------------------------

    def summary(self, values: dict) -> None:
        """Write summary.json (atomically, whole dict) and mirror it into wandb.summary."""
        values = to_jsonable(values)
        write_json_atomic(self.summary_path, values)
        if self._wandb_run is not None:
            try:
                self._wandb_run.summary.update(values)
            except Exception as err:  # noqa: BLE001 - wandb trouble must not stop training
                self._wandb_failed("summary update", err)

    # ---- wandb -------------------------------------------------------------------------------

    def _start_wandb(self, config: dict, project: str, group: str | None, name: str | None) -> None:
        try:
            import wandb

            id_path = self.run_dir / WANDB_ID_FILE
            run_id = id_path.read_text().strip() if id_path.exists() else secrets.token_hex(4)
            self._wandb_run = wandb.init(
                dir=str(self.run_dir), mode=self.wandb_mode, project=project, group=group,
                name=name, config=to_jsonable(config), id=run_id, resume="allow",
                reinit="create_new", settings=wandb.Settings(init_timeout=WANDB_INIT_TIMEOUT_S))
            id_path.write_text(run_id + "\n")
            self._wandb_run.define_metric("total_step")
            self._wandb_run.define_metric("*", step_metric="total_step")
        except Exception as err:  # noqa: BLE001 - any wandb failure falls back to JSONL only
            self._wandb_run = None
            self._wandb_failed("init", err)

    def _log_wandb(self, record: dict) -> None:
        if self._wandb_run is None:
            return
        numeric = {key: value for key, value in record.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)
                   and key not in ("step", "phase", "kind")}
        numeric[f"{record['phase']}/step"] = record["step"]
        try:
            self._wandb_run.log(numeric)
        except Exception as err:  # noqa: BLE001
            self._wandb_failed("log", err)

    def _wandb_failed(self, what: str, err: Exception) -> None:
        if not self._wandb_warned:
            warnings.warn(f"wandb {what} failed ({type(err).__name__}: {err}); "
                          f"metrics continue in {self.metrics_path} only", stacklevel=3)
            self._wandb_warned = True

    # ---- lifecycle ---------------------------------------------------------------------------

    def close(self, exit_code: int = 0) -> None:
        """Close the JSONL file and finish the wandb run; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        if self._wandb_run is not None:
            try:
                self._wandb_run.finish(exit_code=exit_code)
            except Exception as err:  # noqa: BLE001
                self._wandb_failed("finish", err)
            self._wandb_run = None

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(exit_code=0 if exc_type is None else 1)
