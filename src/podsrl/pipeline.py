"""Generation and update at once: a generation worker that runs a fixed number of steps ahead.

With ``async_lag: k`` (k >= 1) the trainer asks :class:`AsyncSampler` for a step's groups where it
would ask :class:`podsrl.sampling.Sampler`, and the loop reads the same. Behind that call a worker
process of its own, with its own copy of the weights and its own CPU threads (or the same GPU),
runs the synchronous sampler: prompts, ``n`` rollouts each (the HF engine, or vLLM), scored. The rollouts of step t are
sampled from the policy as it was after update ``max(0, t - 1 - k)``: k updates before the one
that trains on them (the synchronous trainer samples step t after update t - 1). So while the
trainer updates on step t, the worker generates step t + k, whose weights (after update t - 1)
already exist. The lag is fixed, not best effort: a run is the same whatever the two processes'
speeds, every compared method has the same staleness, and a run resumes exactly.

* **Weights.** After each update the trainer copies the trained parameters (with LoRA, the
  adapter's alone) into buffers the worker shares (torch.multiprocessing: shared memory on the
  CPU, CUDA IPC on a GPU) and publishes their version; the worker copies them into its model
  before it samples from that version. The trainer writes a version only after the worker has
  read the one before, so a buffer is never read while written.
* **Correction.** The worker's engine returns the log-probability each token had at the sampling
  temperature (``Rollouts.sampler_logp``); the update weights each token by the ratio of the
  trained policy to the sampler, formed, capped and masked as ``vllm_importance_sampling_mode``
  and ``vllm_importance_sampling_cap`` say (TRL's correction of a sampler that is not the trained
  policy), unless ``vllm_importance_sampling_correction`` is off.
* **Checkpoints.** At a checkpoint after update t the steps t + 1 .. t + k are already generated
  (from versions before t): their groups, the versions they came from, and the sampler's state
  after them are saved with the checkpoint (``pending_rollouts.pt``). A resumed run loads them
  and starts the worker at step t + k + 1 from the checkpoint's weights: it continues as the
  uninterrupted run would have.
* **Faults.** A worker that raises sends its error's first line and ends; one that dies (killed,
  out of memory) is noticed within a second: either way the run ends with one line naming it
  (the last checkpoint stays as it was). The worker ignores Ctrl-C, which the trainer handles, and
  ends when the trainer closes it or disappears.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import torch

from podsrl.errors import PodsError, first_line, interrupts_deferred

POLL_S = 0.5
STOP_S = 5.0
"""How long a worker told to stop may take to end before it is terminated."""
PENDING = "pending_rollouts.pt"


def version_for(step: int, lag: int) -> int:
    """The policy version (updates done) that samples ``step``'s rollouts under a fixed ``lag``."""
    return max(0, step - 1 - lag)


def trained_parameters(model) -> dict[str, torch.Tensor]:
    """The parameters the update changes, by name: all of them, or with LoRA the adapter's."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def worker_threads(c) -> int:
    """The worker's CPU threads: ``async_worker_threads``, else half the cores (at least one)."""
    return c.async_worker_threads or max(1, (os.cpu_count() or 2) // 2)


def trainer_threads(c) -> int:
    """The trainer's CPU threads under ``async_lag``: ``threads``, else the cores the worker leaves."""
    return c.threads or max(1, (os.cpu_count() or 2) - worker_threads(c))


class _Solo:
    """The sampler's view of the processes: the worker is one process."""

    process_index, num_processes, is_main_process = 0, 1, True
    device = torch.device("cpu")


class AsyncSampler:
    """:class:`podsrl.sampling.Sampler`'s ``step_groups`` with generation ``c.async_lag`` steps
    ahead in a worker process (see the module docstring)."""

    def __init__(self, c, model, state: dict | None, start_step: int, resume_from=None):
        self.c, self.lag = c, c.async_lag
        ctx = torch.multiprocessing.get_context("spawn")
        self.buffers = {name: p.detach().clone() for name, p in trained_parameters(model).items()}
        for b in self.buffers.values():
            b.share_memory_()
        self.published = ctx.Value("q", start_step, lock=False)  # the version in the buffers
        self.loaded = ctx.Value("q", -1, lock=False)  # the last version the worker copied out of them
        self.stop = ctx.Value("b", 0, lock=False)  # set: the worker ends at its next wait
        self.out, writer = ctx.Pipe(duplex=False)  # a pipe, not a queue: no semaphores to leak on a kill
        self.pending: dict[int, dict] = {}  # step -> its groups, version and the sampler's state after it
        state, first = state or {}, start_step + 1
        if "async_worker" in state:  # a checkpoint of this pipeline: the steps generated ahead of it
            with open(resume_from / PENDING, "rb") as f:
                saved = torch.load(f, weights_only=False)
            self.pending = {item["step"]: item for item in saved}
            first, state = max(self.pending, default=start_step) + 1, state["async_worker"]
        self.wait_s, self.lag_used = 0.0, None
        # not a daemon: the worker's reward pool has processes of its own
        self.process = ctx.Process(target=_worker, args=(c, self.buffers, self.published, self.loaded, self.stop, writer,
                                                         state, first, os.getpid()), name="podsrl-generation", daemon=False)
        self.process.start()
        writer.close()  # the worker's end: the pipe reports EOF once the worker is gone
        # the pipe drained as items come, so that the worker never waits on a full pipe to run ahead
        self.received: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._drain, name="podsrl-generation-reader", daemon=True)
        self.reader.start()
        self.closed = False

    # ------------------------------------------------------------------ the trainer's calls

    def step_groups(self, step: int):
        """``step``'s groups, generated by the worker (waiting for them if they are not ready)."""
        start = time.perf_counter()
        item = self._wait_for(step)
        self.wait_s = time.perf_counter() - start
        del self.pending[step]
        self.lag_used = step - 1 - item["version"]
        return item["groups"]

    def step_metrics(self) -> dict:
        """The last step's lag (updates between the sampler's weights and the ones trained) and
        the seconds the trainer waited for its rollouts."""
        return {"async/lag": self.lag_used, "async/wait_s": self.wait_s}

    def policy_updated(self, model, version: int) -> None:
        """Publish the weights after update ``version`` once the worker has read the previous ones."""
        self._until(lambda: self.loaded.value >= self.published.value)
        with torch.no_grad():
            for name, p in trained_parameters(model).items():
                self.buffers[name].copy_(p.detach())
        self.published.value = version

    def state_dict(self) -> dict:
        """What a checkpoint after the last update holds: the worker's sampler state after the
        steps generated for the coming updates (waits until they all are)."""
        done = self.published.value
        for s in range(done + 1, done + self.lag + 1):
            self._wait_for(s)
        coming = [self.pending[s] for s in range(done + 1, done + self.lag + 1)]
        return {"async_pending": [i["step"] for i in coming], "async_worker": coming[-1]["sampler_state"]}

    def save_pending(self, path) -> None:
        """The groups generated for the coming updates, with their versions (after state_dict)."""
        done = self.published.value
        with open(path, "wb") as f:
            torch.save([self.pending[s] for s in range(done + 1, done + self.lag + 1)], f)

    def close(self) -> None:
        """Stop the worker (at the end of a run, on an error, on Ctrl-C). A second Ctrl-C or
        SIGTERM waits until it has ended, as the reward pool's close does."""
        if self.closed:
            return
        with interrupts_deferred():
            self.closed = True
            self.stop.value = 1  # a worker waiting for weights ends at once; one generating, after its step
            self.process.join(STOP_S)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(10)
                if self.process.is_alive():
                    self.process.kill()
                    self.process.join()
            self.out.close()

    # ------------------------------------------------------------------ waiting on the worker

    def _wait_for(self, step: int) -> dict:
        while step not in self.pending:
            item = self._receive()
            self.pending[item["step"]] = item
        return self.pending[step]

    def _drain(self) -> None:
        """The reader thread: every item the worker sends, in order, until the pipe closes."""
        try:
            while True:
                self.received.put(self.out.recv())
        except (EOFError, OSError):  # the worker ended, or close() closed the pipe
            pass

    def _receive(self) -> dict:
        while True:
            try:
                item = self.received.get(timeout=POLL_S)
            except queue.Empty:
                if not self.process.is_alive():
                    self.reader.join(POLL_S)  # what the worker sent before it ended (its error) comes first
                    if not self.received.empty():
                        continue
                self._check_alive()
                continue
            if "error" in item:
                raise PodsError(f"the generation worker failed: {item['error']}")
            return item

    def _until(self, done) -> None:
        while not done():
            self._check_alive()
            time.sleep(0.005)

    def _check_alive(self) -> None:
        if not self.process.is_alive():
            code = self.process.exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            raise PodsError(f"the generation worker died ({how}{', out of memory?' if code == -signal.SIGKILL else ''})")


# ---------------------------------------------------------------------- the worker process


def _worker(c, buffers, published, loaded, stop, out, sampler_state, first: int, parent: int) -> None:
    """Generate steps ``first``, ``first + 1``, ... each from its version's weights, forever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer handles Ctrl-C and closes this process
    try:
        _generate_ahead(c, buffers, published, loaded, stop, out, sampler_state, first, parent)
    except BaseException as e:  # noqa: BLE001 (anything: the trainer is told in one line)
        if os.getppid() == parent:
            out.send({"error": f"{type(e).__name__}: {first_line(e)}" if not isinstance(e, PodsError) else first_line(e)})
            out.close()
        os._exit(1)


def _generate_ahead(c, buffers, published, loaded, stop, out, sampler_state, first: int, parent: int) -> None:
    from podsrl import models
    from podsrl.rollout import make_engine
    from podsrl.sampling import Sampler
    from podsrl.tasks import task_from_config
    from podsrl.rewards.scorer import Scorer

    torch.set_num_threads(worker_threads(c))
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())  # not tqdm's default, a semaphore that a killed worker would leave behind
    device = buffers[next(iter(buffers))].device
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    task = task_from_config(c.task, c.seed)  # a task's verifiers built here, inherited by the reward workers
    scorer = Scorer.from_config(c)
    scorer.start_workers()  # forked before the model loads, they hold no copy of it
    try:  # the workers end with this process's work, however it ends
        model = models.load_model(c.model.name_or_path, c.model.dtype, c.model.trust_remote_code, c.model.load_in_4bit)
        if c.model.lora_r > 0:
            model = models.add_lora(model, c.model.lora_r, c.model.lora_alpha, c.model.lora_dropout,
                                    c.model.lora_target_modules)
        model = model.to(device).eval()
        params = trained_parameters(model)
        missing = set(buffers) - set(params)
        if missing:
            raise PodsError(f"the worker's model has no parameter {sorted(missing)[0]!r}")
        engine = make_engine(c.rollout.engine, model, tokenizer, c.rollout, c.model.trust_remote_code)
        if c.rollout.engine == "hf":
            engine.record_logp = True  # the log-probs the update's correction divides by (vLLM returns its own)
        system_prompt = task.system_prompt if c.task.system_prompt is None else c.task.system_prompt
        sampler = Sampler(c, task, engine, scorer, tokenizer, system_prompt, _Solo(), sampler_state, first - 1)
        have = -1
        step = first
        while True:
            need = version_for(step, c.async_lag)
            while published.value < need or stop.value:  # the trainer has not finished that update yet
                if stop.value or os.getppid() != parent:
                    return
                time.sleep(0.005)
            if have != need:
                with torch.no_grad():
                    for name, b in buffers.items():
                        params[name].copy_(b)
                engine.sync_weights()  # vLLM: pushed into the engine when the phase starts
                have = need
                loaded.value = need
            with engine.phase():
                groups = sampler.step_groups(step)
            out.send({"step": step, "version": need, "groups": groups, "sampler_state": sampler.state_dict()})
            step += 1
    finally:
        scorer.close()
