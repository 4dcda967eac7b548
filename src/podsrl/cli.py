"""``podsrl train | eval`` (and ``compare``, ``plot``, ``plan``, ``tasks``): YAML config plus ``key=value`` overrides.

Bad input (an unknown key, m > n, a missing file, a model that cannot load, NaN rewards, an
output_dir in use by another run) ends with one line on stderr and exit code 2; Ctrl-C with one
line and exit code 130, SIGTERM likewise with 143. Under a launcher (``accelerate launch``) the
main process says it; the others stay silent unless they alone met the bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time

from podsrl.errors import EXIT_INTERRUPTED, ArgumentParser, PodsError, Terminated, one_line_errors, raise_terminated
from podsrl.quiet import quiet_logging

EXIT_TERMINATED = 143  # 128 + SIGTERM
OTHER_PROCESS_WAIT_S = 5.0
"""Under a launcher, how long a process other than the main one waits before it prints its error:
every process meets the same bad input, the main process says it, and the launcher ends the
others once it has exited; a process that alone met it still says it."""


CONFIG_HELP = ("every key with its default: podsrl config (with a file and overrides: the merged result); "
               "each key explained: docs/configuration.md")


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML config file (default: the embedded CPU run)")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. n=32 model.lora_r=16")
    parser.epilog = CONFIG_HELP


def _split(args) -> tuple[str | None, list[str]]:
    """``podsrl train n=8`` has no config file: a first positional with '=' is an override. A key
    given twice is refused."""
    from podsrl.config import check_given_once

    config, overrides = args.config, list(args.overrides)
    if config and "=" in config and not os.path.exists(config):
        config, overrides = None, [config, *overrides]
    check_given_once(overrides)
    return config, overrides


def cmd_train(args) -> int:
    from podsrl.config import load_config

    config = load_config(*_split(args))
    from podsrl.trainer import train

    out = train(config)
    if os.environ.get("RANK", "0") == "0":
        print(f"run written to {out}")
    return 0


def cmd_eval(args) -> int:
    from podsrl import models
    from podsrl.evaluate import evaluate
    from podsrl.rollout import make_engine
    from podsrl.tasks import task_from_config

    c = _eval_config(*_split(args))
    if c.threads:
        import torch

        torch.set_num_threads(c.threads)
    task = task_from_config(c.task, c.seed)
    tokenizer = models.load_tokenizer(c.model.name_or_path)
    model = models.load_model(c.model.name_or_path, c.model.dtype, c.model.trust_remote_code, c.model.load_in_4bit)
    engine = make_engine(c.rollout.engine, model, tokenizer, c.rollout, c.model.trust_remote_code)
    result = evaluate(engine, tokenizer, task.test, task.system_prompt if c.task.system_prompt is None else c.task.system_prompt,
                      c.rollout.max_new_tokens, c.eval_temperature, keep=c.log_completions,
                      progress=c.progress)
    report = {"model": c.model.name_or_path, "task": c.task.name, "problems": len(task.test), "accuracy": result.accuracy}
    print(json.dumps(report | ({"completions": result.samples} if c.log_completions else {})))
    return 0


def cmd_plan(args) -> int:
    from pathlib import Path

    from podsrl.config import load_config
    from podsrl.plan import Sizes, default_sizes, plan, render, write_json

    c = load_config(*_split(args))
    json_path = Path(args.json) if args.json else None
    if json_path is not None and not json_path.parent.is_dir():
        raise PodsError(f"--json {args.json}: the folder {json_path.parent} does not exist")
    if json_path is not None and json_path.is_dir():
        raise PodsError(f"--json {args.json} is a folder; give the file to write")
    given = default_sizes(c)
    sizes = Sizes(generate=args.generate or given.generate, calls=given.calls if args.calls is None else args.calls,
                  update=args.update or given.update, candidates=args.candidates or given.candidates)
    report = plan(c, sizes, signal=args.signal, signal_from=[Path(f) for f in args.signal_from or []] or None)
    print(render(report), end="")
    if json_path is not None:
        write_json(report, json_path)
    return 0


def _sizes(text: str) -> list[int]:
    """A comma-separated list of whole numbers, for argparse."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}")
    return sorted(set(values))


def _eval_config(path: str | None, overrides: list[str]):
    """``podsrl eval``'s config. A model saved in a run folder (a checkpoint's ``model/``, a
    compare run's ``final_model/``) is evaluated on that run's held-out set and at its length:
    the run's ``seed``, its ``task.*`` settings and its ``rollout.max_new_tokens``, from its
    config.yaml, each unless the config file or the overrides give it (``task.name`` of another
    task, or ``task`` whole: none of the run's task); one line on stderr says so."""
    from dataclasses import fields

    from omegaconf import OmegaConf

    from podsrl.config import TaskConfig, check_eval_overrides, flat_keys, load_config
    from podsrl.rundir import recorded_config, run_of_model

    c = load_config(path, overrides, evaluating=True)
    check_eval_overrides(overrides)
    run = run_of_model(c.model.name_or_path)
    if run is None:
        return c
    recorded = recorded_config(run)
    given = {o.partition("=")[0].strip() for o in overrides}
    given |= set(flat_keys(OmegaConf.to_container(OmegaConf.load(path)))) if path else set()
    mapping = lambda key: recorded.get(key) if isinstance(recorded.get(key), dict) else {}
    task, rollout = mapping("task"), mapping("rollout")
    other_task = "task" in given or ("task.name" in given and c.task.name != task.get("name"))
    taken = {"seed": recorded.get("seed"),
             "task": {} if other_task else {f.name: task[f.name] for f in fields(TaskConfig)
                                            if f.name in task and f"task.{f.name}" not in given},
             "rollout": {k: rollout[k] for k in ("max_new_tokens",) if k in rollout and f"rollout.{k}" not in given}}
    taken = {k: v for k, v in taken.items() if k not in given and v not in (None, {})}
    if not taken:
        return c
    c = load_config(path, overrides, defaults=taken, evaluating=True)
    what = [f"seed {c.seed}"] if "seed" in taken else []
    what += [f"task {c.task.name}" + (f" {c.task.dataset}" if c.task.dataset else "")] if "task" in taken else []
    what += [f"max_new_tokens {c.rollout.max_new_tokens}"] if "rollout" in taken else []
    what = " and ".join([", ".join(what[:-1]), what[-1]] if len(what) > 2 else what)
    print(f"podsrl: note: evaluating on the held-out set of the run in {run}: its {what}, from its config.yaml "
          "(seed=, task.* or rollout.max_new_tokens= overrides choose others)", file=sys.stderr)
    return c


def cmd_tasks(args) -> int:
    """The built-in tasks, and reasoning-gym's data sets by category where it is installed."""
    import textwrap

    from podsrl.tasks import SUMMARIES
    from podsrl.tasks.gym import INSTALL, dataset_names

    for name, summary in SUMMARIES.items():
        print(f"{name:11s} {summary}")
    try:
        names = dataset_names()
    except PodsError:
        print(f"\nreasoning-gym is not installed; {INSTALL} adds its 100+ data sets (task.name=gym)")
        return 0
    print(f"\ntask.name=gym task.dataset=NAME, {len(names)} data sets:")
    for category in sorted(set(names.values())):
        members = ", ".join(n for n, c in names.items() if c == category)
        print(textwrap.fill(members, 100, initial_indent=f"  {category}: ", subsequent_indent="    "))
    return 0


def cmd_show_config(args) -> int:
    from podsrl.config import load_config, to_yaml

    print(to_yaml(load_config(*_split(args))), end="")
    return 0


def cmd_compare(args) -> int:
    from pathlib import Path

    from podsrl.compare import run_all

    if args.seeds < 1:
        raise PodsError(f"--seeds must be >= 1, got {args.seeds}")
    if args.first_seed < 0:
        raise PodsError(f"--first-seed must be >= 0, got {args.first_seed}")
    if args.save_every < 0:
        raise PodsError(f"--save-every must be >= 0, got {args.save_every}")
    if args.steps is not None:  # a step budget: no clock options
        if args.budget_minutes is not None or args.eval_every_s is not None:
            raise PodsError("--steps budgets optimizer steps; leave out --budget-minutes and --eval-every-s")
        args.eval_every = 5 if args.eval_every is None else args.eval_every
        if args.steps < 1 or args.eval_every < 1:
            raise PodsError(f"--steps and --eval-every must be >= 1, got {args.steps} and {args.eval_every}")
    else:
        if args.eval_every is not None:
            raise PodsError("--eval-every counts optimizer steps and goes with --steps; with a time budget use --eval-every-s")
        args.budget_minutes = 5.0 if args.budget_minutes is None else args.budget_minutes
        args.eval_every_s = 30.0 if args.eval_every_s is None else args.eval_every_s
        if not (math.isfinite(args.budget_minutes) and args.budget_minutes > 0):
            raise PodsError(f"--budget-minutes must be a number > 0, got {args.budget_minutes}")
        if not (math.isfinite(args.eval_every_s) and args.eval_every_s > 0):
            raise PodsError(f"--eval-every-s must be a number > 0, got {args.eval_every_s}")
    summary = run_all(*_split(args), args.methods, args.seeds, args.budget_minutes, Path(args.out), args.eval_every_s,
                      keep=args.keep, allow_config_change=args.allow_config_change, steps=args.steps,
                      eval_every=args.eval_every, reference=args.reference, clock=args.clock, save_every=args.save_every,
                      jobs=args.jobs, first_seed=args.first_seed)
    _warn_missing(summary)
    print((Path(args.out) / "summary.md").read_text(), end="")
    return 0 if summary["methods"] else 1


def cmd_plot(args) -> int:
    from pathlib import Path

    from podsrl.compare import compared_methods, recorded_clock, recorded_reference, summarise, write_reports

    out = Path(args.out)
    methods, seeds = compared_methods(out)
    recorded = recorded_reference(out)
    reference = args.reference or recorded
    if args.reference and methods and args.reference not in methods:
        raise PodsError(f"--reference {args.reference}: {out} compares {', '.join(methods)}")
    summary = summarise(out, methods, seeds, reference, recorded_clock(out)) if reference in methods else None
    if not summary or not summary["methods"][reference]["per_seed"]:
        raise PodsError(f"{out} holds no evaluated compare run of {reference} ({reference}/seed-N/metrics.jsonl)")
    # another reference than the recorded one: its own summary and table beside it, the plots unchanged
    other = reference != recorded
    table = write_reports(out, summary, f"summary_vs_{reference}" if other else "summary", plots=not other)
    _warn_missing(summary)
    print(table.read_text(), end="")
    return 0


def _warn_missing(summary: dict) -> None:
    if summary.get("missing_runs"):
        print(f"podsrl: note: not in the table (no run, or no evaluation yet): {', '.join(summary['missing_runs'])}",
              file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from podsrl import __version__

    parser = ArgumentParser(prog="podsrl", description="RL with verifiable rewards and PODS down-sampling")
    parser.add_argument("--version", action="version", version=f"podsrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, text in [
        ("train", cmd_train, "train a policy (no arguments: the embedded CPU default)"),
        ("eval", cmd_eval, "pass@1 of a model on a task's held-out set"),
        ("config", cmd_show_config, "print the merged configuration"),
    ]:
        p = sub.add_parser(name, help=text, description=text)
        _config_args(p)
        p.set_defaults(fn=fn)
    p = sub.add_parser("tasks", help="list the tasks, and reasoning-gym's data sets where installed")
    p.set_defaults(fn=cmd_tasks)
    p = sub.add_parser("compare", help="time to accuracy of several methods under one budget",
                       description="Train each method for each seed under the same budget (training time, or "
                       "optimizer steps with --steps), then "
                       "write summary.json, summary.md and accuracy plots to --out.")
    _config_args(p)
    p.add_argument("--methods", nargs="+", default=["grpo,pods,grpo-ga"],
                   help="method names (grpo, pods, grpo-ga) or name:key=value,... (default: grpo,pods,grpo-ga)")
    p.add_argument("--seeds", type=int, default=3, help="how many seeds each method runs (default 3)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="the first of them (default 0): --seeds 8 --first-seed 8 runs seeds 8-15")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="training clock per run (evaluation excluded; default 5)")
    p.add_argument("--eval-every-s", type=float, default=None,
                   help="evaluate each time the training clock passes this (default 30)")
    p.add_argument("--steps", type=int, default=None,
                   help="instead of a clock: optimizer steps per run, every method evaluated at the same steps")
    p.add_argument("--eval-every", type=int, default=None, help="with --steps: evaluate every this many steps (default 5)")
    p.add_argument("--reference", default="grpo",
                   help="the method whose seed-mean peak the others are timed to (default grpo; e.g. grpo-ga)")
    p.add_argument("--save-every", type=int, default=0,
                   help="each run also saves a checkpoint every this many steps, from which a rerun resumes an "
                   "interrupted run (default 0: at its end only); --keep says what a finished run keeps")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="the clock of the budget and the times: wall seconds (default), or the training process's "
                   "CPU seconds, which other jobs on a shared CPU machine bend far less (with threads=1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="train this many runs at a time, each in its own process (default 1); give each threads=K "
                   "so that jobs x K fits the cores")
    p.add_argument("--out", default="compare", help="output folder (runs, summary, plots); rerun to resume or extend")
    p.add_argument("--keep", choices=["metrics", "model", "checkpoint"], default="metrics",
                   help="what a finished run keeps besides its config and logs: nothing more (default), its final model "
                   "(final_model/), or its last checkpoint, from which a larger --budget-minutes resumes it")
    p.add_argument("--allow-config-change", action="store_true",
                   help="reuse or resume runs whose result-changing settings differ from their config.yaml")
    p.set_defaults(fn=cmd_compare)
    p = sub.add_parser("plan", help="measure each method's step cost here and say where PODS can pay",
                       description="Measure generation, scoring and the update on this model and machine (the "
                       "config's model, device, precision, engine, task and lengths), then predict the step time, "
                       "its split and the update's peak memory of GRPO (n = m), PODS (n, m) and GRPO-GA (n), and "
                       "PODS's break-even: the fraction of the baseline's optimizer steps it must need to win on time.")
    _config_args(p)
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("--generate", type=_sizes, help="n of the measured generate calls, e.g. 4,8,16 (default m,2m,4m)")
    p.add_argument("--calls", type=int, help="measured calls at each n (default 2)")
    p.add_argument("--update", type=_sizes, help="rollouts per prompt of the measured updates (default 2,m,2m)")
    p.add_argument("--candidates", type=_sizes, help="n of the table's PODS and GRPO-GA rows (default 2m,4m,8m and n)")
    p.add_argument("--signal", choices=["measured", "all"], default="measured",
                   help="rollouts the update trains: those with a non-zero advantage in the measured groups "
                   "(default), or every selected one")
    p.add_argument("--signal-from", nargs="+", metavar="RUN",
                   help="finished runs on the task (0/1 rewards) whose reward signal, step by step, sets the rollouts "
                   "each update trains over a run, in place of the start of training's")
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("plot", help="rebuild a compare folder's summary, table and plots")
    p.add_argument("out")
    p.add_argument("--reference", metavar="METHOD",
                   help="measure every method against this one instead of the folder's recorded reference: writes "
                   "summary_vs_METHOD.json and .md beside the recorded summary, which stays as it is")
    p.set_defaults(fn=cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _working_folder_importable()
    if not argv:  # `podsrl` alone: what it can do
        build_parser().print_help()
        return 0
    return _run(argv)


def _working_folder_importable() -> None:
    """A module beside the user (a reward given as ``module:function``) imports as it does under
    ``python -m podsrl``: the ``podsrl`` script puts its own folder on ``sys.path``, not the working
    folder. Appended, so that it shadows no installed module."""
    try:
        cwd = os.getcwd()
    except OSError:  # the working folder was removed: nothing beside the user to import
        return
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _say(line: str, code: int) -> int:
    return _last_line(line, code)


@one_line_errors("podsrl", say=_say)
def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_terminated) if main_thread else None
    try:
        quiet_logging()
        return args.fn(args)
    except KeyboardInterrupt as e:  # the trainer has already left its folder as a rerun expects it
        terminated = isinstance(e, Terminated)
        code = EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        if not _main_process():  # a launcher ending the others, or Ctrl-C, which the main process reports
            return code
        print("; ".join(filter(None, ["podsrl: terminated" if terminated else "podsrl: interrupted", str(e)])),
              file=sys.stderr)
        return code
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _main_process() -> bool:
    """Whether this is the main process of a launch (or no launcher started it)."""
    return os.environ.get("RANK", "0") == "0"


def _last_line(line: str, code: int) -> int:
    """Print ``line`` on stderr and return ``code``; in a process other than the launch's main
    one, only if the launcher has not ended it within :data:`OTHER_PROCESS_WAIT_S`."""
    if not _main_process():
        try:
            time.sleep(OTHER_PROCESS_WAIT_S)
        except KeyboardInterrupt:  # the launcher ended it: the main process has said it
            return code
    print(line, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
