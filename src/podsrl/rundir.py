"""The run folder: one run at a time, and nothing left behind that blocks a rerun.

The main process takes an exclusive ``flock`` on ``<output_dir>/.podsrl.lock`` before it looks at
the folder, and holds it until the run ends; the kernel drops the lock when the process dies, so a
killed run leaves no stale lock. A second run into the same folder is refused at once.

The lock file also marks the folder as podsrl's. A run killed before its first checkpoint leaves
the lock file and some of podsrl's own files (:data:`OWN`) without a complete checkpoint; a rerun
clears such a folder and starts afresh. A run that fails or is interrupted before it finished a
step leaves the folder as it found it (removed if it made it); once a step is logged, the folder
keeps its metrics (and its checkpoint, if any), marked as podsrl's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from podsrl.checkpoint import latest_checkpoint, read_metrics
from podsrl.errors import PodsError, first_line, os_reason

log = logging.getLogger(__name__)

LOCK = ".podsrl.lock"
COMPARE_LOCK = ".podsrl-compare.lock"
"""``podsrl compare``'s lock on its --out folder: one comparison at a time writes there."""
TRACKER_FOLDER = "podsrl"
"""accelerate's trackers log under ``<output_dir>/<project name>/``; the trainer names the project this."""
COMMIT_FILE = "podsrl_commit.txt"
"""A line per start of a run: the podsrl commit it trained with (:func:`source_commit`), whether it
started or resumed, when (UTC), and on what (:func:`machine`): a run's CPU clock is comparable
only between starts on the same processor."""
OWN = {LOCK, "config.yaml", ".config.yaml.tmp", "metrics.jsonl", ".metrics.jsonl.tmp", "completions.jsonl",
       ".completions.jsonl.tmp", "eval_completions.jsonl", ".eval_completions.jsonl.tmp", "checkpoints",
       TRACKER_FOLDER, ".aim", "final_model", COMMIT_FILE, "rollouts.jsonl"}
"""What podsrl writes into a run folder: the files, the checkpoints, the trackers' logs."""
EARLIER_CONFIG = "config.before-step-{step:06d}.yaml"
"""The config a run was trained with up to a resume that changed it (``allow_config_change``)."""


def source_commit() -> str:
    """The git commit of the podsrl checkout this process imports, with ``+dirty`` where its tracked
    files differ from it, for a run's folder to name the code that made it; ``unknown`` outside a
    git checkout (an installed wheel)."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine(device: str = "cpu") -> str:
    """What this process trains on, in words: the processor's model name and logical CPU count
    (Linux's ``/proc/cpuinfo``; the platform's processor name elsewhere), torch's thread count, and
    the accelerator where ``device`` is one (``cuda:0``: its name)."""
    import platform

    import torch

    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    cpu = names[0] if names else (platform.processor() or platform.machine() or "unknown processor")
    said = f"{os.cpu_count() or '?'} x {cpu}, {torch.get_num_threads()} torch threads"
    if device.startswith("cuda") and torch.cuda.is_available():
        said += f", {torch.cuda.get_device_name(torch.device(device))}"
    return said


def record_start(folder: Path, start_step: int, replayed_to: int = 0, device: str = "cpu") -> None:
    """Append this start of the run in ``folder`` to its :data:`COMMIT_FILE`, so that a reader can
    tell which code made each part of it, and on what machine (``replayed_to``: the last logged step
    it trains again; ``device``: the accelerator's, for :func:`machine`)."""
    how = "resumed" if start_step else "started"
    if replayed_to > start_step:
        how += f", replaying steps {start_step + 1}-{replayed_to}"
    with open(folder / COMMIT_FILE, "a") as f:
        f.write(f"{source_commit()} {how} {datetime.now(timezone.utc).isoformat(timespec='seconds')} "
                f"on {machine(device)}\n")


def is_own(name: str) -> bool:
    """Whether podsrl writes a file or folder of this name into a run folder."""
    return name in OWN or (name.startswith("config.before-step-") and name.endswith(".yaml"))


class RunFolder:
    """``output_dir`` held by this run. On processes other than the main one it holds nothing."""

    def __init__(self, path: Path, resume_from: Path | None, created: Path | None = None, fd: int | None = None):
        self.path, self.resume_from, self._fd = path, resume_from, fd
        self.created = created
        """The outermost folder this run made (``path`` or one of its parents), if any."""
        self.logged_step = 0
        """The last step whose metrics this run wrote (the trainer sets it)."""

    @contextmanager
    def cleanup_on_failure(self):
        """On any exception (Ctrl-C included), release the folder, leaving it as it was found
        unless it already holds a complete checkpoint or a finished step's metrics; then re-raise."""
        try:
            yield
        except BaseException:
            self.release(failed=True)
            raise

    def release(self, failed: bool = False) -> None:
        if self._fd is None:
            return
        try:
            if failed:
                for cut_short in (self.path / "checkpoints").glob(".tmp-*"):
                    shutil.rmtree(cut_short, ignore_errors=True)
            checkpoint = latest_checkpoint(self.path)
            if failed and checkpoint is None and not self.logged_step:
                _clear(self.path, keep_lock=False)
                _remove_made_folders(self.path, self.created)
            elif checkpoint is not None or not self.logged_step:
                (self.path / LOCK).unlink(missing_ok=True)
            # finished steps' metrics without a checkpoint: the lock file stays, marking an unfinished
            # run of podsrl's
        finally:
            os.close(self._fd)
            self._fd = None

    def kept(self, save_every: int = 0) -> str:
        """What a run that stopped early left in its folder, in words ("" where it left nothing);
        ``save_every``: the run's (where it is 0, saving periodically is suggested)."""
        checkpoint = latest_checkpoint(self.path)
        if checkpoint is not None:
            return (f"{self.path} keeps its metrics and the checkpoint of step {int(checkpoint.name[5:])} "
                    "(resume=true continues from it)")
        if self.logged_step:
            advice = "" if save_every else " (save_every saves one)"
            return (f"{self.path} keeps the metrics of steps 1-{self.logged_step} and no checkpoint{advice}: a rerun "
                    "starts it again, or with replay=true trains those steps again, checked against their records")
        return ""


def claim(path: Path, resume: bool, accelerator, replay: bool = False) -> RunFolder:
    """Lock ``path`` for this run and decide where it starts: the latest checkpoint (``resume``),
    or step 0 in a folder that is new, empty, or an unfinished run without a checkpoint (cleared,
    unless ``replay`` keeps its logged steps to train again). Only the main process touches the
    folder; the others learn the outcome from it."""
    folder, error = None, None
    if accelerator.is_main_process:
        try:
            folder = _claim(path, resume, replay)
        except PodsError as e:
            error = str(e)
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        start = str(folder.resume_from) if folder and folder.resume_from else None
        error, start = broadcast_object_list([error, start])
        if folder is None and error is None:
            folder = RunFolder(path, Path(start) if start else None)
    if error is not None:
        raise PodsError(error)
    return folder


def _claim(path: Path, resume: bool, replay: bool = False) -> RunFolder:
    try:
        if resume and not path.exists():
            raise PodsError(f"resume=true but {path} does not exist")
        created = next((p for p in reversed([path, *path.parents]) if not p.exists()), None)
        path.mkdir(parents=True, exist_ok=True)
        fd, marked = _lock(path)
    except OSError as e:
        raise PodsError(f"cannot write output_dir {path}: {os_reason(e)}") from None
    try:
        return RunFolder(path, _start(path, resume, marked, replay), created, fd)
    except BaseException:  # refused: leave the folder exactly as it was found
        if not marked:
            (path / LOCK).unlink(missing_ok=True)
        os.close(fd)
        raise


def discard_unfinished(path: Path) -> None:
    """Clear podsrl's own files from ``path`` unless it holds a checkpoint, marked or not: for a
    caller that owns its run folders (``podsrl compare``). Refused while another run holds it."""
    fd, _ = _lock(path)
    try:
        if latest_checkpoint(path) is None:
            _clear(path, keep_lock=False)
    finally:
        (path / LOCK).unlink(missing_ok=True)
        os.close(fd)


def how_to_start(path: Path, replay: bool = True) -> str:
    """How a caller that owns its run folders (``podsrl compare``, the benchmark drivers) trains
    the run in ``path`` on: ``"resume"`` from its latest checkpoint; else, with ``replay`` and logged
    steps, ``"replay"`` them (trained again on their recorded completions, each checked against its
    record); else ``"fresh"``, from step 0, an unfinished run's files cleared first
    (:func:`discard_unfinished`; refused while another run holds the folder)."""
    if latest_checkpoint(path) is not None:
        return "resume"
    if replay and finished_steps(path):
        return "replay"
    if path.is_dir():
        discard_unfinished(path)
    return "fresh"


@contextmanager
def comparison_lock(out: Path):
    """Hold ``out`` for one ``podsrl compare``: another one into it is refused at once."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, _ = _lock(out, COMPARE_LOCK, "--out {path} is in use by another podsrl compare")
    except OSError as e:  # a folder that cannot be made or written
        raise PodsError(f"cannot write --out {out}: {os_reason(e)}") from None
    try:
        yield
    finally:
        (out / COMPARE_LOCK).unlink(missing_ok=True)
        os.close(fd)


def _lock(path: Path, name: str = LOCK, busy: str = "output_dir {path} is in use by another run") -> tuple[int, bool]:
    """An fd holding the lock file ``name`` in ``path``, and whether the file was there before;
    ``busy`` says who holds it."""
    lock = path / name
    while True:
        try:
            fd, existed = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), False
        except FileExistsError:
            fd, existed = os.open(lock, os.O_RDWR), True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise PodsError(busy.format(path=path) + (f" (pid {pid})" if pid else "")) from None
        try:  # the holder may have removed the file before we locked it: lock the one now there
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd, existed
        os.close(fd)


def _start(path: Path, resume: bool, marked: bool, replay: bool = False) -> Path | None:
    """The checkpoint to resume from, or None to start at step 0 (clearing an unfinished run,
    unless ``replay`` keeps the steps it logged, to train them again)."""
    checkpoint = latest_checkpoint(path)
    if checkpoint is not None:
        if not resume:
            raise PodsError(f"output_dir {path} is not empty; pass resume=true to continue it")
        return checkpoint
    entries = [p for p in path.iterdir() if p.name != LOCK]
    foreign = [p.name for p in entries if not is_own(p.name)]
    if (path / "checkpoints").is_dir():  # what a killed checkpoint leaves: temporary folders only
        foreign += [f"checkpoints/{p.name}" for p in (path / "checkpoints").iterdir() if not p.name.startswith(".tmp-")]
    done = finished_steps(path) if entries else 0
    if foreign or (entries and not marked and not (replay and done)):  # the user's files, or a folder podsrl did not make
        if resume:
            raise PodsError(f"resume=true but {path} holds no checkpoint")
        example = sorted(foreign)[0] if foreign else sorted(p.name for p in entries)[0]
        raise PodsError(f"output_dir {path} is not empty (it holds {example}); choose another output_dir")
    if entries:
        what = "resume=true, but output_dir" if resume else "output_dir"
        if done and replay:
            log.info("output_dir %s holds a run that stopped after step %d without a checkpoint: replaying steps "
                     "1-%d against their records", path, done, done)
            return None
        if done:
            log.warning("%s %s holds an unfinished run that stopped after step %d without a checkpoint: training it "
                        "again from step 0 (its metrics replaced)", what, path, done)
        else:
            log.info("%s %s holds an unfinished run without a checkpoint: starting it afresh", what, path)
        _clear(path, keep_lock=True)
    elif resume:
        log.info("resume=true but %s holds no checkpoint: starting at step 0", path)
    return None


def finished_steps(path: Path) -> int:
    """The last step whose metrics a run folder holds (0: none, or no readable metrics)."""
    try:
        return max((r["step"] for r in read_metrics(path / "metrics.jsonl")), default=0)
    except PodsError:
        return 0


def recorded_config(path: Path) -> dict | None:
    """The ``config.yaml`` a run folder records, as a dict; None where there is none."""
    from omegaconf import OmegaConf

    file = path / "config.yaml"
    if not file.is_file():
        return None
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(file))
    except Exception as e:  # noqa: BLE001 (a torn or foreign file: say which)
        raise PodsError(f"cannot read {file}: {first_line(e)}") from None
    if not isinstance(loaded, dict):
        raise PodsError(f"{file} is not a podsrl config")
    return loaded


def run_of_model(model: str) -> Path | None:
    """The run folder a model folder was saved from, where it lies in one with a ``config.yaml``:
    a checkpoint's ``<run>/checkpoints/step-N/model``, or a compare run's ``<run>/final_model``."""
    path = Path(model).expanduser()
    if path.name == "model" and path.parent.name.startswith("step-") and path.parent.parent.name == "checkpoints":
        run = path.parent.parent.parent
    elif path.name == "final_model":
        run = path.parent
    else:
        return None
    return run if (run / "config.yaml").is_file() else None


def check_same_config(path: Path, c, what: str, shorter: bool = True) -> None:
    """Refuse to continue the run in ``path`` under a config whose result-changing settings
    differ from its recorded one, unless ``c.allow_config_change``; ``what`` names the action,
    ``shorter`` whether the run may end sooner than recorded (:func:`podsrl.config.config_changes`)."""
    from podsrl.config import config_changes

    recorded = recorded_config(path)
    if recorded is None or c.allow_config_change:
        return
    changes = config_changes(recorded, c, shorter)
    if changes:
        shown = "; ".join(changes[:4]) + (f"; and {len(changes) - 4} more" if len(changes) > 4 else "")
        raise PodsError(f"{what} {path} with settings that differ from its config.yaml ({shown}); use another "
                        "output folder, or pass allow_config_change=true to continue it under the new settings")


def keep_earlier_config(path: Path, c, step: int) -> None:
    """Before a resumed run records its config: keep the previous one if it differed."""
    from podsrl.config import config_changes

    recorded = recorded_config(path) if step > 0 else None
    if recorded is not None and config_changes(recorded, c):
        log.warning("resuming %s at step %d under changed settings; the earlier config is kept as %s", path, step,
                    EARLIER_CONFIG.format(step=step))
        os.replace(path / "config.yaml", path / EARLIER_CONFIG.format(step=step))



def _clear(path: Path, keep_lock: bool) -> None:
    """Remove podsrl's own files from ``path``."""
    for p in [p for p in path.iterdir() if is_own(p.name) and not (keep_lock and p.name == LOCK)]:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _remove_made_folders(path: Path, outermost: Path | None) -> None:
    """Remove ``path`` and its parents up to ``outermost``, as long as they are empty."""
    if outermost is None:
        return
    for folder in [path, *path.parents]:
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == outermost:
            return
